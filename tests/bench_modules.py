"""Fixtures the tests of a benchmark-backed reference share: ``benchmarks/`` is not a package,
so its modules (the authors' reference loops, ``ref_<kind>.py``) are imported with the folder on
``sys.path`` for the import only; and the tiny tensors of those tests run on one thread."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest
import torch

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def import_benchmark(name: str) -> ModuleType:
    """``benchmarks/<name>.py`` as a module."""
    sys.path.insert(0, str(BENCH))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(BENCH))


def benchmark_fixture(name: str) -> Callable[[], ModuleType]:
    """A module-scoped fixture giving ``benchmarks/<name>.py``."""

    @pytest.fixture(scope="module")
    def module() -> ModuleType:
        return import_benchmark(name)

    return module


def one_thread_fixture() -> Callable[[], Iterator[None]]:
    """An autouse module-scoped fixture running the module's tests on one torch thread (tiny
    tensors: thread hand-offs would cost more than the work on a loaded CPU)."""

    @pytest.fixture(autouse=True, scope="module")
    def one_thread() -> Iterator[None]:
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        yield
        torch.set_num_threads(threads)

    return one_thread
