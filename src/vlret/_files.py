"""Atomic file writes for every file a run leaves behind (checkpoints, configs, vocabularies,
tables): a temporary file in the same folder, fsync, rename, with SIGINT / SIGTERM held back
while the write is in flight.

A reader, or a run killed with SIGKILL mid-write, sees either the previous file or the new one,
never a truncated file. A kill can leave the temporary file (``.NAME.XXXX.tmp``) behind:
:func:`remove_stale_temporaries` clears those when the next run starts in the folder.
"""

from __future__ import annotations

import contextlib
import errno
import glob
import json
import os
import signal
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

_HELD_SIGNALS = {signal.SIGINT, signal.SIGTERM}

#: errno values of a write that failed for want of room or permission, and what they mean
_WRITE_ERRORS = {
    errno.ENOSPC: "no space left on the device",
    errno.EDQUOT: "disk quota exceeded",
    errno.EFBIG: "file size limit exceeded",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
    errno.EROFS: "read-only file system",
}


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """Hold SIGINT and SIGTERM until the block ends; a signal that arrives meanwhile is
    delivered (and its handler runs) right after. Main thread on POSIX only; elsewhere a no-op.

    A second Ctrl-C while ``last.pt`` is being written must not cut the write short.
    """
    if threading.current_thread() is not threading.main_thread() or not hasattr(
        signal, "pthread_sigmask"
    ):
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, _HELD_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _fsync_dir(folder: Path) -> None:
    try:  # make the rename itself durable
        dir_fd = os.open(folder, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(dir_fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(dir_fd)


class WriteFailed(OSError):
    """A write that failed for want of room or permission (:data:`_WRITE_ERRORS`), named by
    the target path (not the temporary file); ``str()`` is the one line a user sees, and says
    whether the previous file at the path was left as it was."""

    def __init__(self, code: int, path: Path, kept: bool) -> None:
        super().__init__(code, os.strerror(code), str(path))
        self.code = code
        self.kept = kept

    def __str__(self) -> str:
        line = f"{self.filename}: cannot write ({_WRITE_ERRORS[self.code]})"
        return line + ("; the previous file is left as it was" if self.kept else "")


class _RecordingWriter:
    """A file object that remembers the first ``OSError`` of a write: torch's checkpoint
    writer turns it into ``RuntimeError: unexpected pos ...``, which names neither the file
    nor the cause."""

    def __init__(self, fh: BinaryIO) -> None:
        self._fh = fh
        self.error: OSError | None = None

    def _recorded(self, call: Callable[..., Any], *args: Any) -> Any:
        try:
            return call(*args)
        except OSError as err:
            self.error = self.error or err
            raise

    def write(self, data: Any) -> Any:
        return self._recorded(self._fh.write, data)

    def flush(self) -> None:
        self._recorded(self._fh.flush)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._fh, name)


def atomic_write(path: str | Path, write: Callable[[BinaryIO], object]) -> Path:
    """Call ``write(fh)`` on a temporary file next to ``path``, then rename it over ``path``.

    The file gets the permissions an ordinary ``open(path, "w")`` would (``0o666 & ~umask``).
    On any error the temporary file is removed and ``path`` is left as it was; a disk that is
    full, a file size limit (``RLIMIT_FSIZE``) or a permission refused is raised as
    :class:`WriteFailed` naming ``path``, whatever the writer turned the ``OSError`` into.
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        _raise_write_failure(err, path, err)
    with signals_deferred():
        recorder: _RecordingWriter | None = None
        tmp_name: str | None = None
        try:
            fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
            with os.fdopen(fd, "wb") as fh:
                recorder = _RecordingWriter(fh)
                write(recorder)  # type: ignore[arg-type]
                recorder.flush()
                os.fsync(fh.fileno())
            os.chmod(tmp_name, 0o666 & ~_umask())
            os.replace(tmp_name, path)
        except BaseException as err:
            if tmp_name is not None:
                Path(tmp_name).unlink(missing_ok=True)
            recorded = recorder.error if recorder is not None else None
            _raise_write_failure(recorded if recorded is not None else err, path, err)
            raise
    _fsync_dir(path.parent)
    return path


def _raise_write_failure(cause: BaseException, path: Path, err: BaseException) -> None:
    """Raise :class:`WriteFailed` from ``err`` when ``cause`` is an ``OSError`` of
    :data:`_WRITE_ERRORS`; otherwise return (the caller re-raises ``err``)."""
    if isinstance(cause, OSError) and cause.errno in _WRITE_ERRORS:
        raise WriteFailed(cause.errno, path, kept=path.exists()) from err


def atomic_write_text(path: str | Path, text: str) -> Path:
    """:func:`atomic_write` of a UTF-8 text."""
    data = text.encode("utf-8")
    return atomic_write(path, lambda fh: fh.write(data))


def remove_stale_temporaries(folder: str | Path, names: Iterable[str]) -> list[Path]:
    """Delete the temporary files a killed :func:`atomic_write` of ``folder/NAME`` left behind
    (``.NAME.*.tmp``, and the older ``NAME.tmp`` form); returns what was removed."""
    folder = Path(folder)
    removed: list[Path] = []
    if not folder.is_dir():
        return removed
    for name in names:
        pattern = f".{glob.escape(name)}.*.tmp"
        for stale in [*folder.glob(pattern), folder / f"{name}.tmp"]:
            if stale.is_file():
                stale.unlink(missing_ok=True)
                removed.append(stale)
    return removed


class OutputPathError(ValueError):
    """An output path that cannot hold what a command would write, found before the work."""


def _existing_ancestor(path: Path) -> Path:
    parent = path
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    return parent


def _check_writable_folder(folder: Path, path: Path, flag: str) -> None:
    """``folder`` (an existing ancestor of ``path``) must be a folder this process may create
    files in; ``os.access`` answers for permissions and for read-only mounts (``EROFS``)."""
    if not folder.is_dir():
        raise OutputPathError(f"{path}: {flag} cannot be written ({folder} is a file)")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise OutputPathError(f"{path}: {flag} cannot be written ({folder} is not writable)")


def check_output_file(path: str | Path, flag: str = "--json", example: str = "m.json") -> Path:
    """Refuse an output file that cannot be written (a folder, a file in a file, a folder
    without write permission) before the work whose result it would hold; ``flag`` names the
    option in the one-line error (:class:`OutputPathError`, a ``ValueError``)."""
    path = Path(path)
    if path.is_dir():
        raise OutputPathError(
            f"{path}: {flag} is a folder; expected a file path such as {path / example}"
        )
    if path.exists() and not os.access(path, os.W_OK):
        raise OutputPathError(f"{path}: {flag} cannot be written (the file is read-only)")
    _check_writable_folder(_existing_ancestor(path.parent), path, flag)
    return path


def check_output_dir(path: str | Path, flag: str = "--out") -> Path:
    """Refuse an output folder that is a file, lies under a file, or cannot be written (an
    existing folder without write permission, or a missing one whose nearest existing
    ancestor cannot be written), before any work; :class:`OutputPathError`."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise OutputPathError(f"{path}: {flag} is a file; expected a folder")
    _check_writable_folder(_existing_ancestor(path), path, flag)
    return path


def check_json_path(path: str | Path) -> Path:
    """Refuse a ``--json`` target that cannot be written (:func:`check_output_file`)."""
    return check_output_file(path, "--json", "m.json")


def write_failure(err: BaseException) -> str | None:
    """One line for an ``OSError`` of a failed write (disk full, file size limit, permission,
    read-only file system), naming the file; ``None`` for any other error."""
    if isinstance(err, WriteFailed):
        return str(err)
    if not isinstance(err, OSError) or err.errno not in _WRITE_ERRORS:
        return None
    name = err.filename if err.filename is not None else "a file"
    return f"{name}: cannot write ({_WRITE_ERRORS[err.errno]})"


def write_metrics_json(record: dict[str, Any], path: str | Path) -> Path:
    """Write ``record`` as indented JSON to ``path`` atomically (``vlret eval --json``)."""
    path = check_json_path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return atomic_write_text(path, json.dumps(record, indent=2) + "\n")
