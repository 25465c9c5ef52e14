"""The web console's side of the gateway that needs no broker or database: its files are served under
/console/ with the console's security headers, they are package data the wheel ships, they fetch nothing
from elsewhere and never put API text into HTML, and the reads the console adds (GET /v1/runs,
/v1/whoami, /v1/runs/{id}/timeline) check who asks and what they ask. The console in a real browser, on
the real stack: tests/integration/test_console.py."""

from __future__ import annotations

import re
import tomllib
from fnmatch import fnmatch
from pathlib import Path

from agentstream.services.gateway.routes_console import CONSOLE_CSP, console_dir
from agentstream.streams.replay.html import script_source
from tests.unit.test_gateway_http import assert_problem, auth, client

ROOT = Path(__file__).resolve().parents[2]


def test_the_console_is_served_with_its_policy_and_the_root_leads_there() -> None:
    with client() as c:
        for path in ("/", "/console"):
            moved = c.get(path, follow_redirects=False)
            assert moved.status_code == 307 and moved.headers["location"] == "/console/"
        index = c.get("/console/")
        assert index.status_code == 200 and index.headers["content-type"].startswith("text/html")
        assert index.headers["content-security-policy"] == CONSOLE_CSP
        assert index.headers["x-content-type-options"] == "nosniff"
        for name in re.findall(r'(?:src|href)="([^"#:]+)"', index.text):  # the page's own files, all there
            part = c.get(f"/console/{name}")
            assert part.status_code == 200 and part.headers["content-security-policy"] == CONSOLE_CSP, name
        assert_problem(c.get("/console/nothing.js"), 404)
        assert c.get("/console/").text == index.text  # no token needed for the files: the API asks for it


def test_the_policy_allows_scripts_from_the_gateway_and_the_timelines_own_only() -> None:
    scripts = next(part for part in CONSOLE_CSP.split("; ") if part.startswith("script-src"))
    assert scripts == f"script-src 'self' {script_source()}"
    assert "'unsafe-inline'" not in scripts and "'unsafe-eval'" not in scripts
    assert "frame-ancestors 'none'" in CONSOLE_CSP


def test_the_console_files_are_package_data_and_fetch_nothing_from_elsewhere() -> None:
    shipped = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    files = sorted(p for p in console_dir().rglob("*") if p.is_file())
    assert {p.name for p in files} >= {"index.html", "console.js", "console.css"}
    for path in files:
        relative = path.relative_to(console_dir().parents[1]).as_posix()  # gateway/console/…
        assert any(fnmatch(relative, pattern) for pattern in shipped["agentstream.services"]), relative
        text = path.read_text()
        for external in ("http://", "https://", "//cdn", "@import", "url("):
            assert external not in text, (path.name, external)
    script = (console_dir() / "console.js").read_text()
    for unsafe in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function"):
        assert unsafe not in script, unsafe  # API text is set as text, never parsed as HTML or code


def test_every_form_control_has_a_label() -> None:
    page = (console_dir() / "index.html").read_text()
    labelled = set(re.findall(r'<label for="([^"]+)"', page))
    controls = re.findall(r"<(?:input|select|textarea)\b[^>]*\bid=\"([^\"]+)\"", page)
    assert controls and set(controls) <= labelled, set(controls) - labelled


def test_whoami_names_the_tokens_tenant_and_role_and_the_runs_list_checks_its_query() -> None:
    with client() as c:
        me = c.get("/v1/whoami", headers=auth("ags_approver"))
        assert me.status_code == 200 and me.json() == {"tenant": "acme", "role": "approver", "token_id": "a1", "name": ""}
        assert_problem(c.get("/v1/whoami"), 401)
        assert_problem(c.get("/v1/runs"), 401)
        body = assert_problem(c.get("/v1/runs?status=sleeping", headers=auth("ags_reader")), 422)
        assert body["invalid_params"][0]["name"] == "query.status"
        assert_problem(c.get("/v1/runs?limit=0", headers=auth("ags_reader")), 422)
        assert_problem(c.get("/v1/runs?limit=501", headers=auth("ags_reader")), 422)
        assert_problem(c.get("/v1/runs/run-1/timeline"), 401)
        assert_problem(c.post("/v1/runs/run-1/timeline", headers=auth("ags_reader")), 405)
