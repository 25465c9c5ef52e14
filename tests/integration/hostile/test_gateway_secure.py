"""The HTTP gateway on the secure stack (docs/gateway.md, "Auth"; docs/security.md): `agentstream worker gateway`
as a process of its own, the Kafka principal `gateway` with its own database login, in front of tenants acme
and beta. Its tokens are made with `agentstream token create` as the schema's owner (the gateway's login
may read them, not make them). Over HTTP: acme's submitter completes a run and streams it to its outcome;
beta's tokens find neither the run nor its events nor its approval; a reader may not approve; acme's
approver does, and the decision is recorded as the token's, not the gateway's login. The gateway's
principal writes the topics a client writes, not the services' (a forged tool result)."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass

import asyncpg
import httpx
import pytest
import pytest_asyncio

from agentstream.devstack.process import free_port
from agentstream.ops.acls import tenant_prefix
from agentstream.streams.kafka.topics import Topics
from tests.integration.acl_probes import can_write, connection
from tests.integration.hostile.conftest import ACME, BETA, PARTITIONS
from tests.integration.processes import ROOT, start_worker, stop, worker_env
from tests.integration.test_gateway import sse

pytestmark = pytest.mark.asyncio(loop_scope="package")

#: The tokens the module makes: (tenant, role, name).
TOKENS = {"submitter": (ACME, "submitter", "acme-app"), "reader": (ACME, "reader", "acme-dash"),
          "approver": (ACME, "approver", "acme-desk"), "beta": (BETA, "submitter", "beta-app"),
          "beta-approver": (BETA, "approver", "beta-desk")}


@dataclass
class Door:
    url: str
    tokens: dict[str, str]

    def auth(self, who: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[who]}"}


async def _token(cells, tenant: str, role: str, name: str) -> str:
    """``agentstream token create`` as the CLI runs it: the schema's owner (the environment's DATABASE_URL)."""
    settings = cells.stack.settings(partitions=PARTITIONS)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "agentstream.cli", "token", "create", "--tenant", tenant, "--role", role, "--name", name,
        "--json", env=worker_env(settings, **cells.stack.env()), cwd=ROOT, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    out, errors = await proc.communicate()
    assert proc.returncode == 0, errors.decode()
    return str(json.loads(out)["token"])


@pytest_asyncio.fixture(scope="module", loop_scope="package")
async def door(cells, tmp_path_factory) -> AsyncIterator[Door]:
    stack = cells.stack
    port = free_port()
    log = tmp_path_factory.mktemp("gateway") / "gateway.log"
    cells.logs["gateway"] = log
    proc = start_worker(stack.settings(partitions=PARTITIONS), "gateway", log, "--port", str(port),
                        **stack.env("gateway"))
    try:
        made = await asyncio.gather(*(_token(cells, *spec) for spec in TOKENS.values()))
        url = f"http://127.0.0.1:{port}"
        async with httpx.AsyncClient(timeout=5) as client:
            for _ in range(300):
                assert proc.poll() is None, f"the gateway exited:\n{log.read_text(errors='replace')}"
                try:
                    if (await client.get(f"{url}/readyz")).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                await asyncio.sleep(0.05)
            else:
                raise AssertionError(f"the gateway was not ready:\n{log.read_text(errors='replace')}")
        yield Door(url, dict(zip(TOKENS, made, strict=True)))
    finally:
        stop(proc)


async def _submit(client: httpx.AsyncClient, door: Door, task: str, **fields: object) -> str:
    response = await client.post(f"{door.url}/v1/runs", json={"task": task, "prefetch": False, **fields},
                                 headers=door.auth("submitter"))
    assert response.status_code == 202, response.text
    return str(response.json()["run_id"])


async def test_a_tenants_run_over_http_is_its_own(cells, door: Door) -> None:
    async with httpx.AsyncClient(timeout=30) as client:
        run_id = await _submit(client, door, '[[tool:calculator {"expression": "6 * 7"}]] [[answer:forty-two]]',
                               tools=["calculator"])
        events: list[dict] = []
        async with client.stream("GET", f"{door.url}/v1/runs/{run_id}/events", headers=door.auth("reader")) as live:
            assert live.status_code == 200
            async for message in sse(live):
                events.append(message)
        assert events and events[-1]["event"] == "outcome", events
        outcome = json.loads(events[-1]["data"])
        assert (outcome["status"], outcome["answer"]) == ("completed", "forty-two")
        assert [json.loads(m["data"])["kind"] for m in events if m["event"] == "step"] == ["model", "tool", "model"]

        # Another tenant's tokens: no such run, no events, not in its lists.
        for path in (f"/v1/runs/{run_id}", f"/v1/runs/{run_id}/events"):
            other = await client.get(f"{door.url}{path}", headers=door.auth("beta"))
            assert other.status_code == 404, (path, other.text)
        listed = await client.get(f"{door.url}/v1/runs", headers=door.auth("beta"))
        assert listed.status_code == 200 and all(r["run_id"] != run_id for r in listed.json()["runs"])
        assert (await client.post(f"{door.url}/v1/runs/{run_id}/cancel", headers=door.auth("beta"))).status_code == 404
        mine = await client.get(f"{door.url}/v1/runs/{run_id}", headers=door.auth("reader"))
        assert mine.status_code == 200 and mine.json()["answer"] == "forty-two"
    async with connection(cells.stack.database_url) as conn:
        prefix = await conn.fetchval("SELECT state->>'topic_prefix' FROM runs WHERE run_id = $1", run_id)
    assert prefix == tenant_prefix(ACME)  # submitted into acme's cell


async def test_an_approval_over_http_is_recorded_as_the_tokens(cells, door: Door) -> None:
    async with httpx.AsyncClient(timeout=30) as client:
        run_id = await _submit(client, door, '[[tool:transfer {"amount": 9}]] [[answer:sent]]', tools=["transfer"])
        waiting: list[dict] = []
        for _ in range(300):
            listed = await client.get(f"{door.url}/v1/approvals", headers=door.auth("reader"))
            assert listed.status_code == 200, listed.text
            waiting = [a for a in listed.json()["approvals"] if a["run_id"] == run_id]
            if waiting:
                break
            await asyncio.sleep(0.05)
        assert waiting and waiting[0]["tool"] == "transfer", waiting
        step = waiting[0]["step_id"]
        beta_sees = await client.get(f"{door.url}/v1/approvals", headers=door.auth("beta-approver"))
        assert all(a["run_id"] != run_id for a in beta_sees.json()["approvals"])

        url = f"/v1/approvals/{run_id}/{step}/approve"
        assert (await client.post(f"{door.url}{url}", headers=door.auth("reader"))).status_code == 403
        assert (await client.post(f"{door.url}{url}", headers=door.auth("submitter"))).status_code == 403
        assert (await client.post(f"{door.url}{url}", headers=door.auth("beta-approver"))).status_code == 404
        async with connection(cells.stack.database_url) as conn:
            assert await conn.fetchval("SELECT count(*) FROM approval_decisions WHERE run_id = $1", run_id) == 0

        decided = await client.post(f"{door.url}{url}", json={"reason": "checked"}, headers=door.auth("approver"))
        assert decided.status_code == 200, decided.text
        body = decided.json()
        assert (body["approved"], body["recorded"], body["decided_by"]) == (True, True, "gateway:acme:acme-desk")
        for _ in range(300):
            view = (await client.get(f"{door.url}/v1/runs/{run_id}", headers=door.auth("reader"))).json()
            if view["status"] in ("completed", "failed"):
                break
            await asyncio.sleep(0.05)
        assert (view["status"], view["answer"]) == ("completed", "sent"), view
    assert await cells.effects(run_id) == ["transfer 9"]
    async with connection(cells.stack.database_url) as conn:
        recorded = await conn.fetchrow("SELECT approved, reason, decided_by FROM approval_decisions WHERE run_id = $1",
                                       run_id)
    assert dict(recorded) == {"approved": True, "reason": "checked", "decided_by": "gateway:acme:acme-desk"}


async def test_the_gateways_principal_and_login_may_do_a_clients_part_only(cells, door: Door) -> None:
    stack = cells.stack
    acme = Topics(tenant_prefix(ACME), partitions=PARTITIONS)
    # Kafka: it submits into a cell (tasks) but forges no step result or outcome.
    assert await can_write(stack, "gateway", cells.topics(BETA).tasks)
    assert not await can_write(stack, "gateway", acme.tool_results)
    assert not await can_write(stack, "gateway", acme.outcomes)
    # PostgreSQL: its login reads tokens but makes none, writes no run, and records no decision under
    # another name than its own.
    async with connection(stack.database_url_for("gateway")) as conn:
        assert await conn.fetchval("SELECT count(*) FROM gateway_tokens") >= len(TOKENS)
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await conn.execute("INSERT INTO gateway_tokens (token_id, secret_sha256, tenant, role) "
                               "VALUES ('000000000000', 'x', 'acme', 'submitter')")
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await conn.execute("UPDATE runs SET status = 'completed' WHERE run_id = 'nobody'")
        with pytest.raises(asyncpg.InvalidParameterValueError):  # a decider outside `gateway:` (migration 0021)
            await conn.fetchrow("SELECT * FROM agentstream_decide_as('r', 's', true, '', 'approver-acme')")
    async with connection(stack.database_url_for(f"approver-{ACME}")) as conn:  # nobody else names the decider
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await conn.fetchrow("SELECT * FROM agentstream_decide_as('r', 's', true, '', 'gateway:acme:x')")
