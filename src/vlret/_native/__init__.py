"""Small C kernels of the core, compiled on first use by the system's C compiler.

A kernel is one C file beside this module (``smooth_rank.c``), written with the compiler's
vector extensions and POSIX threads only (no PyTorch headers, no OpenMP), so it compiles in
well under a second and needs no network. :func:`library` compiles it once per machine and
source into a cache folder, writes the shared object atomically (a temporary file renamed
into place, so concurrent processes never load a half-written one) and loads it with
:mod:`ctypes`. Every caller keeps its PyTorch code as the fallback: :func:`library` returns
``None`` when kernels are switched off, when no compiler is found, or when the compilation
fails (then with one :class:`RuntimeWarning` naming the compiler's message).

Environment:

* ``VLRET_NATIVE=0`` switches the kernels off (the PyTorch code runs).
* ``VLRET_NATIVE_CACHE``: the cache folder (default ``$XDG_CACHE_HOME/vlret/native``, else
  ``~/.cache/vlret/native``).
* ``CC``: the compiler (default ``cc``, then ``gcc``, then ``clang``).

The shared object's name hashes the source, the compiler command and version, and this CPU's
model and feature flags: it is built with ``-march=native``, so a cache folder shared between
machines with different CPUs holds one object per CPU and never runs one on the wrong CPU.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import warnings
from pathlib import Path

_HERE = Path(__file__).resolve().parent
#: The compiler flags, in the order tried: with ``-march=native`` first (the vector width
#: and instructions of this CPU), then without (a compiler that does not know the option).
FLAG_SETS = (
    ("-O3", "-march=native", "-std=gnu11", "-fPIC", "-shared", "-pthread"),
    ("-O3", "-std=gnu11", "-fPIC", "-shared", "-pthread"),
)
_loaded: dict[str, ctypes.CDLL | None] = {}
_why: dict[str, str] = {}


def enabled() -> bool:
    """Whether kernels may be used: ``VLRET_NATIVE`` is not ``0``, ``false``, ``no`` or
    ``off``."""
    return os.environ.get("VLRET_NATIVE", "1").strip().lower() not in ("0", "false", "no", "off")


def cache_dir() -> Path:
    """The folder compiled kernels are kept in (see the module doc)."""
    explicit = os.environ.get("VLRET_NATIVE_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "vlret" / "native"


def compiler() -> str | None:
    """The C compiler's path: ``$CC``, else the first of ``cc``, ``gcc``, ``clang`` found."""
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name:
            found = shutil.which(name)
            if found:
                return found
    return None


def _cpu_identity() -> str:
    """This CPU's model and feature flags (Linux), else what :mod:`platform` knows."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        text = ""
    keep = [
        line.split(":", 1)[1].strip()
        for line in text.splitlines()
        if line.split(":", 1)[0].strip() in ("model name", "flags", "Features", "CPU part")
    ]
    return "|".join(sorted(set(keep))) or f"{platform.machine()}|{platform.processor()}"


def _version(cc: str) -> str:
    try:
        out = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.stdout


def _compile(name: str, source: Path, cc: str) -> Path:
    """Compile ``source`` into the cache (if not there yet) and return the object's path.

    Raises:
        RuntimeError: Every flag set failed; the message holds the compiler's last lines.
    """
    text = source.read_bytes()
    version = _version(cc)
    identity = _cpu_identity()
    folder = cache_dir()
    errors = []
    for flags in FLAG_SETS:
        key = hashlib.sha256(
            b"\0".join(
                [text, cc.encode(), version.encode(), identity.encode(), *map(str.encode, flags)]
            )
        ).hexdigest()[:20]
        target = folder / f"{name}-{key}.so"
        if target.is_file():
            return target
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{name}-", suffix=".so", dir=folder)
        os.close(fd)
        try:
            done = subprocess.run(
                [cc, *flags, str(source), "-o", tmp], capture_output=True, text=True, timeout=300
            )
            if done.returncode == 0:
                os.replace(tmp, target)
                return target
            errors.append(" ".join(flags) + ": " + (done.stderr.strip().splitlines() or [""])[-1])
        except (OSError, subprocess.SubprocessError) as err:
            errors.append(" ".join(flags) + f": {err}")
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    raise RuntimeError(f"{cc} could not compile {source.name}: " + "; ".join(errors))


def library(name: str) -> ctypes.CDLL | None:
    """The kernel ``name`` (``<name>.c`` beside this module) loaded, or ``None``.

    Compiled on the first call in a process when not cached yet; later calls return the same
    object. ``None`` (the caller's PyTorch code runs) when ``VLRET_NATIVE=0``, when no C
    compiler is found, or when the compilation or loading fails; the last two warn once.
    :func:`status` says which.

    Args:
        name: The kernel's file name without ``.c``.

    Raises:
        ValueError: No kernel of that name ships with vlret.
    """
    source = _HERE / f"{name}.c"
    if not source.is_file():
        raise ValueError(f"no native kernel named {name!r} (no {source.name} in {_HERE})")
    if not enabled():
        _why[name] = "switched off by VLRET_NATIVE"
        return None
    if name in _loaded:
        return _loaded[name]
    lib = None
    cc = compiler()
    if cc is None:
        _why[name] = "no C compiler found (set CC, or install cc/gcc/clang)"
    else:
        try:
            path = _compile(name, source, cc)
            lib = ctypes.CDLL(str(path))
            _why[name] = f"compiled by {cc}: {path}"
        except (RuntimeError, OSError) as err:
            _why[name] = f"not available: {err}"
            warnings.warn(
                f"vlret: the native {name} kernel is not available, the PyTorch code runs "
                f"instead ({err})",
                RuntimeWarning,
                stacklevel=2,
            )
    _loaded[name] = lib
    return lib


def status(name: str) -> str:
    """Why :func:`library` returned what it did for ``name`` (empty before its first call)."""
    return _why.get(name, "")


def forget(name: str | None = None) -> None:
    """Drop what :func:`library` remembered (for ``name``, or every kernel), so that the next
    call looks again (after a change of ``VLRET_NATIVE``, ``CC`` or the cache folder)."""
    for table in (_loaded, _why):
        if name is None:
            table.clear()
        else:
            table.pop(name, None)


__all__ = ["FLAG_SETS", "cache_dir", "compiler", "enabled", "forget", "library", "status"]
