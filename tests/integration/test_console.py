"""The web console in a real browser: Debian's chromium, headless, driven by Selenium through chromium-driver,
against a gateway served by uvicorn in this process on the real broker and database (the pipeline and the
gateway of tests/integration/test_gateway.py: scripted model, tokens in chunks).

From the page: enter a submitter's token, submit a task whose first step calls ``transfer`` (a tool that
waits for a person), watch the model's tokens arrive in the run's live view, change to an approver's token
(a submitter may not approve), approve the call from the approvals page, watch the answer stream in, see
it, its steps and its timeline, then save a screenshot and check it is a drawn page, not a blank one.
Last, with an operator's token, the dead letter of an undecodable task is listed, shown and re-driven.
Skipped, saying why, without chromium or chromedriver (``.ci/run`` installs both)."""

from __future__ import annotations

import asyncio
import shutil
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiokafka import AIOKafkaProducer
from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By

from agentstream.streams.kafka.topics import Topics
from tests.integration import test_gateway
from tests.integration.test_gateway import Door
from tests.integration.test_replay import _png_rgb

pytestmark = pytest.mark.asyncio(loop_scope="module")

door = test_gateway.door  # the same fixture: one pipeline and its gateway, for this module

ANSWER = ("Transferred 5 to the account, as approved by a person from the web console. " * 3).strip()
TASK = f'[[tool:transfer {{"amount": 5}}]] [[answer:{ANSWER}]]'


def _browser() -> tuple[str, str] | None:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    return (chromium, driver) if chromium and driver else None


def _until(what: str, check: Callable[[], Any], timeout: float = 15.0, every: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(every)


LIVE = """const steps = [...document.querySelectorAll('#run-steps > li')];
return {status: document.querySelector('#run-status').textContent, tokens: Number(document.querySelector('#run-steps').dataset.tokens || 0),
        texts: steps.map(li => li.querySelector('.tokens').textContent), kinds: steps.map(li => li.querySelector('.step-kind').textContent),
        answer: document.querySelector('#run-answer').textContent, approval: !document.querySelector('#run-approval').hidden,
        error: document.querySelector('#run-error').textContent}"""


async def _dead_letter(door: Door) -> int:
    """An undecodable record on the cell's tasks topic, which the planner dead-letters: the letter's offset,
    once ``GET /v1/dead-letters`` (an operator's) lists it."""
    settings = door.pipe.settings
    tasks = Topics.of(settings).tasks
    producer = AIOKafkaProducer(**settings.kafka_options())
    await producer.start()
    try:
        await producer.send_and_wait(tasks, b"not an event: the console's dead letter", key=b"console", partition=0)
    finally:
        await producer.stop()
    async with httpx.AsyncClient(timeout=30) as client:
        deadline = time.monotonic() + 15
        while True:
            response = await client.get(f"{door.url}/v1/dead-letters", params={"kind": "undecodable"},
                                        headers=door.auth("operator"))
            assert response.status_code == 200, response.text
            mine = [row["offset"] for row in response.json()["letters"]
                    if row["source_topic"] == tasks and row["redrive_of"] is None]
            if mine:
                return int(mine[-1])
            assert time.monotonic() < deadline, "the undecodable task was not dead-lettered"
            await asyncio.sleep(0.1)


def _drive(door: Door, browser: tuple[str, str], out: Path, letter: int | None = None) -> dict[str, Any]:
    """The browser's part (blocking: run in a thread while the event loop serves the gateway)."""
    options = Options()
    options.binary_location = browser[0]
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--window-size=1400,1500", f"--user-data-dir={out / 'profile'}"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(executable_path=browser[1]))
    seen: dict[str, Any] = {}
    try:
        find = driver.find_element

        def shown(by: str, selector: str) -> Any:
            """The element, once it is on the page and visible (views are drawn as their data comes)."""
            return next((e for e in driver.find_elements(by, selector) if e.is_displayed()), None)

        def sign_in(role: str) -> None:
            _until("the sign-in form", lambda: find(By.ID, "token").is_displayed())
            find(By.ID, "token").send_keys(door.tokens[role])
            find(By.CSS_SELECTOR, "#signin-form button[type=submit]").click()
            _until(f"the {role}'s name in the header", lambda: f"· {role} ·" in find(By.ID, "who").text)

        driver.get(f"{door.url}/console/")
        sign_in("submitter")
        find(By.LINK_TEXT, "Submit").click()
        _until("the submit form", lambda: shown(By.ID, "submit-task")).send_keys(TASK)
        find(By.ID, "submit-tools").send_keys("transfer")
        find(By.ID, "submit-prefetch").click()  # no retrieval for this task
        find(By.CSS_SELECTOR, "#submit-form button[type=submit]").click()
        run_id = _until("the run's live view", lambda: (id_ := shown(By.ID, "run-id")) and id_.text.startswith("run-")
                        and id_.text)
        assert driver.execute_script("return location.hash") == f"#/runs/{run_id}"
        seen["run_id"] = run_id

        # The first model step's tokens arrive; the run then waits for a person (the page says so).
        waiting = _until("the tool call's tokens and the wait for approval", lambda: (
            (live := driver.execute_script(LIVE))["approval"] and live["tokens"] >= 3 and live) or None)
        assert '"tool": "transfer"' in waiting["texts"][0] and waiting["status"] == "awaiting approval", waiting
        find(By.ID, "run-timeline-load").click()  # the timeline so far, of a run still going
        _until("the timeline so far", lambda: "awaiting_approval" in (find(By.ID, "run-timeline").get_attribute("srcdoc") or ""))

        # A submitter may not approve: change to an approver's token, then decide on the approvals page.
        find(By.ID, "forget").click()
        sign_in("approver")
        _until("the run's note that a call waits", lambda: shown(By.LINK_TEXT, "open the approvals")).click()
        row = _until("the call in the approvals queue", lambda: shown(By.CSS_SELECTOR, f"tr[data-approval^='{run_id}/']"))
        assert "transfer" in row.text and '"amount": 5' in row.text
        row.find_element(By.TAG_NAME, "input").send_keys("checked the amount")
        row.find_element(By.CSS_SELECTOR, "button.approve").click()
        seen["notice"] = _until("the decision", lambda: "approved by" in find(By.ID, "notice").text
                                and find(By.ID, "notice").text)

        # Back to the run: the answer's tokens stream in, then the outcome, the steps and the timeline.
        driver.back()
        samples: list[dict[str, Any]] = []

        def ended() -> bool:
            samples.append(driver.execute_script(LIVE))
            return samples[-1]["status"] == "completed" and samples[-1]["answer"] == ANSWER

        _until("the answer", ended, timeout=20, every=0.02)
        seen["final"] = samples[-1]
        # Some look at the page caught the answer's step partly written: tokens shown as they came.
        seen["partial"] = [s["texts"][-1] for s in samples
                           if len(s["texts"]) == 3 and 0 < len(s["texts"][-1]) < len(samples[-1]["texts"][-1])
                           and s["status"] != "completed"]
        _until("the timeline", lambda: find(By.ID, "run-timeline").is_displayed()
               and (find(By.ID, "run-timeline").get_attribute("srcdoc") or "").startswith("<!DOCTYPE html>"))
        driver.switch_to.frame(find(By.ID, "run-timeline"))
        seen["lanes"] = len(driver.find_elements(By.CSS_SELECTOR, "rect.lane"))
        driver.switch_to.default_content()

        # The runs list has it, filtered by status.
        find(By.LINK_TEXT, "Runs").click()
        _until("the runs' filters", lambda: shown(By.ID, "runs-status")).send_keys("completed")
        find(By.CSS_SELECTOR, "#runs-filter button[type=submit]").click()
        _until("the filtered list", lambda: "status=completed" in driver.execute_script("return location.hash"))
        link = _until("the run in the list", lambda: shown(By.CSS_SELECTOR, f"tr[data-run='{run_id}'] a"))
        seen["listed"] = [b.text for b in driver.find_elements(By.CSS_SELECTOR, "#runs-table tbody .badge")]
        link.click()
        _until("the run again", lambda: driver.execute_script(LIVE)["answer"] == ANSWER)
        _until("its steps, read again from the start", lambda: (
            live := driver.execute_script(LIVE))["kinds"] == ["model", "tool transfer", "model"]
            and live["texts"] == seen["final"]["texts"])
        _until("the end of its stream", lambda: find(By.ID, "run-live").text.startswith("Ended completed"))
        _until("its timeline", lambda: find(By.ID, "run-timeline").is_displayed())
        seen["token_kept"] = driver.execute_script("return sessionStorage.getItem('agentstream.token')") \
            == door.tokens["approver"]
        time.sleep(0.2)  # the frame's first paint
        seen["screenshot"] = out / "console.png"
        assert driver.save_screenshot(str(seen["screenshot"]))

        if letter is not None:  # an operator's page: the dead letter listed, shown and re-driven
            find(By.ID, "forget").click()
            sign_in("operator")
            find(By.LINK_TEXT, "Dead letters").click()
            _until("the letter in the list", lambda: shown(By.CSS_SELECTOR, f"tr[data-letter='{letter}'] a")).click()
            seen["letter"] = _until("the letter shown", lambda: "undecodable" in find(By.ID, "letter-fields").text
                                    and find(By.ID, "letter-fields").text)
            find(By.ID, "letter-redrive").click()
            seen["redriven"] = _until("the re-drive", lambda: find(By.ID, "letter-result").text)
        seen["console_errors"] = [e for e in driver.get_log("browser")  # script errors, policy violations
                                  if e["level"] == "SEVERE" and e.get("source") != "network"]
        return seen
    finally:
        driver.quit()


async def test_the_console_submits_streams_approves_and_shows_the_answer_in_chromium(door: Door, tmp_path: Path) -> None:
    browser = _browser()
    if browser is None:
        pytest.skip("chromium or chromedriver is not installed (apt-get install chromium chromium-driver; "
                    ".ci/run does)")
    letter = await _dead_letter(door)
    seen = await asyncio.to_thread(_drive, door, browser, tmp_path, letter)

    assert "approved by gateway:default:test-approver" in seen["notice"], seen["notice"]
    final = seen["final"]
    assert final["kinds"] == ["model", "tool transfer", "model"], final
    assert final["texts"][1] == "transferred 5" and ANSWER in final["texts"][2] and final["error"] == ""
    assert final["tokens"] > 20  # both model steps, chunk by chunk
    assert seen["partial"], "the answer's tokens were never seen arriving"
    assert seen["lanes"] == 4  # the timeline's lanes: planner, inference, tools, retrieval
    assert seen["token_kept"]
    assert "console's dead letter" in seen["letter"] and "planner" in seen["letter"], seen["letter"]
    assert seen["redriven"].startswith("redriven:"), seen["redriven"]
    assert seen["listed"] and set(seen["listed"]) == {"completed"}, seen["listed"]  # filtered by status
    assert not seen["console_errors"], seen["console_errors"]  # no script error, no policy violation
    result = await door.pipe.client.wait(seen["run_id"], timeout=10)
    assert result.ok and result.answer == ANSWER

    # The screenshot is a drawn page: many colours, much that is not white, and the console's own.
    width, height, bpp, pixels = await asyncio.to_thread(_png_rgb, seen["screenshot"].read_bytes())
    colours = {pixels[i:i + 3] for i in range(0, len(pixels), bpp * 7)}  # every 7th pixel
    inked = sum(1 for i in range(0, len(pixels), bpp * 7) if pixels[i:i + 3] != b"\xff\xff\xff")
    assert width >= 1000 and height >= 800, (width, height)
    assert len(colours) > 50, len(colours)
    assert inked > 0.05 * (width * height / 7), inked
    assert bytes.fromhex("1e293b") in colours  # the header's colour
    assert bytes.fromhex("dcfce7") in {pixels[i:i + 3] for i in range(0, len(pixels), bpp)}  # the "completed" badge


async def test_the_runs_the_console_lists_and_the_timeline_it_shows(door: Door) -> None:
    """The reads the console adds, over HTTP: ``GET /v1/runs`` with its filters, tenant-scoped, and a run's
    timeline as ``replay show --html`` draws it."""
    session = f"console-{uuid.uuid4().hex[:6]}"
    async with httpx.AsyncClient(timeout=30) as client:
        alone = await test_gateway.submit(client, door, "[[answer:one]]")
        turn = await test_gateway.submit(client, door, "[[answer:two]]", session=session)
        for run_id in (alone, turn):
            assert (await door.pipe.client.wait(run_id, timeout=20)).ok

        async def listed(who: str = "reader", **query: object) -> list[str]:
            response = await client.get(f"{door.url}/v1/runs", params=query, headers=door.auth(who))
            assert response.status_code == 200, response.text
            return [r["run_id"] for r in response.json()["runs"]]

        everything = await listed()
        assert everything.index(turn) < everything.index(alone)  # latest first
        assert await listed(session=session) == [turn]
        assert {alone, turn} <= set(await listed(status="completed", agent="agentstream"))  # the default agent's
        assert not {alone, turn} & set(await listed(status="failed"))
        assert not {alone, turn} & set(await listed(agent="nobody"))
        assert len(await listed(limit=1)) == 1
        assert not {alone, turn} & set(await listed("other"))  # another tenant's runs are not there
        row = (await client.get(f"{door.url}/v1/runs", params={"session": session}, headers=door.auth("reader"))
               ).json()["runs"][0]
        assert (row["status"], row["task"], row["session"], row["agent"], row["step_count"]) == (
            "completed", "[[answer:two]]", session, None, 1)

        page = await client.get(f"{door.url}/v1/runs/{alone}/timeline", headers=door.auth("reader"))
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert page.text.startswith("<!DOCTYPE html>") and f"{alone} · completed" in page.text
        assert 'data-lane="inference"' in page.text
        assert (await client.get(f"{door.url}/v1/runs/{alone}/timeline", headers=door.auth("other"))).status_code == 404
