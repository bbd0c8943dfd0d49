"""``vlret train CONFIG --check`` / ``--check-config`` (vlret.train.run_check): the run's own
checks, the start-of-run summary, and nothing written."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from train_helpers import tiny_data, tiny_raw
from vlret.cli import main
from vlret.run import ConfigError, config_from_dict
from vlret.run.lock import RunFolderLocked, acquire_run_lock
from vlret.train import check_config, check_run, train
from vlret.train.run_check import CHECK_PASSED, CONFIG_PASSED

QUICK = {"epochs": 1, "validate": False}


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return tiny_data(tmp_path_factory.mktemp("data"))


def _config_file(folder: Path, data: Path, out: Path, **train) -> Path:
    raw = tiny_raw(data, out)
    raw["train"].update(QUICK, **train)
    path = folder / "run.yaml"
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    return path


def _tree(root: Path) -> dict[str, tuple[int, int]]:
    """Every path under ``root`` with its size and modification time (ns)."""
    out = {}
    for path in sorted(root.rglob("*")):
        st = path.lstat()
        out[str(path.relative_to(root))] = (st.st_size, st.st_mtime_ns)
    return out


def _one_line(err: str) -> str:
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


def test_check_prints_the_run_summary_and_writes_nothing(tmp_path, data, capsys):
    out = tmp_path / "runs" / "exp"
    cfg = _config_file(tmp_path, data, out)
    before = _tree(tmp_path)
    data_before = _tree(data)
    assert main(["train", str(cfg), "--check"]) == 0
    checked = capsys.readouterr().out.splitlines()
    assert _tree(tmp_path) == before  # no run folder, lock, config.yaml or checkpoint
    assert _tree(data) == data_before
    assert not (tmp_path / "runs").exists()
    assert checked[-1] == CHECK_PASSED
    # the summary is the one the real run prints first
    assert main(["train", str(cfg)]) == 0
    run_lines = capsys.readouterr().out.splitlines()
    summary = checked[:-1]
    assert summary[0].startswith("run: device cpu, 1 process")
    assert run_lines[: len(summary)] == summary
    assert f"  output: {out}" in summary
    assert (out / "last.pt").is_file()


def test_check_config_reads_no_data(tmp_path, capsys):
    cfg = _config_file(tmp_path, tmp_path / "nowhere", tmp_path / "out")
    assert main(["train", str(cfg), "--check-config"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1] == CONFIG_PASSED
    assert f"  data: precomp at {tmp_path / 'nowhere'} (not read)" in lines
    # --check reads the data and names the key
    assert main(["train", str(cfg), "--check"]) == 2
    line = _one_line(capsys.readouterr().err)
    assert line.startswith(f"vlret train: {cfg}: data.root: {tmp_path / 'nowhere'}: no such folder")
    assert list(tmp_path.iterdir()) == [cfg]


def test_a_warm_up_longer_than_a_shortened_run_is_a_config_error(tmp_path, data, capsys):
    """The cosine schedule's warm-up against train.max_steps_per_epoch: found by the config
    alone, naming the keys to change (before: only at the first step, after the summary)."""
    cfg = _config_file(tmp_path, data, tmp_path / "out", max_steps_per_epoch=2)
    sets = ["optim.schedule=cosine", "optim.decay_epochs=[]", "optim.warmup_steps=20"]
    args = ["train", str(cfg), *(a for s in sets for a in ("--set", s))]
    for flag in ("--check-config", "--check", None):
        assert main([*args, flag] if flag else args) == 2
        line = _one_line(capsys.readouterr().err)
        assert line == (
            f"vlret train: {cfg}: optim.warmup_steps: 20 must be below the run's 2 steps with "
            "optim.schedule = 'cosine' (train.epochs 1 x train.max_steps_per_epoch 2); set "
            "optim.warmup_steps below 2, or raise train.epochs or train.max_steps_per_epoch"
        )
    assert not (tmp_path / "out").exists()


def test_a_warm_up_longer_than_the_data_is_found_by_check_only(tmp_path, data, capsys):
    """Without max_steps_per_epoch the steps come from the data: --check-config cannot know,
    --check counts them as the run does (40 captions, batch 8: five steps)."""
    cfg = _config_file(tmp_path, data, tmp_path / "out")
    sets = ["optim.schedule=cosine", "optim.decay_epochs=[]", "optim.warmup_steps=5"]
    args = ["train", str(cfg), *(a for s in sets for a in ("--set", s))]
    assert main([*args, "--check-config"]) == 0
    capsys.readouterr()
    assert main([*args, "--check"]) == 2
    line = _one_line(capsys.readouterr().err)
    assert "optim.warmup_steps: 5 must be below the run's 5 steps" in line
    assert "(train.epochs 1 x 5 steps per epoch); set optim.warmup_steps below 5" in line
    assert not (tmp_path / "out").exists()


def test_check_refuses_a_folder_with_another_run_unless_overwrite(tmp_path, data, capsys):
    out = tmp_path / "out"
    cfg = _config_file(tmp_path, data, out)
    assert main(["train", str(cfg)]) == 0
    capsys.readouterr()
    before = _tree(tmp_path)
    assert main(["train", str(cfg), "--check"]) == 2
    assert "holds another run" in _one_line(capsys.readouterr().err)
    assert main(["train", str(cfg), "--check", "--overwrite"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == CHECK_PASSED
    # resuming reads the checkpoint and checks it against the config; the log is not truncated
    assert main(["train", str(cfg), "--check", "--resume", str(out / "last.pt")]) == 0
    assert "; resuming in epoch 1" in capsys.readouterr().out  # the checkpoint was read
    assert _tree(tmp_path) == before


def _config(data: Path, out: Path, **model):
    raw = tiny_raw(data, out)
    raw["train"].update(QUICK)
    raw["model"].update(model)
    return config_from_dict(raw)


def test_check_names_a_resume_that_does_not_fit(tmp_path, data):
    first = tmp_path / "a"
    train(_config(data, first))
    before = _tree(tmp_path)
    with pytest.raises(ValueError, match="does not fit this run's model|model"):
        check_run(_config(data, first, embed_dim=32), resume=first / "last.pt")
    assert _tree(tmp_path) == before


def test_check_refuses_a_folder_in_use_without_taking_its_lock(tmp_path, data):
    out = tmp_path / "out"
    out.mkdir()
    config = _config(data, out)
    lock = acquire_run_lock(out)
    try:
        with pytest.raises(RunFolderLocked, match="in use by another run"):
            check_run(config)
    finally:
        lock.release()
    check_run(config)  # free again: the check held no lock of its own
    assert list(out.iterdir()) == []


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_check_refuses_an_output_folder_it_cannot_create(tmp_path, data):
    locked = tmp_path / "ro"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        with pytest.raises(ValueError, match=r"ro: cannot write the folder that would hold"):
            check_run(_config(data, locked / "run"))
    finally:
        locked.chmod(0o755)


def test_check_config_builds_the_model_section(tmp_path):
    raw = tiny_raw(tmp_path, tmp_path / "out")
    raw["model"]["image"]["pooling"] = "nosuch"
    with pytest.raises(ConfigError, match=r"model\.image"):
        check_config(config_from_dict(raw))


def test_shipped_configs_pass_the_config_check(capsys):
    """Every shipped config passes --check-config (the level the docs check for configs whose
    data is not in CI)."""
    from vlret.configs import shipped_configs

    failed = {}
    for name in shipped_configs():
        status = main(["train", name, "--check-config"])
        text = capsys.readouterr()
        if status != 0:
            failed[name] = text.err.strip()
    assert failed == {}


def test_the_readme_pixel_flow_checks_the_shipped_clip_config(tmp_path, monkeypatch, capsys):
    """``vlret synth tiny ... --webdataset`` then ``vlret train synth_clip_pretrain --check``
    from the same folder: the shards listed and checked, the summary printed, nothing written;
    a missing shard and a shortened run's warm-up are named before anything runs."""
    pytest.importorskip("webdataset")
    pytest.importorskip("transformers")
    monkeypatch.chdir(tmp_path)
    synth = ["synth", "tiny", "--out", "runs/data-pix", "--format", "karpathy"]
    assert main([*synth, "--webdataset", "--imagefolder", "--shard-size", "300"]) == 0
    capsys.readouterr()
    before = _tree(tmp_path)
    assert main(["train", "synth_clip_pretrain", "--check"]) == 0
    out = capsys.readouterr().out
    assert "train 1200 samples (data.train_num_samples) from 4 shards" in out
    assert "  steps: 18 steps per epoch, batch 64" in out
    assert "  epochs: 40 epochs, numbered 0-39" in out
    assert _tree(tmp_path) == before
    short = ["--set", "train.epochs=1", "--set", "train.max_steps_per_epoch=2"]
    assert main(["train", "synth_clip_pretrain", *short, "--check"]) == 2
    line = _one_line(capsys.readouterr().err)
    assert "optim.warmup_steps: 20 must be below the run's 2 steps" in line
    assert "set optim.warmup_steps below 2" in line
    (tmp_path / "runs/data-pix/webdataset/train/00002.tar").unlink()
    assert main(["train", "synth_clip_pretrain", "--check"]) == 2
    line = _one_line(capsys.readouterr().err)
    assert "data.shards" in line and "00002.tar" in line
    assert not (tmp_path / "runs" / "synth_clip_pretrain").exists()
