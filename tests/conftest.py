"""Fixtures shared by test files (opt-in: ``pytestmark = pytest.mark.usefixtures(NAME)``)."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="module")
def one_thread():
    """One torch thread for the module: tiny tensors, where thread hand-offs on a loaded
    2-core machine cost more than the work."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
