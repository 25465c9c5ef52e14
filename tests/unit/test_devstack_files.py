"""The dev stack's files and accounts (issue 37, findings 5-7), without starting a server: private modes,
the storage tool's argument file, ``pg_hba.conf``, where PostgreSQL's data lives and when it is swept,
and the account the server runs as."""

from __future__ import annotations

import os
import pwd
import stat
import subprocess
from pathlib import Path

import pytest

from agentstream.devstack import files, postgres, process
from agentstream.devstack.kafka import KafkaLauncher
from agentstream.devstack.secure import StackSecrets
from agentstream.streams.core.errors import StackError

REPO = Path(__file__).resolve().parents[2]


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_restrict_tree_leaves_only_the_owner_bits_and_does_not_follow_symlinks(tmp_path: Path) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_text("not the stack's")
    outside.chmod(0o644)
    root = tmp_path / "state"
    (root / "kafka" / "data" / "t-0").mkdir(parents=True)
    segment = root / "kafka" / "data" / "t-0" / "00000000000000000000.log"
    segment.write_text("a tenant's task")
    tool = root / "kafka" / "tool.sh"
    tool.write_text("#!/bin/sh\n")
    for path, mode in ((root, 0o755), (root / "kafka", 0o755), (root / "kafka" / "data", 0o755),
                       (segment.parent, 0o777), (segment, 0o644), (tool, 0o755)):
        path.chmod(mode)
    (root / "link").symlink_to(outside)

    assert files.restrict_tree(root) == 6
    assert {_mode(p) for p in (root, root / "kafka", root / "kafka" / "data", segment.parent)} == {0o700}
    assert (_mode(segment), _mode(tool)) == (0o600, 0o700)
    assert _mode(outside) == 0o644  # what the symlink names is not the stack's
    assert files.restrict_tree(root) == 0
    assert files.restrict_tree(tmp_path / "missing") == 0


def test_private_dir_and_files(tmp_path: Path) -> None:
    made = files.private_dir(tmp_path / "a" / "b")
    assert _mode(made) == 0o700
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(OSError, match="symlink"):
        files.private_dir(tmp_path / "link")

    wide = tmp_path / "wide"
    wide.write_text("old")
    wide.chmod(0o666)
    assert files.write_private(wide, "new").read_text() == "new"
    assert _mode(wide) == 0o600

    log = tmp_path / "server.log"
    log.write_text("before\n")
    log.chmod(0o644)
    os.close(files.open_private_log(log))
    assert _mode(log) == 0o600 and log.read_text() == "before\n"


def test_an_argument_file_quotes_what_the_java_launcher_would_split_or_unescape() -> None:
    text = files.argfile_text(["-cp", "/jars/*", "--add-scram", 'SCRAM-SHA-512=[name=a,salt="c2E="]',
                               "it's", "a\\b", "two\nlines"])
    assert text.splitlines() == ["'-cp'", "'/jars/*'", "'--add-scram'", "'SCRAM-SHA-512=[name=a,salt=\"c2E=\"]'",
                                 "'it\\'s'", "'a\\\\b'", "'two\\nlines'"]


def test_the_storage_tool_gets_the_scram_credentials_from_a_private_file_not_its_command_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The salted passwords log in as well as the passwords; ``/proc/PID/cmdline`` is anyone's to read."""
    secrets = StackSecrets.ensure(tmp_path / "secrets")
    launcher = KafkaLauncher(infra_dir=REPO / "infra", cache_dir=tmp_path / "cache", work_dir=tmp_path / "kafka",
                             port=1234, controller_port=1235, secrets=secrets)
    files.private_dir(launcher.work_dir)
    seen: list[tuple[list[str], str, int, int]] = []

    def run(argv, **kwargs) -> subprocess.CompletedProcess[str]:
        argfile = Path(argv[1].removeprefix("@"))
        seen.append((list(argv), argfile.read_text(), _mode(argfile), kwargs.get("umask", -1)))
        return subprocess.CompletedProcess(argv, 0, "", "")

    monkeypatch.setattr(process, "run", run)
    launcher._format_storage(launcher._render_config(), "q1Sh-9_ISia_zwGINzRvyQ")
    [(argv, text, mode, umask)] = seen
    assert argv == ["java", f"@{launcher.work_dir / 'format.args'}"]
    assert mode == 0o600 and umask == files.PRIVATE_UMASK
    assert text.count("'--add-scram'") == len(secrets.kafka_principals) and "saltedpassword=" in text
    assert "'kafka.tools.StorageTool'\n'format'\n" in text
    assert not (launcher.work_dir / "format.args").exists()


def test_pg_hba_trusts_the_socket_and_loopback_only_where_the_docs_say() -> None:
    def rules(text: str) -> list[list[str]]:
        return [line.split() for line in text.splitlines() if line and not line.startswith("#")]

    assert rules(postgres.hba_rules("127.0.0.1", secure=True)) == [
        ["local", "all", "all", "trust"], ["host", "all", "all", "127.0.0.1/32", "scram-sha-256"]]
    assert rules(postgres.hba_rules("127.0.0.1", secure=False)) == [
        ["local", "all", "all", "trust"], ["host", "all", "all", "127.0.0.1/32", "trust"]]
    assert rules(postgres.hba_rules("10.78.0.3", secure=False))[-1] == ["host", "all", "all", "10.78.0.0/24", "trust"]


def test_as_root_the_data_is_under_a_directory_of_roots_keyed_by_the_state_dir(tmp_path: Path) -> None:
    account = process.RunAs("agentstream", 999, 999)
    assert postgres.default_work_dir(tmp_path, None) == tmp_path / "postgres"
    work = postgres.default_work_dir(tmp_path / "s", account)
    assert work.parent == postgres.SHARED_ROOT and len(work.name) == 12
    assert postgres.default_work_dir(tmp_path / "s", account) == work != postgres.default_work_dir(tmp_path, account)
    for overlapping in (postgres.SHARED_ROOT, postgres.SHARED_ROOT.parent, postgres.SHARED_ROOT / "x"):
        with pytest.raises(StackError, match="AGENTSTREAM_STATE_DIR"):
            postgres.default_work_dir(overlapping, account)


def test_data_whose_stack_is_gone_is_swept_and_nothing_else(tmp_path: Path) -> None:
    alive_state = tmp_path / "alive"
    alive_state.mkdir()
    base = tmp_path / "root"
    for name, owner in (("gone", tmp_path / "deleted"), ("alive", alive_state), ("unowned", None)):
        (base / name / "data").mkdir(parents=True)
        if owner is not None:
            (base / name / postgres.OWNER_FILE).write_text(f"{owner}\n")
    assert postgres.sweep_orphans(tmp_path / "root") == [base / "gone"]
    assert sorted(p.name for p in base.iterdir()) == ["alive", "unowned"]
    assert postgres.sweep_orphans(tmp_path / "nothing-here") == []


def test_not_root_the_server_runs_as_the_current_user(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert process.RunAs.for_postgres() is None


def test_as_root_an_account_named_by_the_environment_must_exist(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setenv("AGENTSTREAM_PG_USER", "no-such-account-37")
    with pytest.raises(StackError, match="no-such-account-37"):
        process.RunAs.for_postgres()


def test_as_root_the_stacks_own_account_is_created_once_even_when_another_session_races(
        monkeypatch: pytest.MonkeyPatch) -> None:
    accounts: dict[str, pwd.struct_passwd] = {}
    calls: list[list[str]] = []

    def getpwnam(name: str) -> pwd.struct_passwd:
        return accounts[name]

    def run(argv, **kwargs) -> subprocess.CompletedProcess[str]:
        calls.append(list(argv))
        if len(calls) == 1:  # another session holds /etc/passwd's lock
            return subprocess.CompletedProcess(argv, 10, "", "useradd: cannot lock /etc/passwd")
        accounts[argv[-1]] = pwd.struct_passwd((argv[-1], "x", 998, 997, "", "/nonexistent", "/usr/sbin/nologin"))
        return subprocess.CompletedProcess(argv, 9, "", "useradd: user already exists")  # it made it meanwhile

    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.delenv("AGENTSTREAM_PG_USER", raising=False)
    monkeypatch.setattr(pwd, "getpwnam", getpwnam)
    monkeypatch.setattr(subprocess, "run", run)
    monkeypatch.setattr(process.time, "sleep", lambda _s: None)
    assert process.RunAs.for_postgres() == process.RunAs(process.STACK_ACCOUNT, 998, 997)
    assert len(calls) == 2 and "--system" in calls[0] and calls[0][-1] == process.STACK_ACCOUNT


def test_a_failing_useradd_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    def getpwnam(name: str) -> pwd.struct_passwd:
        raise KeyError(name)

    monkeypatch.setattr(pwd, "getpwnam", getpwnam)
    monkeypatch.setattr(subprocess, "run", lambda argv, **kw: subprocess.CompletedProcess(argv, 1, "", "read-only"))
    with pytest.raises(StackError, match="AGENTSTREAM_PG_USER"):
        process.ensure_system_account("agentstream-test")


def test_the_data_an_older_version_kept_in_var_tmp_moves_to_the_stacks_account(tmp_path: Path) -> None:
    """``dev up`` keeps the default stack's data across the move out of the shared temporary directory."""
    me = process.RunAs("me", os.geteuid(), os.getegid())  # chown to oneself works for any user
    old = tmp_path / "var-tmp" / "1fe2157f3ca9"
    (old / "data" / "base").mkdir(parents=True)
    (old / "data" / "PG_VERSION").write_text("18\n")
    for path, mode in ((old, 0o755), (old / "data" / "PG_VERSION", 0o644)):
        path.chmod(mode)
    state = tmp_path / "state"
    launcher = postgres.PostgresLauncher(infra_dir=REPO / "infra", work_dir=postgres.default_work_dir(
        state, me, tmp_path / "lib"), port=1, database="d", run_as=me, state_dir=state)

    assert not launcher.adopt(old)  # not from the older version's place
    assert launcher.adopt(old, legacy_root=old.parent)
    assert not old.exists() and (launcher.data_dir / "PG_VERSION").read_text() == "18\n"
    assert _mode(launcher.work_dir) == 0o700 and _mode(launcher.data_dir / "PG_VERSION") == 0o600
    assert _mode(launcher.work_dir.parent) == 0o711
    assert (launcher.work_dir / postgres.OWNER_FILE).read_text().strip() == str(state)
    old.mkdir()
    assert not launcher.adopt(old, legacy_root=old.parent)  # never over data
    assert not postgres.PostgresLauncher(infra_dir=REPO / "infra", work_dir=state / "postgres", port=1, database="d",
                                         run_as=None).adopt(old, legacy_root=old.parent)  # not root: the data never left the state dir
