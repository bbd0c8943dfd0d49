"""Fail when a file of the package that git tracks is missing from the built wheel (or sdist).

    python scripts/check_wheel.py dist/vlret-X-py3-none-any.whl [--sdist dist/vlret-X.tar.gz]

Every file git tracks under ``src/vlret`` (modules, the shipped configs, ``py.typed``, any other
package data) must be in the wheel at the same path below ``vlret/`` (its RECORD must list it
too) and, with ``--sdist``, in the sdist under ``src/vlret``. A file under ``src/vlret`` that the
wheel lacks is a user's ``ModuleNotFoundError`` or a missing paper config; the script lists each
missing one and exits 1. Files the wheel has and git does not track are listed as a note only
(an untracked file in the working tree goes into a local build). Run from anywhere: the tracked
files are read with ``git ls-files`` in ``--repo`` (default: this script's checkout).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Iterable
from pathlib import Path

PACKAGE = "vlret"
#: The package's folder in the source tree, relative to the repository root.
SOURCE = f"src/{PACKAGE}"


def tracked_files(repo: Path, source: str = SOURCE) -> list[str]:
    """The files git tracks under ``repo/source``, as paths relative to ``source``'s parent
    (``vlret/losses/__init__.py``), i.e. as a wheel names them."""
    out = subprocess.run(
        ["git", "-C", str(repo), "ls-files", "-z", "--", source],
        capture_output=True,
        check=True,
    ).stdout.decode()
    parent = source.rpartition("/")[0]
    prefix = f"{parent}/" if parent else ""
    files = [f for f in out.split("\0") if f]
    return sorted(f[len(prefix) :] for f in files if f.startswith(prefix))


def wheel_files(wheel: Path) -> tuple[set[str], set[str]]:
    """(the wheel's member names, the paths its ``*.dist-info/RECORD`` lists)."""
    with zipfile.ZipFile(wheel) as zf:
        names = {n for n in zf.namelist() if not n.endswith("/")}
        records = [n for n in names if n.endswith(".dist-info/RECORD")]
        record: set[str] = set()
        for name in records:
            for line in zf.read(name).decode("utf-8").splitlines():
                if line.strip():
                    record.add(line.rsplit(",", 2)[0])
    return names, record


def sdist_files(sdist: Path) -> set[str]:
    """The sdist's member names without the leading ``NAME-VERSION/`` folder."""
    with tarfile.open(sdist) as tf:
        return {m.name.partition("/")[2] for m in tf.getmembers() if m.isfile()}


def missing(expected: Iterable[str], present: Iterable[str]) -> list[str]:
    """The expected paths that ``present`` lacks, sorted."""
    have = set(present)
    return sorted(p for p in expected if p not in have)


def check(repo: Path, wheel: Path, sdist: Path | None = None) -> list[str]:
    """Every problem found, one line each; empty when the wheel (and sdist) hold every tracked
    file of the package."""
    expected = tracked_files(repo)
    if not expected:
        return [f"git tracks no file under {repo / SOURCE}"]
    problems: list[str] = []
    names, record = wheel_files(wheel)
    problems += [f"missing from the wheel {wheel.name}: {p}" for p in missing(expected, names)]
    problems += [
        f"missing from the wheel's RECORD: {p}"
        for p in missing(expected, record)
        if p in names  # a file absent altogether is reported once, above
    ]
    if sdist is not None:
        in_sdist = sdist_files(sdist)
        wanted = [f"src/{p}" for p in expected]
        problems += [f"missing from the sdist {sdist.name}: {p}" for p in missing(wanted, in_sdist)]
    return problems


def untracked_in_wheel(repo: Path, wheel: Path) -> list[str]:
    """The wheel's files below ``vlret/`` that git does not track (a note, not a failure)."""
    expected = set(tracked_files(repo))
    names, _ = wheel_files(wheel)
    return sorted(n for n in names if n.startswith(f"{PACKAGE}/") and n not in expected)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("wheel", type=Path, help="the built wheel (.whl)")
    parser.add_argument("--sdist", type=Path, help="the built sdist (.tar.gz), checked too")
    parser.add_argument(
        "--repo",
        type=Path,
        default=Path(__file__).resolve().parents[1],
        help="the git checkout whose tracked files are expected (default: this script's)",
    )
    args = parser.parse_args(argv)
    problems = check(args.repo, args.wheel, args.sdist)
    for line in untracked_in_wheel(args.repo, args.wheel):
        print(f"note: in the wheel but not tracked by git: {line}")
    if problems:
        for line in problems:
            print(f"check_wheel: {line}", file=sys.stderr)
        print(f"check_wheel: FAILED, {len(problems)} problem(s)", file=sys.stderr)
        return 1
    count = len(tracked_files(args.repo))
    built = f"{args.wheel.name} and {args.sdist.name}" if args.sdist else args.wheel.name
    print(f"check_wheel: all {count} tracked files of {SOURCE} are in {built}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
