"""The services as pods: image size, and the time from `podman kube play` to the first run completed.

On the stack `agentstream dev up` starts (started here if it is not running): the rendering of
``infra/deploy/values-podman.yaml`` (2 planners, 2 tools, 1 inference with the scripted model, a topic
prefix of its own) is played with podman, then one task (two calculator calls, then the answer) is
submitted from the host. Reported per round: the migration Job's run, `kube play` itself, and the time
from the start of `kube play` to the run's outcome (pods started, workers joined their groups, the run's
five steps). Then the pods are taken down. Needs the image (``bash infra/container/build.sh``).

    .venv/bin/python -m bench.perf.kube_play [--rounds 3] [--image localhost/agentstream:dev] [--json]

With --json the last line is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
import uuid
from dataclasses import replace
from pathlib import Path

from agentstream.deploy.podman import KubePlay, podman, rendering
from agentstream.devstack.stack import DevStack
from agentstream.streams.client.agent_client import AgentClient
from agentstream.streams.config.settings import Settings
from agentstream.streams.core.errors import TaskRejected
from agentstream.streams.kafka.topics import Topics

ROOT = Path(__file__).resolve().parents[2]
CONF = ROOT / "infra" / "container" / "containers.conf"
TASK = '[[tool:calculator {"expression": "6 * 7"}]] [[tool:calculator {"expression": "1 + 1"}]] [[answer:done]]'


async def one_round(settings: Settings, image: str) -> dict[str, float]:
    name = f"kb{uuid.uuid4().hex[:6]}"
    # The figures are the workers' (docs/benchmarks.md); the gateway's pod is tests/integration/test_kube_play.py's.
    objects = rendering(settings, image, name, ["services.gateway.enabled=false"])
    with tempfile.TemporaryDirectory() as workdir:
        deployment = KubePlay(objects, Path(workdir), conf=CONF)
        try:
            t0 = time.perf_counter()
            job = deployment.job()
            if job.returncode != 0:
                raise SystemExit(f"the migration job failed: {job.stderr[-500:]}")
            t1 = time.perf_counter()
            deployment.play()
            t2 = time.perf_counter()
            async with AgentClient(replace(settings, topic_prefix=f"{name}.")) as client:
                while True:  # refused until a tools pod has registered its tools: the pods are starting
                    try:
                        run_id = await client.submit(TASK, tools=["calculator"], prefetch=False, deadline=600)
                        break
                    except TaskRejected:
                        if time.perf_counter() - t2 > 600:
                            raise
                        await asyncio.sleep(0.1)
                result = await client.wait(run_id, timeout=600)
            t3 = time.perf_counter()
            if not result.ok:
                raise SystemExit(f"the run failed: {result}")
            return {"job_s": t1 - t0, "kube_play_s": t2 - t1, "play_to_first_run_s": t3 - t1}
        finally:
            deployment.down()
            await Topics(prefix=f"{name}.", partitions=settings.partitions).delete_all(settings.kafka_bootstrap, auth=settings.kafka_auth)


def image_size_mb(image: str) -> float:
    size = podman("image", "inspect", "--format", "{{.Size}}", image, conf=CONF).stdout.strip()
    return int(size) / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--image", default="localhost/agentstream:dev")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    DevStack().up()
    settings = Settings.load()
    rounds = [asyncio.run(one_round(settings, args.image)) for _ in range(args.rounds)]
    report: dict[str, object] = {"image": args.image, "image_size_mb": round(image_size_mb(args.image), 1),
                                 "rounds": rounds}
    for key in ("job_s", "kube_play_s", "play_to_first_run_s"):
        report[f"{key}_median"] = round(statistics.median(r[key] for r in rounds), 2)
    for r in rounds:
        print(f"job {r['job_s']:.1f} s · kube play {r['kube_play_s']:.1f} s · "
              f"kube play → first run completed {r['play_to_first_run_s']:.1f} s")
    print(f"image {args.image}: {report['image_size_mb']} MB; medians over {len(rounds)} rounds: job "
          f"{report['job_s_median']} s, kube play {report['kube_play_s_median']} s, kube play → first run "
          f"completed {report['play_to_first_run_s_median']} s")
    if args.json:
        print(json.dumps(report))


if __name__ == "__main__":
    main()
