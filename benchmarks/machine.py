"""What the benchmarks print about the machine and how they summarise repeats (imported by the
scripts beside it, which put this folder on ``sys.path`` when run from anywhere)."""

from __future__ import annotations

import os
import platform
import statistics
import time


def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else what :mod:`platform` knows."""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def load_average() -> str:
    """The 1-minute load average, or ``n/a``."""
    return f"{os.getloadavg()[0]:.1f}" if hasattr(os, "getloadavg") else "n/a"


def timed(fn) -> tuple[float, object]:
    """``(seconds, fn())``."""
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def spread(values: list[float], unit: str = "x", digits: int = 2) -> str:
    """Median, then the range over repeats."""
    med, lo, hi = (f"{v:.{digits}f}" for v in (statistics.median(values), min(values), max(values)))
    return f"{med}{unit} ({lo}-{hi})"
