"""Fixtures shared by test files (opt-in: ``pytestmark = pytest.mark.usefixtures(NAME)``).

The tests sit in folders that mirror ``src/vlret`` (tests/losses, tests/run, tests/train, ...);
the helper modules they share (``train_helpers``, ``fault_helpers``, ...) stay in this folder.
This folder and every test folder under it are put on ``sys.path`` here, as pytest's default
import mode does for the folder of each test file it collects, so a test imports a helper
module, or a function of another test module in another folder, by its bare name (file names
are unique).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

_TESTS = Path(__file__).resolve().parent
_SKIPPED = ("fixtures", "__pycache__")
for _folder in [_TESTS, *sorted(p for p in _TESTS.rglob("*") if p.is_dir())]:
    inside = _folder.relative_to(_TESTS).parts
    if not any(part in _SKIPPED for part in inside) and str(_folder) not in sys.path:
        sys.path.insert(0, str(_folder))


@pytest.fixture(scope="module")
def one_thread():
    """One torch thread for the module: tiny tensors, where thread hand-offs on a loaded
    2-core machine cost more than the work."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
