"""The console script: --help, demo, losses, and the module entry point."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from vlret.cli import main
from vlret.demo import loss_rows


def test_help_and_version(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    assert "demo" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    line = capsys.readouterr().out.strip()
    import torch

    import vlret

    device = "cuda (" if torch.cuda.is_available() else "cpu ("
    assert line.startswith(f"vlret {vlret.__version__} (torch {torch.__version__}, device {device}")


def test_the_version_is_single_sourced_in_the_package():
    """pyproject.toml declares no version of its own: the build reads vlret.__version__."""
    import importlib.metadata

    import vlret

    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib

    project = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    assert "version" not in project["project"]
    assert "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "vlret.__version__"}
    assert importlib.metadata.version("vlret") == vlret.__version__  # the installed metadata


def test_losses_lists_registry(capsys):
    assert main(["losses"]) == 0
    out = capsys.readouterr().out
    for name in ("triplet", "infonce", "unified"):
        assert name in out
    assert "gamma=60.0" in out


def test_demo_rows_cover_every_loss():
    from vlret.losses import available_losses

    rows = loss_rows(batch_size=16, dim=8)
    assert [r[0] for r in rows] == available_losses()
    for _, value, grad in rows:
        assert value == value and value >= 0 and grad > 0


def test_python_dash_m():
    out = subprocess.run(
        [sys.executable, "-m", "vlret", "--help"], capture_output=True, text=True, check=True
    )
    assert "usage: vlret" in out.stdout
