"""Atomic file writes for every file a run leaves behind (checkpoints, configs, vocabularies,
tables): a temporary file in the same folder, fsync, rename, with SIGINT / SIGTERM held back
while the write is in flight.

A reader, or a run killed with SIGKILL mid-write, sees either the previous file or the new one,
never a truncated file. A kill can leave the temporary file (``.NAME.XXXX.tmp``) behind:
:func:`remove_stale_temporaries` clears those when the next run starts in the folder.
"""

from __future__ import annotations

import contextlib
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


def atomic_write(path: str | Path, write: Callable[[BinaryIO], object]) -> Path:
    """Call ``write(fh)`` on a temporary file next to ``path``, then rename it over ``path``.

    The file gets the permissions an ordinary ``open(path, "w")`` would (``0o666 & ~umask``).
    On any error the temporary file is removed and ``path`` is left as it was.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with signals_deferred():
        fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as fh:
                write(fh)
                fh.flush()
                os.fsync(fh.fileno())
            os.chmod(tmp_name, 0o666 & ~_umask())
            os.replace(tmp_name, path)
        except BaseException:
            Path(tmp_name).unlink(missing_ok=True)
            raise
    _fsync_dir(path.parent)
    return path


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


def check_json_path(path: str | Path) -> Path:
    """Refuse a ``--json`` target that cannot be written (a folder, a file in a file)."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{path}: --json is a folder; expected a file path such as {path}/m.json")
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise ValueError(f"{path}: --json cannot be written ({parent} is a file)")
    return path


def write_metrics_json(record: dict[str, Any], path: str | Path) -> Path:
    """Write ``record`` as indented JSON to ``path`` atomically (``vlret eval --json``)."""
    path = check_json_path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return atomic_write_text(path, json.dumps(record, indent=2) + "\n")
