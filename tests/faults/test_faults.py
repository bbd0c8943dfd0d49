"""Fault injection: a run killed at every checkpoint write, signals during a write, corrupted
checkpoints, output folders that would be clobbered, resumes that do not fit, bad configs.

A kill is simulated by a ``BaseException`` raised from the checkpoint writer (nothing in the
trainer catches it, as nothing survives a SIGKILL); the real SIGKILL of a subprocess is in
test_train_resume.py.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
import torch

import vlret.run.checkpoint as checkpoint_module
import vlret.train.trainer as trainer_module
from fault_helpers import read_only_folder
from train_helpers import assert_same_params, model_params, tiny_config, tiny_data
from vlret._files import atomic_write_text, remove_stale_temporaries
from vlret.cli import main
from vlret.run import ConfigError
from vlret.run.checkpoint import load_checkpoint, save_checkpoint
from vlret.run.folder import RunFolderError
from vlret.train import Trainer, TrainingInterrupted

#: dev rsum of epochs 0, 1, 2: the best epoch is 1, so the last epoch writes no best.pt
RSUMS = [1.0, 3.0, 2.0]
#: the checkpoint writes of the 3-epoch run, in order
WRITES = ["best.pt", "last.pt", "best.pt", "last.pt", "last.pt"]


class Killed(BaseException):
    """Stands for SIGKILL: no handler in the trainer catches a BaseException."""


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return tiny_data(tmp_path_factory.mktemp("data"))


@pytest.fixture
def scripted_dev(monkeypatch):
    """Dev rsum from :data:`RSUMS` (the tiny dev set's real rsum often ties)."""

    def validate(self):
        return {"rsum": RSUMS[self.epoch]} if self.dev_set is not None else None

    monkeypatch.setattr(Trainer, "validate", validate)


def _config_file(tmp_path: Path, data: Path) -> Path:
    """The tiny run config as a file (output folder ``tmp_path/run``), for the CLI."""
    cfg = tmp_path / "run.json"
    cfg.write_text(json.dumps(tiny_config(data, tmp_path / "run").to_dict()))
    return cfg


def _records(folder: Path) -> list[dict]:
    return [json.loads(x) for x in (folder / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def reference(tmp_path_factory, data):
    """The uninterrupted run: final weights and best.pt."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(
            Trainer, "validate", lambda self: {"rsum": RSUMS[self.epoch]} if self.dev_set else None
        )
        out = tmp_path_factory.mktemp("reference") / "run"
        trainer = Trainer(tiny_config(data, out))
        trainer.fit()
    return {
        "final": model_params(trainer.model),
        "best": load_checkpoint(out / "best.pt"),
    }


# --------------------------------------------------------------------------------------------
# Kill at each checkpoint write
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("when", ["before", "after"])
@pytest.mark.parametrize("kill_at", range(5))
def test_kill_at_each_checkpoint_write_then_resume(
    tmp_path, data, reference, scripted_dev, monkeypatch, kill_at, when
):
    out = tmp_path / "run"
    calls = []
    real_save = trainer_module.save_checkpoint

    def killing_save(state, path):
        calls.append(Path(path).name)
        if len(calls) - 1 == kill_at and when == "before":
            raise Killed
        written = real_save(state, path)
        if len(calls) - 1 == kill_at:
            raise Killed
        return written

    monkeypatch.setattr(trainer_module, "save_checkpoint", killing_save)
    with pytest.raises(Killed):
        Trainer(tiny_config(data, out)).fit()
    assert calls == WRITES[: kill_at + 1]
    monkeypatch.setattr(trainer_module, "save_checkpoint", real_save)

    last = out / "last.pt"
    resumed = Trainer(
        tiny_config(data, out),
        resume=last if last.is_file() else None,
        overwrite=not last.is_file(),
    )
    resumed.fit()
    assert_same_params(model_params(resumed.model), reference["final"])
    best = load_checkpoint(out / "best.pt")
    assert best["best_epoch"] == reference["best"]["best_epoch"] == 1
    assert_same_params(best["model"], reference["best"]["model"])
    assert load_checkpoint(last)["best_epoch"] == 1
    epochs = [r["epoch"] for r in _records(out) if r["kind"] == "epoch"]
    assert epochs == [0, 1, 2], "a resumed run logs each epoch once"
    assert not list(out.glob(".*.tmp"))


def test_best_is_written_before_last(tmp_path, data, scripted_dev, monkeypatch):
    calls = []
    real_save = trainer_module.save_checkpoint
    monkeypatch.setattr(
        trainer_module,
        "save_checkpoint",
        lambda state, path: (
            calls.append((Path(path).name, state["epoch"])) or real_save(state, path)
        ),
    )
    Trainer(tiny_config(data, tmp_path / "run")).fit()
    assert calls == [("best.pt", 1), ("last.pt", 1), ("best.pt", 2), ("last.pt", 2), ("last.pt", 3)]


def test_stale_best_from_an_older_order_is_restored_on_resume(tmp_path, data, scripted_dev):
    """last.pt says best epoch 1 (end-of-epoch-1 checkpoint) but best.pt holds epoch 0: the
    state a kill between last.pt and best.pt left under the old write order."""
    out = tmp_path / "run"
    Trainer(tiny_config(data, out, ["train.epochs=1"])).fit()
    stale_best = (out / "best.pt").read_bytes()
    Trainer(tiny_config(data, out, ["train.epochs=2"]), resume=out / "last.pt").fit()
    (out / "best.pt").write_bytes(stale_best)  # epoch 1's best.pt "never written"
    assert load_checkpoint(out / "best.pt")["best_epoch"] == 0
    end_of_epoch_1 = load_checkpoint(out / "last.pt")
    assert (end_of_epoch_1["best_epoch"], end_of_epoch_1["epoch"]) == (1, 2)

    Trainer(tiny_config(data, out, ["train.epochs=3"]), resume=out / "last.pt").fit()
    best = load_checkpoint(out / "best.pt")
    assert best["best_epoch"] == 1
    assert_same_params(best["model"], end_of_epoch_1["model"])


def test_resume_into_a_new_folder_brings_best_and_the_log(tmp_path, data, scripted_dev):
    first = tmp_path / "first"
    Trainer(tiny_config(data, first, ["train.epochs=2"])).fit()
    second = tmp_path / "second"
    Trainer(tiny_config(data, second), resume=first / "last.pt").fit()
    assert load_checkpoint(second / "best.pt")["best_epoch"] == 1
    assert [r["epoch"] for r in _records(second) if r["kind"] == "epoch"] == [0, 1, 2]


def test_time_based_checkpoint_saves_work_of_a_first_epoch_kill(tmp_path, data, monkeypatch):
    out = tmp_path / "run"
    overrides = ["train.validate=false", "train.epochs=2", "train.checkpoint_minutes=1e-9"]
    original = Trainer.train_step

    def killed_at_step_3(self, batch):
        if self.step == 3:
            raise Killed
        return original(self, batch)

    monkeypatch.setattr(Trainer, "train_step", killed_at_step_3)
    with pytest.raises(Killed):
        Trainer(tiny_config(data, out, overrides)).fit()
    monkeypatch.setattr(Trainer, "train_step", original)
    state = load_checkpoint(out / "last.pt")
    assert (state["epoch"], state["batch_in_epoch"], state["step"]) == (0, 3, 3)

    resumed = Trainer(tiny_config(data, out, overrides), resume=out / "last.pt")
    resumed.fit()
    full = Trainer(tiny_config(data, tmp_path / "full", overrides))
    full.fit()
    assert_same_params(model_params(resumed.model), model_params(full.model))
    steps = [r["step"] for r in _records(out) if r["kind"] == "step"]
    assert steps == sorted(set(steps))


def test_default_config_checkpoints_every_ten_minutes(tmp_path, data):
    assert tiny_config(data, tmp_path).train.checkpoint_minutes == 10.0


# --------------------------------------------------------------------------------------------
# Signals during a write
# --------------------------------------------------------------------------------------------


def test_second_ctrl_c_during_the_interrupt_checkpoint_keeps_last(tmp_path, data, monkeypatch):
    out = tmp_path / "run"
    original = Trainer.train_step
    real_torch_save = torch.save

    def step_then_ctrl_c(self, batch):
        result = original(self, batch)
        if self.step == 2:
            signal.raise_signal(signal.SIGINT)
        return result

    def save_with_second_ctrl_c(obj, fh):
        signal.raise_signal(signal.SIGINT)  # arrives while the checkpoint is being written
        real_torch_save(obj, fh)

    monkeypatch.setattr(Trainer, "train_step", step_then_ctrl_c)
    monkeypatch.setattr(checkpoint_module.torch, "save", save_with_second_ctrl_c)
    with pytest.raises(TrainingInterrupted) as err:
        Trainer(tiny_config(data, out, ["train.validate=false"])).fit()
    monkeypatch.setattr(checkpoint_module.torch, "save", real_torch_save)
    assert err.value.checkpoint == out / "last.pt"
    assert load_checkpoint(out / "last.pt")["step"] == 2


def test_ctrl_c_during_a_library_write_is_delivered_after_the_file_is_complete(
    tmp_path, monkeypatch
):
    real_torch_save = torch.save

    def save_with_ctrl_c(obj, fh):
        signal.raise_signal(signal.SIGINT)
        real_torch_save(obj, fh)

    monkeypatch.setattr(checkpoint_module.torch, "save", save_with_ctrl_c)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint({"model": {"w": torch.ones(3)}}, tmp_path / "c.pt")
    monkeypatch.undo()
    assert torch.equal(load_checkpoint(tmp_path / "c.pt")["model"]["w"], torch.ones(3))
    assert not list(tmp_path.glob(".*.tmp"))


def test_failed_write_keeps_the_previous_file_and_no_temporary(tmp_path):
    target = tmp_path / "config.yaml"
    atomic_write_text(target, "old\n")

    class Boom(Exception):
        pass

    def failing(fh):
        fh.write(b"half")
        raise Boom

    from vlret._files import atomic_write

    with pytest.raises(Boom):
        atomic_write(target, failing)
    assert target.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.yaml"]


def test_stale_temporaries_of_a_killed_write_are_removed_when_a_run_starts(tmp_path, data):
    out = tmp_path / "run"
    out.mkdir()
    stale = [out / ".last.pt.k1x2.tmp", out / ".best.pt.abc.tmp", out / "config.yaml.tmp"]
    for path in stale:
        path.write_bytes(b"cut short")
    keep = out / ".notes.txt.tmp"  # not a run file's temporary: left alone
    keep.write_text("mine")
    Trainer(tiny_config(data, out, ["train.epochs=1", "train.validate=false"])).fit()
    assert not any(p.exists() for p in stale)
    assert keep.exists()
    assert remove_stale_temporaries(out, ["last.pt"]) == []


# --------------------------------------------------------------------------------------------
# Output folders
# --------------------------------------------------------------------------------------------


def _no_data_loading(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("data was loaded before the output folder was checked")

    monkeypatch.setattr(trainer_module, "build_encoder", refuse)


def test_training_into_another_runs_folder_is_refused(tmp_path, data, monkeypatch):
    out = tmp_path / "run"
    Trainer(tiny_config(data, out, ["train.epochs=1", "train.validate=false"])).fit()
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    _no_data_loading(monkeypatch)
    with pytest.raises(RunFolderError, match=r"holds another run .*--resume .*--overwrite"):
        Trainer(tiny_config(data, out, ["train.epochs=2"]))
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_overwrite_replaces_the_old_run_entirely(tmp_path, data):
    out = tmp_path / "run"
    Trainer(tiny_config(data, out, ["train.epochs=2", "train.validate=false"])).fit()
    Trainer(
        tiny_config(data, out, ["train.epochs=1", "train.validate=false"]), overwrite=True
    ).fit()
    epochs = [r["epoch"] for r in _records(out) if r["kind"] == "epoch"]
    assert epochs == [0]
    assert load_checkpoint(out / "last.pt")["epoch"] == 1


def test_users_own_files_in_the_cwd_are_not_clobbered(tmp_path, data, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "config.yaml").write_text("my own config\n")
    with pytest.raises(RunFolderError, match="config.yaml"):
        Trainer(tiny_config(data, Path(".")))
    assert (tmp_path / "config.yaml").read_text() == "my own config\n"


def test_output_dir_that_is_a_file_fails_before_data_loading(tmp_path, data, monkeypatch):
    (tmp_path / "taken").write_text("x")
    _no_data_loading(monkeypatch)
    with pytest.raises(RunFolderError, match="is a file"):
        Trainer(tiny_config(data, tmp_path / "taken"))
    with pytest.raises(RunFolderError, match="cannot write"):
        Trainer(tiny_config(data, tmp_path / "taken" / "run"))


def test_unwritable_output_dir_fails_before_data_loading(tmp_path, data, monkeypatch):
    _no_data_loading(monkeypatch)
    with read_only_folder(tmp_path / "locked") as locked:  # as root too (a read-only mount)
        with pytest.raises(RunFolderError, match="cannot write"):
            Trainer(tiny_config(data, locked))
        with pytest.raises(RunFolderError, match="cannot write"):
            Trainer(tiny_config(data, locked / "run"))


def test_cli_refuses_an_empty_output_dir_and_another_runs_folder(tmp_path, data, capsys):
    cfg = _config_file(tmp_path, data)
    assert main(["train", str(cfg), "--set", "output_dir="]) == 2
    err = capsys.readouterr().err.strip()
    assert "output_dir" in err and "\n" not in err
    assert main(["train", str(cfg), "--set", "train.epochs=1"]) == 0
    assert "epoch 0 (1/1): loss" in capsys.readouterr().out
    assert main(["train", str(cfg), "--set", "train.epochs=1"]) == 2
    assert "holds another run" in capsys.readouterr().err
    assert main(["train", str(cfg), "--set", "train.epochs=1", "--overwrite"]) == 0


# --------------------------------------------------------------------------------------------
# Resume that does not fit
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("loss.margin=0.3", "loss.margin"),
        ("loss.name=infonce", "loss.name"),
        ("model.embed_dim=24", "model.embed_dim"),
        ("optim.name=sgd", "optim.name"),
        ("optim.lr=0.5", "optim.lr"),
        ("train.batch_size=4", "train.batch_size"),
    ],
)
def test_resume_with_a_changed_model_loss_or_optimiser_is_refused(
    tmp_path, data, override, key, monkeypatch
):
    out = tmp_path / "run"
    Trainer(tiny_config(data, out, ["train.epochs=1", "train.validate=false"])).fit()
    _no_data_loading(monkeypatch)
    with pytest.raises(RunFolderError, match=rf"{key}: .* -> "):
        Trainer(
            tiny_config(data, out, ["train.epochs=2", "train.validate=false", override]),
            resume=out / "last.pt",
        )


def test_resume_may_change_epochs_logging_and_device(tmp_path, data):
    out = tmp_path / "run"
    Trainer(tiny_config(data, out, ["train.epochs=1", "train.validate=false"])).fit()
    changed = ["train.epochs=2", "train.validate=false", "train.log_every=1", "train.device=cpu"]
    resumed = Trainer(tiny_config(data, out, changed), resume=out / "last.pt")
    resumed.fit()
    assert resumed.epoch == 2


# --------------------------------------------------------------------------------------------
# Corrupted checkpoints
# --------------------------------------------------------------------------------------------


def _corrupt(kind: str, path: Path, good: Path) -> None:
    if kind == "empty":
        path.write_bytes(b"")
    elif kind == "random":
        path.write_bytes(bytes(range(256)) * 40)
    elif kind == "truncated":
        path.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    elif kind == "unsafe":
        torch.save({"model": {}, "x": Killed}, path)  # a class: refused by weights_only


@pytest.mark.parametrize(
    ("kind", "reason"),
    [
        ("empty", "empty file (0 bytes)"),
        ("random", "not a complete PyTorch checkpoint"),
        ("truncated", "truncated copy"),
        ("unsafe", "safe loader"),
    ],
)
def test_corrupted_checkpoint_gives_one_line_naming_file_and_reason(
    tmp_path, kind, reason, data, capsys
):
    good = tmp_path / "good.pt"
    save_checkpoint({"model": {"w": torch.ones(2)}}, good)
    bad = tmp_path / f"{kind}.pt"
    _corrupt(kind, bad, good)
    with pytest.raises(ValueError) as err:
        load_checkpoint(bad)
    message = str(err.value)
    assert str(bad) in message and reason in message
    assert "weights_only=False" not in message and "\n" not in message

    cfg = _config_file(tmp_path, data)
    assert main(["train", str(cfg), "--resume", str(bad)]) == 2
    assert reason in capsys.readouterr().err
    args = ["eval", str(bad), "--data", str(data), "--split", "test", "--protocol", "f30k"]
    assert main(args) == 2
    err_line = capsys.readouterr().err.strip()
    assert reason in err_line and "\n" not in err_line


# --------------------------------------------------------------------------------------------
# Bad configs and options: one line naming the key, before any data is read
# --------------------------------------------------------------------------------------------


BAD_OVERRIDES = [
    ("optim.lr=inf", "optim.lr"),
    ("optim.lr=nan", "optim.lr"),
    ("optim.lr=-1e-3", "optim.lr"),
    ("optim.weight_decay=-0.1", "optim.weight_decay"),
    ("optim.betas=[0.9, 1.5]", "optim.betas"),
    ("optim.eps=0", "optim.eps"),
    ("optim.eps=nan", "optim.eps"),
    ("train.batch_size=1", "train.batch_size"),
    ("train.device=banana", "train.device"),
    ("train.device=meta", "train.device"),  # a torch device, not one that trains
    ("train.checkpoint_minutes=-1", "train.checkpoint_minutes"),
    ("model.image.in_dim=inf", "model.image.in_dim"),
    ("output_dir=", "output_dir"),
    ("output_dir=' '", "output_dir"),
]


@pytest.mark.parametrize(("override", "key"), BAD_OVERRIDES)
def test_bad_config_value_names_its_key(tmp_path, data, override, key, capsys):
    cfg = _config_file(tmp_path, data)
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        tiny_config(data, tmp_path / "run", [override])
    assert main(["train", str(cfg), "--set", override]) == 2
    err = capsys.readouterr().err.strip()
    assert key in err and "\n" not in err
    assert not (tmp_path / "run").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_device_without_cuda_is_one_line(tmp_path, data, capsys):
    cfg = _config_file(tmp_path, data)
    assert main(["train", str(cfg), "--set", "train.device=cuda"]) == 2
    err = capsys.readouterr().err.strip()
    assert "train.device" in err and "CUDA is not available" in err and "\n" not in err
    ckpt = tmp_path / "c.pt"
    save_checkpoint({"model": {}}, ckpt)
    args = ["eval", str(ckpt), "--data", str(data), "--split", "test", "--protocol", "f30k"]
    assert main([*args, "--device", "cuda"]) == 2
    err = capsys.readouterr().err.strip()
    assert "device" in err and "CUDA is not available" in err and "\n" not in err


def test_summary_line_per_epoch_without_progress_bar(tmp_path, data, capsys):
    Trainer(tiny_config(data, tmp_path / "run", ["train.epochs=2"])).fit()
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("epoch ")]
    assert [x.split(":")[0] for x in lines] == ["epoch 0 (1/2)", "epoch 1 (2/2)"]
    assert all("loss" in x and "dev rsum" in x and "best" in x and x.endswith(" s") for x in lines)


def test_nan_in_train_features_is_named_before_training(tmp_path, capsys):
    import numpy as np

    data = tiny_data(tmp_path / "data")
    feats = np.load(data / "train_ims.npy")
    feats[5, 2, 7] = np.nan
    np.save(data / "train_ims.npy", feats)
    cfg = _config_file(tmp_path, data)
    assert main(["train", str(cfg)]) == 2
    err = capsys.readouterr().err.strip()
    assert "train_ims.npy" in err and "row 5" in err and "NaN" in err and "\n" not in err
    assert not (tmp_path / "run" / "metrics.jsonl").exists(), "no step ran"


def test_feature_size_other_than_in_dim_is_named_before_training(tmp_path, data, capsys):
    cfg = _config_file(tmp_path, data)
    assert main(["train", str(cfg), "--set", "model.image.in_dim=32"]) == 2
    err = capsys.readouterr().err.strip()
    assert "model.image.in_dim" in err and "16" in err and "\n" not in err


def test_negative_margin_in_a_config_names_the_key(tmp_path, data):
    with pytest.raises(ConfigError, match=r"loss\.margin: margin must be >= 0"):
        tiny_config(data, tmp_path / "run", ["loss.margin=-0.2"])


@pytest.fixture(scope="module")
def trained_checkpoint(tmp_path_factory, data):
    out = tmp_path_factory.mktemp("trained") / "run"
    Trainer(tiny_config(data, out, ["train.epochs=1", "train.validate=false"])).fit()
    return out / "last.pt"


@pytest.mark.parametrize(
    ("protocol", "split", "label"),
    [
        (
            "coco1k",
            "testall",
            "MS-COCO 5-fold 1K protocol on testall split of 5 images x 25 texts, "
            "5 folds of 1 images (not the paper's test set",
        ),
        ("f30k", "dev", "Flickr30K 1K protocol on dev split of 2 images x 10 texts (not the paper"),
    ],
)
def test_eval_labels_a_split_that_is_not_the_papers(
    trained_checkpoint, data, tmp_path, capsys, protocol, split, label
):
    out_json = tmp_path / "m.json"
    args = ["eval", str(trained_checkpoint), "--data", str(data), "--split", split]
    assert main([*args, "--protocol", protocol, "--json", str(out_json)]) == 0
    printed = capsys.readouterr().out
    assert label in printed and "1K test" not in printed
    record = json.loads(out_json.read_text())
    assert label in record["title"] and record["n_images"] in (2, 5)


def test_eval_json_that_is_a_folder_fails_before_evaluating(
    trained_checkpoint, data, tmp_path, capsys
):
    args = ["eval", str(trained_checkpoint), "--data", str(data), "--split", "test"]
    assert main([*args, "--protocol", "f30k", "--json", str(tmp_path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "", "nothing printed before the error"
    assert "--json is a folder" in captured.err and "\n" not in captured.err.strip()
