"""One process at a time in a run folder: an OS-level lock held for the run's whole life.

Two ``vlret train`` processes writing one ``output_dir`` interleave ``metrics.jsonl`` and can
leave ``best.pt`` from one run next to ``last.pt`` of the other. The trainer therefore takes
:data:`LOCK_FILE` in the run folder with ``fcntl.flock`` (exclusive, non-blocking) before it
reads or deletes anything there (``--overwrite`` deletes the old run's files only once the
lock is held), and keeps it until :meth:`vlret.train.Trainer.fit` ends, however it ends.

* The lock file records its holder: process id, host, start time and command line (JSON).
* A live holder makes a second run, a ``--resume`` and an ``--overwrite`` of the folder refuse
  with one line naming it (:class:`RunFolderLocked`).
* The operating system drops an ``flock`` when the process holding it dies, SIGKILL and an
  out-of-memory kill included. A lock file whose lock can be taken but that still names a
  holder was left by a process that died; it is taken over with a one-line note naming the
  old holder.
* A run that ends removes the lock file while it still holds the lock; the next one then
  sees no holder. A process that opened the file just before it was removed finds, once it
  holds the lock, that the path no longer leads to its file, and starts over.
* Under torchrun only rank 0, the process that writes the folder, holds the lock.

Limits. ``flock`` is advisory: it keeps out other vlret runs, not a user's own ``rm`` or a
program that does not ask for the lock. On Linux, NFS (since kernel 2.6.12) emulates
``flock`` with POSIX byte-range locks, so the lock holds between machines only where the NFS
lock service (``lockd`` / NFSv4 locking) works; mounts with ``nolock`` / ``local_lock=flock``,
some FUSE and SMB/CIFS mounts keep the lock local to one machine, and two hosts can then both
write one folder. A holder on another host cannot be told dead from alive: its lock file is
only taken over when its lock is released. Windows has no ``fcntl``: there the folder is not
locked and runs must keep to their own folders.
"""

from __future__ import annotations

import contextlib
import datetime
import gc
import json
import os
import shlex
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

try:  # POSIX only; see the module docstring
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

#: The lock file inside a run folder (hidden, and not one of the run's files).
LOCK_FILE = ".vlret.lock"


class RunFolderLocked(ValueError):
    """The run folder is locked by another live process (its ``holder`` names it)."""

    def __init__(self, folder: Path, holder: dict[str, Any] | None) -> None:
        self.folder = folder
        self.holder = holder
        super().__init__(
            f"{folder}: in use by another run ({describe_holder(holder)}); wait for it to "
            "finish or stop it, or choose another output_dir (--resume and --overwrite of a "
            "folder in use are refused too)"
        )


def describe_holder(holder: dict[str, Any] | None) -> str:
    """``pid 123 on host h since 2024-01-01 12:00:00, command: vlret train c.toml``."""
    if not holder:
        return "holder not recorded yet"
    parts = [f"pid {holder.get('pid', '?')}"]
    if holder.get("host"):
        parts.append(f"on {holder['host']}")
    if holder.get("since"):
        parts.append(f"since {holder['since']}")
    line = " ".join(parts)
    if holder.get("command"):
        line += f", command: {holder['command']}"
    return line


def _holder_now() -> dict[str, Any]:
    argv = list(sys.argv) or ["python"]
    argv[0] = Path(argv[0]).name or argv[0]
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "since": datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M:%S %z"),
        "command": shlex.join(argv),
    }


def _read_holder(fd: int) -> dict[str, Any] | None:
    """The holder recorded in the open lock file (None: empty or not ours)."""
    os.lseek(fd, 0, os.SEEK_SET)
    data = b""
    while chunk := os.read(fd, 65536):
        data += chunk
        if len(data) > 1 << 20:  # not a lock file of ours
            return None
    try:
        holder = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return {"pid": "?", "command": "unreadable lock file"} if data.strip() else None
    return holder if isinstance(holder, dict) else None


def _read_holder_at(path: Path) -> dict[str, Any] | None:
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    try:
        return _read_holder(fd)
    finally:
        os.close(fd)


class RunLock:
    """The held lock of one run folder; :meth:`release` (idempotent) ends it, and so does the
    garbage collection of a lock left unreleased (a trainer dropped without ``close``)."""

    def __init__(self, folder: Path, fd: int | None) -> None:
        self.folder = folder
        self.path = folder / LOCK_FILE
        self._fd = fd

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        """Remove the lock file (while the lock is still held), then drop the lock. A folder
        that became unwritable keeps the file; the next run takes it over with a note."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            if _same_file(fd, self.path):
                self.path.unlink()
        except OSError:
            pass
        finally:
            os.close(fd)  # the flock goes with the last descriptor of the open file

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.release()


def _same_file(fd: int, path: Path) -> bool:
    try:
        a, b = os.fstat(fd), os.stat(path)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def acquire_run_lock(folder: str | Path, *, notify: Callable[[str], None] | None = None) -> RunLock:
    """Lock the existing run ``folder`` for this process (see the module docstring).

    Args:
        folder: The run folder (it must exist).
        notify: Receives the one-line note when the lock of a dead holder is taken over.

    Returns:
        The held :class:`RunLock`.

    Raises:
        RunFolderLocked: Another live process holds the folder.
        OSError: The lock file cannot be created or written (the caller names the folder).
    """
    folder = Path(folder)
    if fcntl is None:  # pragma: no cover - Windows
        return RunLock(folder, None)
    path = folder / LOCK_FILE
    collected = False
    for _ in range(100):  # each retry follows a lock file removed under us
        fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            if not collected and holder and holder.get("pid") == os.getpid():
                # Held by this very process: maybe by a trainer that is garbage now (its lock
                # goes with it); a live one still holds it after the collection.
                gc.collect()
                collected = True
                continue
            raise RunFolderLocked(folder, holder) from None
        except BaseException:
            os.close(fd)
            raise
        if not _same_file(fd, path):  # removed (and perhaps re-created) by its last holder
            os.close(fd)
            continue
        lock = RunLock(folder, fd)
        try:
            stale = _read_holder(fd)
            os.ftruncate(fd, 0)
            data = (json.dumps(_holder_now()) + "\n").encode("utf-8")
            os.lseek(fd, 0, os.SEEK_SET)
            os.write(fd, data)
        except BaseException:
            lock.release()
            raise
        if stale and notify is not None:
            notify(
                f"{folder}: took over the lock left by a run that is no longer running "
                f"({describe_holder(stale)})"
            )
        return lock
    raise RunFolderLocked(folder, _read_holder_at(path))  # pragma: no cover - endless churn


__all__ = ["LOCK_FILE", "RunFolderLocked", "RunLock", "acquire_run_lock", "describe_holder"]
