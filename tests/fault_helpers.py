"""Folders a process cannot write into, for the fault tests, whoever runs them.

``chmod 0o500`` refuses writes to an ordinary user but not to root, who bypasses permission
bits; as root a read-only tmpfs mount refuses them (``EROFS``), as a folder made read-only by
an administrator, a full read-only volume or a remounted disk would. Where neither works (root
without the right to mount) the test is skipped with the reason.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


def _mount(args: list[str]) -> bool:
    return subprocess.run(args, capture_output=True).returncode == 0


@contextlib.contextmanager
def read_only_folder(folder: Path, files: dict[str, bytes] | None = None) -> Iterator[Path]:
    """``folder`` (created, holding ``files``) made unwritable for the block's duration."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in (files or {}).items():
        (folder / name).write_bytes(data)
    if os.geteuid() != 0:
        folder.chmod(0o500)
        try:
            yield folder
        finally:
            folder.chmod(0o700)
        return
    if not _mount(["mount", "-t", "tmpfs", "-o", "size=8m", "vlret-ro", str(folder)]):
        pytest.skip("root without the right to mount a read-only tmpfs")
    try:
        for name, data in (files or {}).items():
            (folder / name).write_bytes(data)
        if not _mount(["mount", "-o", "remount,ro", str(folder)]):
            pytest.skip("root without the right to remount a tmpfs read-only")
        yield folder
    finally:
        _mount(["umount", "-l", str(folder)])


@contextlib.contextmanager
def made_read_only(folder: Path) -> Iterator[None]:
    """Make an existing, populated ``folder`` unwritable from now on (mid-run): as root, the
    folder is bind-mounted read-only over itself; otherwise its permission bits drop."""
    if os.geteuid() != 0:
        folder.chmod(0o500)
        try:
            yield
        finally:
            folder.chmod(0o700)
        return
    if not _mount(["mount", "--bind", str(folder), str(folder)]):
        pytest.skip("root without the right to bind-mount")
    try:
        if not _mount(["mount", "-o", "remount,bind,ro", str(folder)]):
            pytest.skip("root without the right to remount a bind mount read-only")
        yield
    finally:
        _mount(["umount", "-l", str(folder)])
