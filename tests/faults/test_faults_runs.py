"""Fault pass on run folders (issue 26): one process per run folder (the lock), writes that fail
mid-run (a full disk, a folder made read-only), messages that name the problem, and the
console's report of a run (start summary, warm-up note, epochs counted as metrics.jsonl does).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import resource
import signal
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import vlret
import vlret.train.trainer as trainer_module
from fault_helpers import made_read_only
from train_helpers import tiny_config, tiny_data
from vlret.cli import main
from vlret.run.lock import LOCK_FILE, RunFolderLocked, acquire_run_lock
from vlret.train import Trainer
from vlret.train.hooks.core import TrainHook

SRC = str(Path(vlret.__file__).resolve().parents[1])


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return tiny_data(tmp_path_factory.mktemp("data"))


def _config_file(tmp_path: Path, data: Path, overrides: list[str] | None = None) -> Path:
    cfg = tmp_path / "run.json"
    cfg.write_text(json.dumps(tiny_config(data, tmp_path / "run", overrides).to_dict()))
    return cfg


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}


def _vlret(*args: str, preexec_fn=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "vlret", *args],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=300,
        preexec_fn=preexec_fn,
    )


def _one_line(text: str) -> str:
    text = text.strip()
    assert text and "\n" not in text and "Traceback" not in text, text
    return text


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.name != LOCK_FILE}


# --------------------------------------------------------------------------------------------
# The run-folder lock
# --------------------------------------------------------------------------------------------

HOLDER = """
import json, sys
from vlret.train import Trainer
from vlret.run.config import config_from_dict
trainer = Trainer(config_from_dict(json.loads(open(sys.argv[1]).read())))
print("holding", flush=True)
sys.stdin.readline()
"""


@contextlib.contextmanager
def _holder(tmp_path: Path, cfg: Path):
    """A second process that holds the run folder (a Trainer built on it) until killed."""
    script = tmp_path / "holder.py"
    script.write_text(HOLDER)
    proc = subprocess.Popen(
        [sys.executable, str(script), str(cfg)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=_env(),
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "holding"
        yield proc
    finally:
        proc.kill()
        proc.wait()


def test_second_process_is_refused_naming_the_holder_then_takes_over_after_sigkill(tmp_path, data):
    cfg = _config_file(tmp_path, data, ["train.epochs=1", "train.validate=false"])
    out = tmp_path / "run"
    with _holder(tmp_path, cfg) as holder:
        second = _vlret("train", str(cfg))
        assert second.returncode == 2, second.stderr
        err = _one_line(second.stderr)
        assert err.startswith(f"vlret train: {out}: in use by another run")
        assert f"pid {holder.pid}" in err and socket.gethostname() in err
        assert "since 20" in err and "holder.py" in err
        assert not (out / "last.pt").exists()  # the second run wrote nothing
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert json.loads((out / LOCK_FILE).read_text())["pid"] == holder.pid  # left by the kill
    third = _vlret("train", str(cfg))
    assert third.returncode == 0, third.stderr
    note = [x for x in third.stdout.splitlines() if "took over" in x]
    assert len(note) == 1 and f"pid {holder.pid}" in note[0] and "no longer running" in note[0]
    assert (out / "last.pt").is_file() and not (out / LOCK_FILE).exists()


def test_a_trainer_on_a_folder_another_trainer_holds_is_refused(tmp_path, data, monkeypatch):
    cfg = tiny_config(data, tmp_path / "run", ["train.epochs=1", "train.validate=false"])
    Trainer(cfg).fit()
    out = tmp_path / "run"
    before = _files(out)
    first = Trainer(cfg, resume=out / "last.pt")  # holds the folder until fit ends or close

    def refuse(*args, **kwargs):
        raise AssertionError("a refused run read its data")

    monkeypatch.setattr(trainer_module, "build_encoder", refuse)
    for kwargs in ({}, {"overwrite": True}, {"resume": out / "last.pt"}):
        with pytest.raises(RunFolderLocked, match=rf"in use by another run \(pid {os.getpid()} "):
            Trainer(cfg, **kwargs)
    assert _files(out) == before  # --overwrite deleted nothing
    first.close()
    monkeypatch.undo()
    Trainer(cfg, overwrite=True).fit()


def test_cli_resume_and_overwrite_of_a_locked_folder_are_one_line(tmp_path, data, capsys):
    cfg = _config_file(tmp_path, data, ["train.epochs=1", "train.validate=false"])
    out = tmp_path / "run"
    assert main(["train", str(cfg)]) == 0
    lock = acquire_run_lock(out)
    try:
        for extra in (["--overwrite"], ["--resume", str(out / "last.pt")]):
            capsys.readouterr()
            assert main(["train", str(cfg), "--set", "train.epochs=2", *extra]) == 2
            err = _one_line(capsys.readouterr().err)
            assert "in use by another run" in err and f"pid {os.getpid()}" in err
    finally:
        lock.release()
    assert (
        main(["train", str(cfg), "--set", "train.epochs=2", "--resume", str(out / "last.pt")]) == 0
    )


def test_the_lock_is_released_when_a_run_ends_or_fails(tmp_path, data):
    out = tmp_path / "run"
    cfg = tiny_config(data, out, ["train.epochs=1", "train.validate=false"])
    Trainer(cfg).fit()
    assert not (out / LOCK_FILE).exists()
    acquire_run_lock(out).release()
    with pytest.raises(ValueError, match="holds another run"):
        Trainer(cfg)  # refused after the lock was taken: it is let go
    acquire_run_lock(out).release()
    dropped = Trainer(cfg, overwrite=True)  # never fit nor closed, then dropped
    del dropped
    Trainer(cfg, overwrite=True).fit()


def test_stale_lock_file_is_taken_over_with_a_note(tmp_path, data, capsys):
    out = tmp_path / "run"
    out.mkdir()
    stale = {"pid": 999999, "host": "elsewhere", "since": "2020-01-01", "command": "vlret x"}
    (out / LOCK_FILE).write_text(json.dumps(stale))
    Trainer(tiny_config(data, out, ["train.epochs=1", "train.validate=false"])).fit()
    notes = [x for x in capsys.readouterr().out.splitlines() if "took over" in x]
    assert notes == [  # another host's process cannot be looked up (issue 39 item 13)
        f"{out}: took over the lock released by a run on another host (pid 999999 on "
        "elsewhere since 2020-01-01, command: vlret x); whether it still runs there cannot be "
        "checked from here"
    ]


# --------------------------------------------------------------------------------------------
# Writes that fail mid-run
# --------------------------------------------------------------------------------------------


def _file_size_limit(limit: int):
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return apply


@pytest.mark.parametrize("what", ["last.pt", "metrics.jsonl"])
def test_full_disk_mid_run_is_one_line_and_keeps_last_pt(tmp_path, data, what):
    # a step record per step for 3 epochs: the log outgrows config.yaml and vocab.json
    cfg = _config_file(
        tmp_path, data, ["train.epochs=3", "train.validate=false", "train.log_every=1"]
    )
    out = tmp_path / "run"
    assert main(["train", str(cfg)]) == 0
    last = (out / "last.pt").read_bytes()
    # below the checkpoint's size, or just above the log's: that file is the first refused
    log_size = (out / "metrics.jsonl").stat().st_size
    assert log_size > max((out / f).stat().st_size for f in ("config.yaml", "vocab.json"))
    limit = len(last) // 2 if what == "last.pt" else log_size + 8
    proc = _vlret(
        "train",
        str(cfg),
        "--set",
        "train.epochs=4",
        "--resume",
        str(out / "last.pt"),
        preexec_fn=_file_size_limit(limit),
    )
    assert proc.returncode == 2, proc.stderr
    err = _one_line(proc.stderr)
    if what == "last.pt":  # without a dev set the last epoch writes best.pt first
        files = (out / "best.pt", out / "last.pt")
        kept = "; the previous file is left as it was"
        assert err in {
            f"vlret train: {f}: cannot write (file size limit exceeded){kept}" for f in files
        }
    else:
        assert err == f"vlret train: {out / what}: cannot write (file size limit exceeded)"
    assert (out / "last.pt").read_bytes() == last
    assert not (out / LOCK_FILE).exists()  # released; the next run continues
    assert (
        main(["train", str(cfg), "--set", "train.epochs=4", "--resume", str(out / "last.pt")]) == 0
    )


class _ReadOnlyAfter(TrainHook):
    """Makes the run folder read-only after the given step (as a full or remounted disk)."""

    def __init__(self, folder: Path, step: int, stack: contextlib.ExitStack) -> None:
        self.folder, self.at, self.stack = folder, step, stack

    def after_step(self, trainer, step) -> None:
        if trainer.step == self.at:
            self.stack.enter_context(made_read_only(self.folder))


def test_folder_made_read_only_mid_run_is_one_line_and_releases_the_lock(
    tmp_path, data, capsys, monkeypatch
):
    cfg = _config_file(tmp_path, data, ["train.epochs=1", "train.validate=false"])
    out = tmp_path / "run"
    assert main(["train", str(cfg)]) == 0
    last = (out / "last.pt").read_bytes()
    capsys.readouterr()
    with contextlib.ExitStack() as stack:
        hooks = trainer_module.config_hooks
        monkeypatch.setattr(
            trainer_module,
            "config_hooks",
            lambda trainer: [*hooks(trainer), _ReadOnlyAfter(out, 7, stack)],
        )
        code = main(
            ["train", str(cfg), "--set", "train.epochs=2", "--resume", str(out / "last.pt")]
        )
        err = _one_line(capsys.readouterr().err)
        assert code == 2
        assert err.startswith(f"vlret train: {out}/") and "read-only file system" in err
        assert (out / "last.pt").read_bytes() == last
        # nobody holds the lock (its file stays: the folder is read-only)
        fd = os.open(out / LOCK_FILE, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)


# --------------------------------------------------------------------------------------------
# Messages
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("resume", ["run/lst.pt", "elsewhere/last.pt", "run/sub/last.pt"])
def test_resume_of_a_missing_checkpoint_says_it_is_missing(tmp_path, data, capsys, resume):
    cfg = _config_file(tmp_path, data, ["train.epochs=1"])
    assert main(["train", str(cfg)]) == 0
    capsys.readouterr()
    assert main(["train", str(cfg), "--resume", str(tmp_path / resume)]) == 2
    err = _one_line(capsys.readouterr().err)
    assert f"--resume {tmp_path / resume}: checkpoint missing" in err
    assert "holds another run" not in err
    assert str(tmp_path / "run" / "last.pt") in err and str(tmp_path / "run" / "best.pt") in err


def test_nan_features_without_the_load_check_name_epoch_side_and_rows(tmp_path, capsys):
    root = tiny_data(tmp_path / "data")
    feats = np.load(root / "train_ims.npy")
    feats[5, 2, 7] = np.nan
    np.save(root / "train_ims.npy", feats)
    cfg = _config_file(tmp_path, root, ["data.check_features=false", "train.epochs=1"])
    assert main(["train", str(cfg)]) == 2
    err = _one_line(capsys.readouterr().err)
    assert err.startswith("vlret train: epoch 0 step 0: the image features of image row 5 of")
    assert "'train' split" in err and "NaN or inf" in err
    assert "data.check_features = false skipped the check" in err


# --------------------------------------------------------------------------------------------
# The console's report
# --------------------------------------------------------------------------------------------


def test_start_summary_warmup_note_and_epochs_counted_as_metrics_jsonl(tmp_path, data, capsys):
    cfg = _config_file(tmp_path, data, ["train.epochs=3", "train.all_negatives_epochs=2"])
    assert main(["train", str(cfg)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[:5] == [
        "run: device cpu, 1 process",
        "  data: train 8 images / 40 captions, dev 2 images / 10 captions",
        "  steps: 5 steps per epoch, batch 8",
        "  epochs: 3 epochs, numbered 0-2 as in metrics.jsonl; all-negatives warm-up in "
        "epochs 0-1, the hardest negative from epoch 2",
        f"  output: {tmp_path / 'run'}",
    ]
    notes = [i for i, x in enumerate(out) if "warm-up is over" in x]
    assert len(notes) == 1 and out[notes[0]].startswith("epoch 2: ")
    assert out[notes[0] - 1].startswith("epoch 1 (2/3): ")  # between epochs 1 and 2
    epochs = [x for x in out if x.startswith("epoch ") and "): loss" in x]
    records = [
        json.loads(x)
        for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
        if '"kind": "epoch"' in x
    ]
    assert len(epochs) == len(records) == 3
    for line, record in zip(epochs, records, strict=True):
        assert line.startswith(f"epoch {record['epoch']} ({record['epoch'] + 1}/3): ")
        assert f"at epoch {record['best_epoch']})" in line
    assert out[-1].startswith("done: 3 epochs, 15 steps")


def test_done_line_says_one_epoch(tmp_path, data, capsys):
    cfg = _config_file(tmp_path, data, ["train.epochs=1", "train.max_steps_per_epoch=1"])
    assert main(["train", str(cfg)]) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith("done: 1 epoch, 1 step, ")
