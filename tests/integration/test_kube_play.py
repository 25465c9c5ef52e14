"""The rendered manifests as pods: `agentstream deploy render -f infra/deploy/values-podman.yaml` played
with `podman kube play` against the test's broker and database. Runs submitted from the host complete
through the pods, and killing a planner pod and a tools pod mid-load loses no run and runs no tool
twice. Skipped, saying why, where podman cannot run the image (infra/container/build.sh builds it)."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid

import asyncpg
import pytest

from agentstream.deploy.podman import KubePlay, rendering
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


async def test_pods_run_tasks_and_a_killed_pod_loses_no_run(settings, tmp_path):
    image = require_image()
    name = f"ks{uuid.uuid4().hex[:6]}"
    deployment = KubePlay(rendering(settings, image, name), tmp_path, conf=CONF)
    pod_settings = dataclasses.replace(settings, topic_prefix=f"{name}.")
    try:
        migrated = deployment.job()  # the migration Job's container: topics and migrations, then exit 0
        assert migrated.returncode == 0, migrated.stdout + migrated.stderr
        deployment.play()
        pods = deployment.pods()
        assert len(pods) == 5, pods  # 2 planners, 2 tools, 1 inference
        topics = Topics(prefix=f"{name}.", partitions=settings.partitions)
        for service, members in (("planner", 2), ("tools", 2), ("inference", 1)):
            await wait_for_members(settings.kafka_bootstrap, topics.group(service), members, timeout=240)
        async with AgentClient(pod_settings) as client:
            first = await client.submit(TASK, tools=["calculator"], prefetch=False, deadline=300)
            assert (await client.wait(first, timeout=300)).ok

            run_ids: list[str] = []
            load = asyncio.create_task(_submit_steadily(client, 30, 0.3, run_ids))
            await asyncio.sleep(3)
            for service in ("planner", "tools"):
                deployment.kill(next(p for p in pods if p.startswith(f"{name}-{service}-")))
            await load
            results = await asyncio.gather(*(client.wait(r, timeout=300) for r in run_ids))
        assert [r.run_id for r in results if not r.ok] == []
        assert len(deployment.pods()) == 3
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
