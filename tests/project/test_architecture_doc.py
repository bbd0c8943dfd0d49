"""docs/architecture.md stays true: every module path and every repository path it names exists,
and every package and public top-level module of src/vlret appears on it."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "architecture.md"
SRC = ROOT / "src" / "vlret"

#: ``vlret.xxx`` dotted names (modules, or a module's attribute), not the ``vlret[extra]`` form.
DOTTED = re.compile(r"\bvlret(?:\.[A-Za-z_][A-Za-z0-9_]*)+")
#: Repository paths the page names (``src/...``, ``tests/...``, ``docs/...`` ...).
REPO_PATH = re.compile(r"\b(?:src|tests|docs|benchmarks|scripts)/[A-Za-z0-9_./-]*[A-Za-z0-9_/]")


def _text() -> str:
    return PAGE.read_text(encoding="utf-8")


def resolve(dotted: str) -> object:
    """The module or attribute ``dotted`` names: the longest importable module prefix, then
    attributes; raise LookupError naming what is missing."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        name = ".".join(parts[:cut])
        try:
            value: object = importlib.import_module(name)
        except ModuleNotFoundError as error:
            if error.name is not None and not name.startswith(error.name):
                raise  # the module exists but one of its own imports is missing
            continue
        for attribute in parts[cut:]:
            if not hasattr(value, attribute):
                raise LookupError(f"{dotted}: {name} has no {attribute!r}")
            value = getattr(value, attribute)
        return value
    raise LookupError(f"{dotted}: no such module")


def _packages() -> list[str]:
    """Every package of src/vlret and every public top-level module, by dotted name."""
    names = [
        "vlret." + ".".join(init.parent.relative_to(SRC).parts)
        for init in SRC.rglob("__init__.py")
        if init.parent != SRC
    ]
    names += [f"vlret.{p.stem}" for p in SRC.glob("*.py") if not p.stem.startswith("_")]
    return sorted(names)


def test_the_patterns_find_what_they_should():
    text = "see `vlret.run.folder`, vlret.losses. and vlret[train]; src/vlret/run/lock.py."
    assert DOTTED.findall(text) == ["vlret.run.folder", "vlret.losses"]
    assert REPO_PATH.findall(text) == ["src/vlret/run/lock.py"]
    with pytest.raises(LookupError, match="vlret.run.nope: no such module|has no 'nope'"):
        resolve("vlret.run.nope")
    with pytest.raises(LookupError, match="vlret.losses has no 'NotALoss'"):
        resolve("vlret.losses.NotALoss")


def test_every_dotted_path_on_the_page_exists():
    names = sorted(set(DOTTED.findall(_text())))
    assert len(names) > 50  # the page names the packages and their main modules
    missing = []
    for name in names:
        try:
            resolve(name)
        except LookupError as error:
            missing.append(str(error))
    assert not missing, missing


def test_every_repository_path_on_the_page_exists():
    paths = sorted(set(REPO_PATH.findall(_text())))
    assert "tests/losses/test_contract.py" in paths
    assert [p for p in paths if not (ROOT / p).exists()] == []


def test_every_package_is_on_the_page():
    names = set(DOTTED.findall(_text()))
    packages = _packages()
    assert {"vlret.run", "vlret.train.procedures.ncr", "vlret.tour"} <= set(packages)
    assert [p for p in packages if p not in names] == []


def test_the_page_is_in_the_site_navigation():
    assert re.search(
        r"^\s+- Architecture: architecture\.md$", (ROOT / "mkdocs.yml").read_text(), re.M
    )
