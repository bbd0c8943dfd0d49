"""The commands ``vlret synth`` prints run as printed from the folder it ran in, with a relative
``--out`` (issue 40): each ``vlret train`` line validates as printed (``--check``) and trains
(shortened by ``--set`` for the test's budget), then its ``vlret eval`` line and the zero-shot
line run exactly as printed."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

pytest.importorskip("yaml")

from vlret.cli import main  # noqa: E402

#: What shortens a printed training to the test's budget (the shipped configs train for
#: minutes): one epoch of two steps, no warm-up longer than that, no DataLoader processes.
SHORT = [
    "train.epochs=1",
    "train.max_steps_per_epoch=2",
    "optim.warmup_steps=1",
    "data.num_workers=0",
]


def printed(capsys, argv: list[str]) -> list[str]:
    """Run ``vlret synth ARGV`` and return the commands it prints, in order (``LABEL: vlret
    ...`` lines; a parenthesised note is no command)."""
    assert main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    return [x.split(": ", 1)[1] for x in lines if ": vlret " in x and not x.strip()[0] == "("]


def run(command: str, *extra: str) -> int:
    argv = shlex.split(command)
    assert argv[0] == "vlret"
    return main([*argv[1:], *extra])


def train_then_eval(capsys, train: str, evaluate: str, run_dir: str) -> str:
    """The printed training validated as printed, trained shortened, then the printed eval."""
    assert run(train, "--check") == 0
    assert "check passed" in capsys.readouterr().out
    assert not Path(run_dir).exists()  # --check wrote nothing
    shortened = [item for s in SHORT for item in ("--set", s)]
    assert run(train, *shortened) == 0
    assert (Path(run_dir) / "best.pt").is_file()
    capsys.readouterr()
    assert run(evaluate, "--no-progress") == 0
    return capsys.readouterr().out


def test_a_pixel_world_with_shards_trains_evaluates_and_classifies_as_printed(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    argv = ["synth", "tiny", "--out", "runs/w", "--format", "karpathy", "--webdataset"]
    commands = printed(capsys, [*argv, "--imagefolder", "--shard-size", "600"])
    karpathy_train, karpathy_eval, shards_train, shards_eval, zeroshot = commands
    assert "data.shards=" not in karpathy_train.replace("data.shards=null", "")
    assert "runs/w/" in shards_train and "runs/w/runs/w" not in shards_train
    table = train_then_eval(capsys, karpathy_train, karpathy_eval, "runs/synth_clip_karpathy")
    assert "checkpoint: runs/synth_clip_karpathy/best.pt (the run's best.pt)" in table
    assert "data: runs/w (the run's data.root)" in table and "R@1" in table
    table = train_then_eval(capsys, shards_train, shards_eval, "runs/synth_clip_pretrain")
    assert "split: test (protocol f30k's test split of karpathy data)" in table
    assert run(zeroshot, "--no-progress") == 0
    assert "acc1" in capsys.readouterr().out


def test_a_feature_world_trains_and_evaluates_as_printed(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    train, evaluate = printed(capsys, ["synth", "tiny", "--out", "data/w"])
    assert evaluate == "vlret eval runs/synth_f30k --protocol f30k"
    table = train_then_eval(capsys, train, evaluate, "runs/synth_f30k")
    assert "data: data/w (the run's data.root)" in table


def test_the_shards_of_a_feature_world_say_how_to_get_evaluation_images(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    assert main(["synth", "tiny", "--out", "runs/p", "--webdataset", "--shard-size", "600"]) == 0
    out = capsys.readouterr().out.splitlines()
    (at,) = [i for i, x in enumerate(out) if x.startswith("train CLIP on the shards: ")]
    assert "vlret eval" in out[at + 1] and "--format karpathy" in out[at + 1]
    assert run(out[at].split(": ", 1)[1], "--check") == 0  # the shards train as printed


def test_an_msrvtt_world_is_evaluated_with_msrvtt_full(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    train, evaluate = printed(capsys, ["synth", "tiny", "--out", "v", "--format", "msrvtt"])
    assert evaluate == "vlret eval runs/synth_f30k --protocol msrvtt-full"
    table = train_then_eval(capsys, train, evaluate, "runs/synth_f30k")
    assert "split: test (protocol msrvtt-full's test split of msrvtt data)" in table
