"""The command-line package: one module per command with one convention and the shared
helpers; importing the public names of the packages warns about nothing."""

from __future__ import annotations

import argparse
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


def test_the_public_names_of_vlret_data_and_vlret_train_do_not_warn():
    code = (
        "import warnings; warnings.simplefilter('error', DeprecationWarning); "
        "import vlret.data, vlret.train, vlret.cli, vlret.demo; "
        "from vlret.data import *; from vlret.train import *; "
        "from vlret.data.formats.precomp import *; from vlret.losses import *; "
        "from vlret.run import *; vlret.cli.build_parser(); print('ok')"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "ok"
