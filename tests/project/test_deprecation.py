"""Deprecated names: each package lists its own in one ``deprecated`` module (vlret._deprecation),
an old name warns with its replacement and removal version and gives the replacement's value,
and the shims of names 0.1.0 never exported are gone."""

from __future__ import annotations

import ast
import importlib
import pkgutil
import warnings
from pathlib import Path

import pytest

import vlret
from vlret._deprecation import OldName, module_getattr


def _deprecation_modules() -> list[str]:
    """Every ``vlret.**.deprecated`` module, found by walking the package."""
    return sorted(
        info.name
        for info in pkgutil.walk_packages(vlret.__path__, prefix="vlret.")
        if info.name.rsplit(".", 1)[-1] == "deprecated"
    )


def _old_names() -> list[OldName]:
    return [old for m in _deprecation_modules() for old in importlib.import_module(m).OLD_NAMES]


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))


def _resolve(dotted: str) -> object:
    """The object a dotted path names: the longest importable module prefix, then attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            value: object = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attribute in parts[cut:]:
            value = getattr(value, attribute)
        return value
    raise AssertionError(f"{dotted} names no module")


def test_the_packages_with_deprecations_each_have_one_module():
    assert _deprecation_modules() == [
        "vlret.data.deprecated",
        "vlret.losses.deprecated",
        "vlret.train.deprecated",
    ]


@pytest.mark.parametrize("old", _old_names(), ids=lambda old: f"{old.module}.{old.name}")
def test_an_old_name_warns_and_gives_its_replacement(old):
    package = importlib.import_module(old.module)
    assert hasattr(package, "__path__"), "old names are served by a package, not a module"
    assert _version(old.removed_in) > _version(vlret.__version__)
    with pytest.warns(DeprecationWarning) as record:
        value = getattr(package, old.name)
    assert [str(w.message) for w in record] == [
        f"{old.module}.{old.name} is deprecated and will be removed in {old.removed_in}; "
        f"use {old.replacement}"
    ]
    assert record[0].filename == __file__  # the warning points at the caller
    if old.replacement.endswith("()"):  # a computed table: what calling the new API gives
        new = _resolve(old.replacement[:-2])()
        # an old table of constraints holds a part of the new one (GOAL_PARAMS: no normalize)
        assert value.items() <= new.items() if isinstance(value, dict) else value == new
    else:
        assert value is _resolve(old.replacement)
    assert old.name not in getattr(package, "__all__", ())  # a star import never warns


def test_the_0_1_0_names_of_vlret_train_are_the_runs_now():
    import vlret.run
    import vlret.train
    from vlret.eval import protocol_names
    from vlret.train.deprecated import MOVED_TO_RUN

    assert set(MOVED_TO_RUN) <= set(vlret.run.__all__)
    with pytest.warns(DeprecationWarning, match="use vlret.run.TrainConfig"):
        from vlret.train import TrainConfig
    assert TrainConfig is vlret.run.TrainConfig
    with pytest.warns(DeprecationWarning, match=r"use vlret\.eval\.protocol_names\(\)"):
        assert vlret.train.PROTOCOLS == protocol_names()
    with pytest.raises(AttributeError, match="module 'vlret.train' has no attribute 'nope'"):
        vlret.train.nope  # noqa: B018


def test_the_0_1_0_synthetic_names_are_the_worlds_now():
    import vlret.worlds
    from vlret.data.deprecated import SYNTHETIC_NAMES

    assert set(SYNTHETIC_NAMES) <= set(vlret.worlds.__all__)
    with pytest.warns(DeprecationWarning, match="use vlret.worlds.generate_world"):
        from vlret.data.synthetic import generate_world
    assert generate_world is vlret.worlds.generate_world
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("vlret.data.synthetic.io")  # module paths were never API


def test_module_getattr_serves_only_its_own_modules_entries():
    entries = (
        OldName(module="pkg", name="Old", replacement="x.New", removed_in="9.0", target="math:pi"),
        OldName(module="other", name="Gone", replacement="y", removed_in="9.0", compute=list),
    )
    getter = module_getattr("pkg", entries)
    with pytest.warns(DeprecationWarning, match=r"pkg\.Old is deprecated .* in 9\.0; use x\.New"):
        assert getter("Old") == pytest.approx(3.14159265)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(AttributeError, match="module 'pkg' has no attribute 'Gone'"):
            getter("Gone")


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({}, "give exactly one of target and compute"),
        ({"target": "math:pi", "compute": list}, "give exactly one of target and compute"),
        ({"target": "math.pi"}, "target must read 'module:attribute', got 'math.pi'"),
    ],
)
def test_an_old_name_needs_one_place_to_find_its_value(fields, message):
    with pytest.raises(ValueError, match=f"pkg.Old: {message}"):
        OldName(module="pkg", name="Old", replacement="New", removed_in="9.0", **fields)


@pytest.mark.parametrize(
    ("module", "name"),
    [
        # moved after 0.1.0 (these paths never held them in a release)
        ("vlret.demo", "run_demo"),
        ("vlret.demo", "loss_rows"),
        ("vlret.run.import_checkpoint", "add_import_parser"),
        ("vlret.data.formats.precomp", "ExpertBatch"),
        ("vlret.data.formats.precomp", "stack_features"),
        # in precomp.py's __all__ in 0.1.0 but documented as vlret.data's (still there) or
        # internal views; the module-level paths go
        ("vlret.data.formats.precomp", "RetrievalBatch"),
        ("vlret.data.formats.precomp", "CaptionView"),
        ("vlret.data.formats.precomp", "NonFinite"),
    ],
)
def test_shims_of_names_no_release_exported_are_gone(module, name):
    with pytest.raises(AttributeError, match=f"has no attribute '{name}'"):
        getattr(importlib.import_module(module), name)


def test_the_shim_only_modules_are_gone():
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("vlret.data.cli")
    from vlret.cli import convert_experts, synth
    from vlret.data import RetrievalBatch, collate_retrieval

    assert callable(synth.add_parser) and callable(convert_experts.add_parser)
    assert RetrievalBatch.__module__ == "vlret.data.dataset"
    assert collate_retrieval.__module__ == "vlret.data.dataset"


#: The modules that may raise a DeprecationWarning: the mechanism of the ``deprecated`` modules,
#: and the renamed keyword parameters of a loss (``Params.renamed``; VSL's pure functions).
WARNERS = {"_deprecation.py", "losses/params.py", "losses/vsl_rank.py"}


def _source_files() -> dict[str, ast.Module]:
    root = Path(vlret.__file__).parent
    return {p.relative_to(root).as_posix(): ast.parse(p.read_text()) for p in root.rglob("*.py")}


def test_no_module_keeps_a_shim_of_its_own():
    sources = _source_files()
    warners = {
        name
        for name, tree in sources.items()
        for node in ast.walk(tree)
        if isinstance(node, ast.Name) and node.id == "DeprecationWarning"
    }
    assert warners == WARNERS
    # a module-level __getattr__ serves old names: only a package's, from its deprecated module
    getattrs = {
        name
        for name, tree in sources.items()
        for node in tree.body
        if (isinstance(node, ast.FunctionDef) and node.name == "__getattr__")
        or (
            isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "__getattr__" for t in node.targets)
        )
    }
    assert getattrs == {
        "data/synthetic/__init__.py",
        "losses/__init__.py",
        "losses/goal/__init__.py",
        "losses/adacl/__init__.py",
        "train/__init__.py",
    }
    assert not (Path(vlret.__file__).parent / "_moved.py").exists()
