"""The dev stack's files belong to its owner alone (issue 37, findings 6 and 7).

Another account on the machine read a tenant's task text from a Kafka log segment (0644 in 0755
directories) and the salted SCRAM passwords from the broker formatting's command line (``/proc/PID/cmdline``
is world-readable, and a salted password logs in as well as the password). So:

- every directory of the stack's state is 0700 and every file 0600 (``private_dir``, ``restrict_tree``,
  made so on every start, which also fixes a tree an older version left readable), and the servers run
  with umask 077 (``PRIVATE_UMASK``), so what they create later is private too;
- a secret a Java tool needs as an argument goes in an argument file (``java @FILE``: the launcher reads
  the file, and the process's command line shows only ``@FILE``), 0600, removed once the tool exits
  (``java_argfile``).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

#: The umask of every server and tool the stack runs: what they create is the owner's only.
PRIVATE_UMASK = 0o077
_OTHERS = stat.S_IRWXG | stat.S_IRWXO


def private_dir(path: Path) -> Path:
    """``path`` created if missing (parents too) and made 0700. A symlink is refused: chmod would follow it
    to whatever it names."""
    if path.is_symlink():
        raise OSError(f"{path} is a symlink; the stack's directories must be real directories")
    path.mkdir(parents=True, exist_ok=True)
    os.chmod(path, 0o700)
    return path


def restrict_tree(root: Path) -> int:
    """Take the group's and others' bits off ``root`` and everything under it (symlinks are not followed
    and left alone); return how many entries changed. Owner bits stay: an executable stays executable
    for its owner, PostgreSQL's data directory stays 0700."""
    changed = 0
    for path in _walk(root):
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            continue  # a server removed it meanwhile (a deleted segment, a finished checkpoint)
        if stat.S_ISLNK(mode) or not mode & _OTHERS:
            continue
        try:
            os.chmod(path, stat.S_IMODE(mode) & ~_OTHERS, follow_symlinks=False)
        except FileNotFoundError:
            continue
        changed += 1
    return changed


def _walk(root: Path) -> Iterator[str]:
    if not os.path.lexists(root):
        return
    yield str(root)
    for directory, dirs, files in os.walk(root):  # does not descend into symlinked directories
        for name in (*dirs, *files):
            yield os.path.join(directory, name)


def write_private(path: Path, text: str) -> Path:
    """``text`` in a new 0600 file at ``path`` (an existing file is replaced, not reused: it could have
    wider permissions, which ``O_CREAT`` would keep)."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)
    return path


def open_private_log(path: Path) -> int:
    """A log file opened for appending, 0600 whether new or not (a server's log can quote what it was
    sent); the caller closes the descriptor."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.fchmod(fd, 0o600)
    return fd


def argfile_text(args: Sequence[str]) -> str:
    """``args`` as a Java launcher argument file: each one single-quoted on its own line, with ``\\``,
    ``'`` and line breaks escaped as the launcher reads them back."""
    def quote(arg: str) -> str:
        escaped = (arg.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n").replace("\r", "\\r"))
        return f"'{escaped}'"

    return "".join(quote(arg) + "\n" for arg in args)


@contextmanager
def java_argfile(directory: Path, name: str, args: Sequence[str]) -> Iterator[str]:
    """An argument file holding ``args`` (main class and all) in ``directory``, 0600 while the ``java``
    call that reads it runs, removed after; yields ``@<path>``, the only argument ``java`` then needs."""
    path = write_private(directory / name, argfile_text(args))
    try:
        yield f"@{path}"
    finally:
        path.unlink(missing_ok=True)
