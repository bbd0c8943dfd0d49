"""One process at a time in a run folder: an OS-level lock held for the run's whole life.

Two ``vlret train`` processes writing one ``output_dir`` interleave ``metrics.jsonl`` and can
leave ``best.pt`` from one run next to ``last.pt`` of the other. The trainer therefore takes
:data:`LOCK_FILE` in the run folder with ``fcntl.flock`` (exclusive, non-blocking) before it
reads or deletes anything there (``--overwrite`` deletes the old run's files only once the
lock is held), and keeps it until :meth:`vlret.train.Trainer.fit` ends, however it ends.

* The lock file records its holder: process id, host, start time and command line (JSON), and
  on Linux the process's start in clock ticks since boot (``/proc/PID/stat``, field 22) and the
  boot's id, which tell the holder from a later process that was given the same pid.
* The lock file is never followed: it is opened with ``O_NOFOLLOW`` and must be a regular file
  (``lstat``); a symbolic link, a folder, a device, a FIFO or a socket in its place refuses the
  run in one line (:class:`LockFileRefused`) before anything is read, written or removed, and a
  lock file is removed at the end only while the path still names the very file locked.
* A live holder makes a second run, a ``--resume`` and an ``--overwrite`` of the folder refuse
  with one line naming it (:class:`RunFolderLocked`).
* The operating system drops an ``flock`` when the process holding it dies, SIGKILL and an
  out-of-memory kill included. A lock file whose lock can be taken but that still names a
  holder is taken over with a one-line note naming the old holder and what became of it
  (:func:`takeover_note`): gone; its pid now another process (start or command line differ);
  still running but no longer holding the lock; or on another host (not checked).
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
import errno
import gc
import json
import os
import shlex
import socket
import stat
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .._files import file_kind

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


class LockFileRefused(ValueError):
    """``output_dir/.vlret.lock`` is not a regular file (a symbolic link, a folder, a device,
    a FIFO or a socket): vlret never follows, writes or removes such a path."""


def _proc_start(pid: int) -> int | None:
    """The start of process ``pid`` in clock ticks since boot (``/proc/PID/stat`` field 22);
    None where there is no such process or no ``/proc``."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    fields = text[text.rfind(")") + 2 :].split()  # the command name may hold spaces and ')'
    try:
        return int(fields[19])  # field 22 counts from pid (1) and comm (2): 22 - 3
    except (IndexError, ValueError):
        return None


def _proc_command(pid: int) -> str | None:
    """The command line of process ``pid`` (``/proc/PID/cmdline``), None where unreadable."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    argv = [a.decode("utf-8", "replace") for a in raw.split(b"\0") if a]
    return shlex.join(argv) if argv else None


def _boot_id() -> str | None:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text(encoding="utf-8").strip()
    except OSError:
        return None


def _holder_now() -> dict[str, Any]:
    argv = list(sys.argv) or ["python"]
    argv[0] = Path(argv[0]).name or argv[0]
    holder: dict[str, Any] = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "since": datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M:%S %z"),
        "command": shlex.join(argv),
    }
    start, boot = _proc_start(os.getpid()), _boot_id()
    if start is not None:
        holder["proc_start"] = start
    if boot is not None:
        holder["boot_id"] = boot
    return holder


def takeover_note(folder: Path, stale: dict[str, Any]) -> str:
    """The one line printed when the lock of ``stale`` (its recorded holder) is taken over: the
    lock was free, so the holder does not hold it; whether its pid is gone, is now another
    process, or is the holder still running is read from ``/proc`` (same host only)."""
    old = describe_holder(stale)
    recorded_pid = stale.get("pid")
    pid = recorded_pid if isinstance(recorded_pid, int) and recorded_pid > 0 else 0
    host = stale.get("host")
    if host and host != socket.gethostname():
        return (
            f"{folder}: took over the lock released by a run on another host ({old}); "
            "whether it still runs there cannot be checked from here"
        )
    if not pid:  # a lock file vlret cannot read, or one without a process id
        return (
            f"{folder}: took over the lock; its lock file records no holder vlret can read "
            f"({old}), and the lock was free"
        )
    start = _proc_start(pid)
    if start is None:
        return f"{folder}: took over the lock left by a run that is no longer running ({old})"
    recorded_start, recorded_boot = stale.get("proc_start"), stale.get("boot_id")
    command = _proc_command(pid) or "?"
    if recorded_start is None:
        return (
            f"{folder}: took over the lock left by pid {pid} ({old}); a process with that pid "
            f"runs now (command: {command}) but the lock file records no start to tell "
            "whether it is the same run, and the lock was free"
        )
    same_boot = recorded_boot is None or recorded_boot == _boot_id()
    if start != recorded_start or not same_boot:
        return (
            f"{folder}: took over the lock left by a run that is no longer running ({old}); "
            f"pid {pid} is now another process (command: {command})"
        )
    return (
        f"{folder}: took over the lock released by pid {pid}, which still runs but no longer "
        f"holds it ({old})"
    )


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
        flags = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0)
        fd = os.open(path, flags | getattr(os, "O_NONBLOCK", 0))  # never through a link
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
        """Remove the lock file (while the lock is still held, and only while the path still
        names the very file locked: never a link or another file put in its place), then drop
        the lock. A folder that became unwritable keeps the file; the next run takes it over
        with a note."""
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
    """Whether ``path`` itself (not followed: ``lstat``) is the file open as ``fd``."""
    try:
        a, b = os.fstat(fd), os.lstat(path)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _refuse_unless_regular(path: Path) -> None:
    """:class:`LockFileRefused` when ``path`` exists and is not a regular file (``lstat``)."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    what = file_kind(mode)
    if what is None:
        return
    if stat.S_ISLNK(mode):
        with contextlib.suppress(OSError):  # removed meanwhile: plain "a symbolic link"
            what = f"{what} (to {os.readlink(path)})"
    raise LockFileRefused(
        f"{path}: the run lock is {what}, not a lock file vlret wrote; vlret neither follows "
        "nor replaces it: remove it, or choose another output_dir"
    )


def _open_lock_file(path: Path) -> int:
    """Open (creating) the regular lock file at ``path`` without following a link; a link, a
    folder or a special file there raises :class:`LockFileRefused` (nothing written)."""
    _refuse_unless_regular(path)
    flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0)
    flags |= getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as err:
        if err.errno in (errno.ELOOP, errno.EISDIR, errno.ENXIO):  # replaced between the checks
            _refuse_unless_regular(path)
        raise
    opened = os.fstat(fd)
    if not stat.S_ISREG(opened.st_mode):
        os.close(fd)
        _refuse_unless_regular(path)
        raise LockFileRefused(f"{path}: the run lock is not a regular file")  # pragma: no cover
    if opened.st_nlink > 1:  # another name of the same file: writing the lock would change it
        os.close(fd)
        raise LockFileRefused(
            f"{path}: the run lock is a hard link ({opened.st_nlink} names for one file), not a "
            "lock file vlret wrote; vlret neither writes nor removes it: remove it, or choose "
            "another output_dir"
        )
    return fd


def acquire_run_lock(folder: str | Path, *, notify: Callable[[str], None] | None = None) -> RunLock:
    """Lock the existing run ``folder`` for this process (see the module docstring).

    Args:
        folder: The run folder (it must exist).
        notify: Receives the one-line note when the lock of a dead holder is taken over.

    Returns:
        The held :class:`RunLock`.

    Raises:
        RunFolderLocked: Another live process holds the folder.
        LockFileRefused: The lock file's path is a symbolic link, a folder or a special file.
        OSError: The lock file cannot be created or written (the caller names the folder).
    """
    folder = Path(folder)
    if fcntl is None:  # pragma: no cover - Windows
        return RunLock(folder, None)
    path = folder / LOCK_FILE
    collected = False
    for _ in range(100):  # each retry follows a lock file removed under us
        fd = _open_lock_file(path)
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
            notify(takeover_note(folder, stale))
        return lock
    raise RunFolderLocked(folder, _read_holder_at(path))  # pragma: no cover - endless churn


def check_unlocked(folder: str | Path) -> None:
    """Refuse the run ``folder`` as :func:`acquire_run_lock` would, without creating, locking or
    writing anything (``vlret train --check``): a lock file that is no regular file, or one a
    live process holds. A shared lock is tried on the file opened read-only and let go at once.

    Raises:
        RunFolderLocked: Another live process holds the folder.
        LockFileRefused: The lock file's path is a symbolic link, a folder or a special file.
    """
    path = Path(folder) / LOCK_FILE
    _refuse_unless_regular(path)
    if fcntl is None or not path.exists():  # pragma: no cover - Windows
        return
    flags = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags | getattr(os, "O_NONBLOCK", 0))
    except OSError:  # removed meanwhile, or unreadable: the real run's lock says more
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        raise RunFolderLocked(Path(folder), _read_holder(fd)) from None
    finally:
        os.close(fd)  # drops the shared lock too


__all__ = [
    "LOCK_FILE",
    "LockFileRefused",
    "RunFolderLocked",
    "RunLock",
    "acquire_run_lock",
    "check_unlocked",
    "describe_holder",
    "takeover_note",
]
