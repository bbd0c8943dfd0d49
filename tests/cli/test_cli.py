"""The console script: --help, demo, losses, and the module entry point."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from vlret.cli import main
from vlret.tour import loss_rows


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

    project = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
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
    from vlret.losses import available_losses, loss_capabilities

    rows = loss_rows(batch_size=16, dim=8)
    # every loss that scores embeddings (mlm scores an encoder's masked tokens: test_demo.py)
    embedding_losses = [n for n in available_losses() if not loss_capabilities(n).masked_language]
    assert [r[0] for r in rows] == embedding_losses
    for _, value, grad in rows:
        assert value == value and value >= 0 and grad > 0


def test_python_dash_m():
    out = subprocess.run(
        [sys.executable, "-m", "vlret", "--help"], capture_output=True, text=True, check=True
    )
    assert "usage: vlret" in out.stdout


def test_configs_lists_shows_and_copies_the_shipped_configs(capsys, tmp_path):
    from vlret.configs import shipped_configs

    shipped = shipped_configs()
    assert {"adacl_coco", "vsepp_butd_f30k_triplet", "synth_f30k_compare", "demo_small"} <= set(
        shipped
    )
    assert main(["configs"]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.strip()]
    listed = {ln.split()[0]: ln for ln in lines[:-1]}
    assert listed.keys() == shipped.keys()
    assert (
        "AdaCL paper 4.1" in listed["adacl_coco"]
        and "[loss adacl; data precomp]" in listed["adacl_coco"]
    )
    assert main(["configs", "show", "clip_unified_f30k"]) == 0
    assert capsys.readouterr().out == shipped["clip_unified_f30k"].read_text()
    assert main(["configs", "copy", "clip_unified_f30k", str(tmp_path / "mine")]) == 0
    copied = tmp_path / "mine" / "clip_unified_f30k.toml"
    assert copied.read_text() == shipped["clip_unified_f30k"].read_text()
    copied.write_text("# edited\n")
    assert main(["configs", "copy", "clip_unified_f30k", str(tmp_path / "mine")]) == 2
    assert copied.read_text() == "# edited\n"  # never replaced
    assert main(["configs", "show", "no_such_config"]) == 2
    assert "vlret configs" in capsys.readouterr().err


def test_a_shipped_config_loads_by_name_and_a_local_file_wins(tmp_path, monkeypatch):
    from vlret.run import load_config

    monkeypatch.chdir(tmp_path)
    for name in ("adacl_coco", "adacl_coco.toml"):
        assert load_config(name).loss.name == "adacl"
    # a path is only that file: a missing one never trains the shipped config of its stem
    with pytest.raises(FileNotFoundError, match="give its bare name: adacl_coco"):
        load_config("configs/adacl_coco.toml")
    local = tmp_path / "configs" / "adacl_coco.toml"
    local.parent.mkdir()
    text = (Path(__file__).parents[2] / "src/vlret/configs/adacl_coco.toml").read_text()
    local.write_text(text.replace('"runs/adacl_coco"', '"runs/local_copy"', 1))
    assert str(load_config("configs/adacl_coco.toml").output_dir).endswith("local_copy")
    assert str(load_config("adacl_coco").output_dir).endswith("adacl_coco")  # a name: shipped
    with pytest.raises(FileNotFoundError, match="vlret configs"):
        load_config("no_such_config")
    with pytest.raises(FileNotFoundError):
        load_config("elsewhere/adacl_coco.toml")  # another folder is a path, not a name
