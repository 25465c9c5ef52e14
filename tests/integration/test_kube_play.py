"""The rendered manifests as pods: `agentstream deploy render -f infra/deploy/values-podman.yaml` played
with `podman kube play` against the test's broker and database. Runs submitted from the host complete
through the pods — one of them over HTTP through the gateway's pod, with a token its CLI made — and
killing a planner pod and a tools pod mid-load loses no run and runs no tool twice. Skipped, saying why,
where podman cannot run the image (infra/container/build.sh builds it)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import uuid

import asyncpg
import httpx
import pytest

from agentstream.deploy.gateway import GATEWAY_REQUESTS_SERIES
from agentstream.deploy.podman import KubePlay, rendering
from agentstream.devstack.process import free_port
from agentstream.streams.client.agent_client import AgentClient
from agentstream.streams.kafka.topics import Topics
from tests.integration.podman import CONF, require_image
from tests.integration.processes import wait_for_members

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
TASK = '[[tool:calculator {"expression": "6 * 7"}]] [[tool:calculator {"expression": "1 + 1"}]] [[answer:done]]'


async def _submit_steadily(client: AgentClient, count: int, every_s: float, run_ids: list[str]) -> None:
    for _ in range(count):
        run_ids.append(await client.submit(TASK, tools=["calculator"], prefetch=False, deadline=300))
        await asyncio.sleep(every_s)


async def _make_token(deployment: KubePlay, pod: str) -> str:
    """A token from the CLI in the gateway's pod (``kubectl exec`` there), for the tenant ``default``: the
    gateway's own cell, the rendering's topic prefix."""
    made = await asyncio.to_thread(deployment.exec, pod, "token", "create", "--tenant", "default",
                                   "--role", "submitter", "--name", "kube-play", "--json")
    assert made.returncode == 0, made.stdout + made.stderr
    token: str = json.loads(made.stdout.strip().splitlines()[-1])["token"]
    return token


async def _through_the_gateway(url: str, token: str) -> None:
    """A run submitted with ``POST /v1/runs``, followed over SSE to its outcome, then read with ``GET``."""
    auth = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        for _ in range(600):  # its readiness probe's check: PostgreSQL answers
            with contextlib.suppress(httpx.TransportError):
                if (await http.get("/readyz")).status_code == 200:
                    break
            await asyncio.sleep(0.1)
        else:
            pytest.fail(f"the gateway's pod never answered {url}/readyz with 200")
        submitted = await http.post("/v1/runs", headers=auth, json={
            "task": TASK, "tools": ["calculator"], "prefetch": False, "deadline": 300})
        assert submitted.status_code == 202, submitted.text
        run_id = submitted.json()["run_id"]
        events: list[tuple[str, dict]] = []
        async with http.stream("GET", f"/v1/runs/{run_id}/events", headers=auth, timeout=300) as stream:
            assert stream.status_code == 200
            event = ""
            async for line in stream.aiter_lines():
                if line.startswith("event:"):
                    event = line.partition(":")[2].strip()
                elif line.startswith("data:"):
                    events.append((event, json.loads(line.partition(":")[2])))
        assert events and events[-1][0] == "outcome" and events[-1][1]["status"] == "completed", events[-3:]
        assert [d["tool"] for e, d in events if e == "step" and d.get("kind") == "tool"] == ["calculator"] * 2
        run = (await http.get(f"/v1/runs/{run_id}", headers=auth)).json()
        assert (run["status"], run["answer"]) == ("completed", "done"), run
        metrics = (await http.get("/metrics")).text  # the series the HPA's request rate comes from
        assert any(line.startswith(GATEWAY_REQUESTS_SERIES) and float(line.split()[-1]) >= 3
                   for line in metrics.splitlines()), metrics


async def test_pods_run_tasks_and_a_killed_pod_loses_no_run(settings, tmp_path):
    image = require_image()
    name = f"ks{uuid.uuid4().hex[:6]}"
    port = free_port()
    deployment = KubePlay(rendering(settings, image, name, [f"services.gateway.port={port}"]), tmp_path, conf=CONF)
    pod_settings = dataclasses.replace(settings, topic_prefix=f"{name}.")
    try:
        migrated = deployment.job()  # the migration Job's container: topics and migrations, then exit 0
        assert migrated.returncode == 0, migrated.stdout + migrated.stderr
        deployment.play()
        pods = deployment.pods()
        assert len(pods) == 6, pods  # 2 planners, 2 tools, 1 inference, 1 gateway
        # (made while the workers join their groups)
        token = asyncio.create_task(_make_token(deployment, next(p for p in pods if p.startswith(f"{name}-gateway-"))))
        topics = Topics(prefix=f"{name}.", partitions=settings.partitions)
        for service, members in (("planner", 2), ("tools", 2), ("inference", 1)):
            await wait_for_members(settings.kafka_bootstrap, topics.group(service), members, timeout=240)
        async with AgentClient(pod_settings) as client:
            first = await client.submit(TASK, tools=["calculator"], prefetch=False, deadline=300)
            _, outcome = await asyncio.gather(_through_the_gateway(f"http://127.0.0.1:{port}", await token),
                                              client.wait(first, timeout=300))
            assert outcome.ok

            run_ids: list[str] = []
            load = asyncio.create_task(_submit_steadily(client, 30, 0.3, run_ids))
            await asyncio.sleep(3)
            for service in ("planner", "tools"):
                deployment.kill(next(p for p in pods if p.startswith(f"{name}-{service}-")))
            await load
            results = await asyncio.gather(*(client.wait(r, timeout=300) for r in run_ids))
        assert [r.run_id for r in results if not r.ok] == []
        assert len(deployment.pods()) == 4
        conn = await asyncpg.connect(settings.database_url)
        try:
            # (the calculator is idempotent: no tool_calls rows; each run's record has its two tool steps)
            calls = await conn.fetch("SELECT run_id, count(*) AS n FROM steps WHERE run_id = ANY($1) "
                                     "AND kind = 'tool' AND status = 'completed' GROUP BY run_id", run_ids)
        finally:
            await conn.close()
        assert {r["run_id"]: r["n"] for r in calls} == {r: 2 for r in run_ids}
    finally:
        deployment.down()
        await Topics(prefix=f"{name}.", partitions=settings.partitions).delete_all(settings.kafka_bootstrap, auth=settings.kafka_auth)
