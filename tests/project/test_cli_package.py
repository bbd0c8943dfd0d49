"""The command-line package: one module per command with one convention, the shared helpers,
and the old import paths of every name that moved (they warn and return the same object)."""

from __future__ import annotations

import argparse
import importlib
import subprocess
import sys

import pytest

import vlret.cli
from vlret.cli import COMMANDS, build_parser
from vlret.cli._common import EXIT_ERROR, fail, positive_int


def _listed_commands() -> list[str]:
    """The commands ``vlret --help`` lists, read from the parser's sub-command action."""
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return list(sub.choices)


#: The commands of the release before the package (src/vlret/cli.py and its two helpers).
TODAY = (
    "train",
    "eval",
    "import-checkpoint",
    "convert-experts",
    "compare",
    "sweep",
    "synth",
    "demo",
    "losses",
    "configs",
    "plot",
)


def test_every_command_is_one_module_with_the_same_convention():
    names = [module.NAME for module in COMMANDS]
    assert names == _listed_commands()
    assert len(set(names)) == len(names)
    assert set(names) >= set(TODAY)  # a new command adds a module; none of these goes away
    for module in COMMANDS:
        # the module is named after its command (``eval`` too, imported under another name)
        assert module.__name__ == "vlret.cli." + module.NAME.replace("-", "_")
        assert callable(module.add_parser) and callable(module.run)
        parser = argparse.ArgumentParser(prog="vlret")
        sub = parser.add_subparsers(dest="command")
        returned = module.add_parser(sub)
        assert isinstance(returned, argparse.ArgumentParser)
        assert list(sub.choices) == [module.NAME]
        assert returned.get_default("func") is module.run


def test_importing_the_cli_imports_no_harness_package():
    """The command modules import what they run inside ``run``: importing the package (the
    console script's first step) loads neither the trainer nor the data formats."""
    code = (
        "import sys, vlret.cli; "
        "print(sorted(m for m in sys.modules if m.startswith(('vlret.train', 'vlret.data', "
        "'vlret.analysis', 'vlret.demo', 'vlret.tour'))))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert proc.stdout.strip() == "[]"


def test_fail_prints_one_line_and_returns_the_error_status(capsys):
    assert fail("synth", ValueError("out: not a folder")) == EXIT_ERROR == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == "vlret synth: out: not a folder\n"


@pytest.mark.parametrize("text", ["0", "-3", "1.5", "two", ""])
def test_positive_int_refuses_what_is_not_a_positive_integer(text):
    with pytest.raises(argparse.ArgumentTypeError, match=f"got {text!r}"):
        positive_int(text)


def test_positive_int_reads_positive_integers():
    assert [positive_int(t) for t in ("1", "7", "120")] == [1, 7, 120]


def test_a_bad_positive_int_is_a_usage_error_naming_the_option(capsys):
    with pytest.raises(SystemExit) as exc:
        vlret.cli.main(["demo", "--preset", "tiny", "--epochs", "0"])
    assert exc.value.code == 2
    assert "argument --epochs: expected a positive integer, got '0'" in capsys.readouterr().err


#: Old path -> the module that holds the name now (and its name there).
MOVED = [
    ("vlret.data.cli", "add_synth_parser", "vlret.cli.synth", "add_parser"),
    ("vlret.data.cli", "add_convert_parser", "vlret.cli.convert_experts", "add_parser"),
    (
        "vlret.run.import_checkpoint",
        "add_import_parser",
        "vlret.cli.import_checkpoint",
        "add_parser",
    ),
    ("vlret.run.config", "parse_value", "vlret.run.config_files", "parse_value"),
    ("vlret.run.config", "read_config_file", "vlret.run.config_files", "read_config_file"),
    ("vlret.demo", "loss_rows", "vlret.tour", "loss_rows"),
    ("vlret.demo", "run_demo", "vlret.tour", "run_demo"),
    ("vlret.data.precomp", "RetrievalBatch", "vlret.data.dataset", "RetrievalBatch"),
    ("vlret.data.precomp", "RetrievalItem", "vlret.data.dataset", "RetrievalItem"),
    ("vlret.data.precomp", "collate_retrieval", "vlret.data.dataset", "collate_retrieval"),
    ("vlret.data.precomp", "pad_captions", "vlret.data.dataset", "pad_captions"),
    ("vlret.data.precomp", "stack_features", "vlret.data.dataset", "stack_features"),
    ("vlret.data.precomp", "check_features", "vlret.data.dataset", "check_features"),
    ("vlret.data.precomp", "ImageView", "vlret.data.dataset", "ImageView"),
    ("vlret.data.precomp", "CaptionView", "vlret.data.dataset", "CaptionView"),
    ("vlret.data.precomp", "NonFinite", "vlret.data.checks", "NonFinite"),
    ("vlret.data.precomp", "ExpertBatch", "vlret.data.expert_batch", "ExpertBatch"),
]


@pytest.mark.parametrize(("old", "name", "new", "new_name"), MOVED)
def test_an_old_import_path_warns_and_gives_the_same_object(old, name, new, new_name):
    module = importlib.import_module(old)
    with pytest.warns(DeprecationWarning, match=rf"{old}\.{name} is deprecated.*{new}"):
        value = getattr(module, name)
    assert value is getattr(importlib.import_module(new), new_name)


def test_an_old_from_import_warns_too():
    with pytest.warns(DeprecationWarning, match="vlret.data.precomp.RetrievalBatch"):
        from vlret.data.precomp import RetrievalBatch
    from vlret.data import RetrievalBatch as public

    assert RetrievalBatch is public


@pytest.mark.parametrize("old", ["vlret.data.cli", "vlret.demo", "vlret.data.precomp"])
def test_an_unknown_name_of_a_module_with_moved_names_is_an_attribute_error(old):
    module, name = importlib.import_module(old), "nope"
    with pytest.raises(AttributeError, match=f"module '{old}' has no attribute 'nope'"):
        getattr(module, name)


def test_the_public_names_of_vlret_data_and_vlret_train_do_not_warn():
    code = (
        "import warnings; warnings.simplefilter('error', DeprecationWarning); "
        "import vlret.data, vlret.train, vlret.cli, vlret.demo; "
        "from vlret.data import *; from vlret.train import *; "
        "from vlret.data.precomp import *; vlret.cli.build_parser(); print('ok')"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "ok"
