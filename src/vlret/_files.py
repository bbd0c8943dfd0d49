"""Atomic file writes for every file a run leaves behind (checkpoints, configs, vocabularies,
tables): a temporary file in the same folder, fsync, rename, with SIGINT / SIGTERM held back
while the write is in flight.

A reader, or a run killed with SIGKILL mid-write, sees either the previous file or the new one,
never a truncated file. A kill can leave the temporary file (``.NAME.XXXX.tmp``) behind:
:func:`remove_stale_temporaries` clears those when the next run starts in the folder.

The output-path rule (docs/training.md, "Output and input paths"), enforced twice: up front by
:func:`check_output_file` (before any work, with the command's ``--overwrite``) and again by
:func:`atomic_write` itself just before its rename, so no caller can forget it. A rename puts a
new regular file in place of whatever the path names, so an existing path that is not a
regular file is refused: a device (``/dev/full``), a FIFO, a socket, a folder, and every
symbolic link, whatever it leads to (renaming over a link replaces the link, never the file it
leads to; give the path it leads to instead). A folder on the way to the path may be a link.
"""

from __future__ import annotations

import contextlib
import errno
import glob
import json
import os
import signal
import stat
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

    An existing ``path`` that is not a regular file (a device, FIFO, socket, folder or any
    symbolic link) is refused with :class:`OutputPathError`, before ``write`` and again just
    before the rename (:func:`refuse_non_regular`). The file gets the permissions an ordinary
    ``open(path, "w")`` would (``0o666 & ~umask``).
    On any error the temporary file is removed and ``path`` is left as it was; a disk that is
    full, a file size limit (``RLIMIT_FSIZE``) or a permission refused is raised as
    :class:`WriteFailed` naming ``path``, whatever the writer turned the ``OSError`` into.
    """
    path = Path(path)
    refuse_non_regular(path)  # before the work of ``write``
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
            refuse_non_regular(path)  # again: what the path names may have changed meanwhile
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
    """An output path that cannot hold what a command would write, found before the work (or,
    by :func:`atomic_write`, before the rename that would replace something not a file)."""


def file_kind(mode: int) -> str | None:
    """What a non-regular file is, in a user's words (None: a regular file)."""
    if stat.S_ISREG(mode):
        return None
    for test, name in (
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def refuse_non_regular(path: str | Path, flag: str | None = None) -> None:
    """Raise :class:`OutputPathError` when ``path`` exists and is not a regular file (read with
    ``lstat``, so a symbolic link is refused whatever it leads to); a missing path passes.

    The one line names the path, ``flag`` (the option it came from, when given), what the
    path is, and what to do instead."""
    path = Path(path)
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    except NotADirectoryError:  # a file on the way: the write names it
        return
    kind = file_kind(mode)
    if kind is None:
        return
    named = f"{path}: {flag} is" if flag else f"{path}: is"
    if stat.S_ISLNK(mode):
        try:
            target = os.readlink(path)
        except OSError:  # pragma: no cover - a link that vanished meanwhile
            target = "?"
        raise OutputPathError(
            f"{named} a symbolic link (to {target}); vlret writes a new file and renames it "
            "into place, which would replace the link: give the path it leads to, or remove "
            "the link"
        )
    raise OutputPathError(
        f"{named} {kind}, not a regular file; vlret writes a new file and renames it into "
        "place, which would replace it: give a file path"
    )


def refuse_non_regular_inside(folder: str | Path) -> None:
    """The output-path rule for a command that writes plain files into an existing folder
    (``vlret synth --overwrite``): :class:`OutputPathError` naming the first symbolic link,
    device, FIFO or socket found anywhere under ``folder`` (links are not followed), which a
    write into the folder would go through or replace."""
    for top, dirs, files in os.walk(folder):  # followlinks=False: a linked folder is listed
        for name in sorted(dirs) + sorted(files):
            path = Path(top) / name
            mode = os.lstat(path).st_mode
            if stat.S_ISDIR(mode):
                continue
            kind = file_kind(mode)
            if kind is not None:
                raise OutputPathError(
                    f"{path}: is {kind}, inside {folder}, which this command writes into; "
                    "vlret would write through it or replace it: remove it, or choose another "
                    "folder"
                )


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


def check_output_file(
    path: str | Path,
    flag: str = "--json",
    example: str = "m.json",
    *,
    overwrite: bool | None = None,
) -> Path:
    """The output-path rule of every command (module docstring), checked before the work whose
    result ``path`` would hold; ``flag`` names the option in the one-line error
    (:class:`OutputPathError`, a ``ValueError``).

    Refused: a folder, a symbolic link, a device, FIFO or socket (:func:`refuse_non_regular`),
    a read-only file, a path under a file or in a folder without write permission, and, when
    ``overwrite`` is False, an existing file (``--overwrite`` replaces it). ``overwrite=None``
    leaves an existing regular file to the caller (a writer with its own rule)."""
    path = Path(path)
    if path.is_dir() and not path.is_symlink():
        raise OutputPathError(
            f"{path}: {flag} is a folder; expected a file path such as {path / example}"
        )
    refuse_non_regular(path, flag)
    if path.exists() and not os.access(path, os.W_OK):
        raise OutputPathError(f"{path}: {flag} cannot be written (the file is read-only)")
    if path.exists() and overwrite is False:
        raise OutputPathError(f"{path}: {flag} exists; pass --overwrite to replace it")
    _check_writable_folder(_existing_ancestor(path.parent), path, flag)
    return path


def check_output_dir(
    path: str | Path,
    flag: str = "--out",
    *,
    files: Iterable[str] = (),
    overwrite: bool | None = None,
) -> Path:
    """Refuse an output folder that is a file, lies under a file, or cannot be written (an
    existing folder without write permission, or a missing one whose nearest existing
    ancestor cannot be written), before any work; :class:`OutputPathError`.

    The folder itself may be a symbolic link to a folder (vlret writes inside it, never over
    it). ``files``: the names the command writes in it, each held to :func:`check_output_file`'s
    rule (with ``overwrite``: an existing one is refused unless it is True)."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        kind = file_kind(os.stat(path).st_mode) or "a file"
        raise OutputPathError(f"{path}: {flag} is {kind}; expected a folder")
    _check_writable_folder(_existing_ancestor(path), path, flag)
    for name in files:
        target = path / name
        if overwrite is False and target.is_file() and not target.is_symlink():
            raise OutputPathError(
                f"{path}: {flag} holds {name} already; pass --overwrite to replace it"
            )
        check_output_file(target, flag, name, overwrite=overwrite)
    return path


def check_json_path(path: str | Path, *, overwrite: bool | None = None) -> Path:
    """Refuse a ``--json`` target that cannot be written (:func:`check_output_file`)."""
    return check_output_file(path, "--json", "m.json", overwrite=overwrite)


def write_failure(err: BaseException) -> str | None:
    """One line for an ``OSError`` of a failed write (disk full, file size limit, permission,
    read-only file system), naming the file; ``None`` for any other error."""
    if isinstance(err, WriteFailed):
        return str(err)
    if not isinstance(err, OSError) or err.errno not in _WRITE_ERRORS:
        return None
    name = err.filename if err.filename is not None else "a file"
    return f"{name}: cannot write ({_WRITE_ERRORS[err.errno]})"


def write_metrics_json(
    record: dict[str, Any], path: str | Path, *, overwrite: bool | None = None
) -> Path:
    """Write ``record`` as indented JSON to ``path`` atomically (``vlret eval --json``)."""
    path = check_json_path(path, overwrite=overwrite)
    path.parent.mkdir(parents=True, exist_ok=True)
    return atomic_write_text(path, json.dumps(record, indent=2) + "\n")
