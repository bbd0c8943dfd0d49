"""``vlret eval RUN --protocol P`` (a run folder: its best.pt, the data folder of its config, the
protocol's split of that data), explicit --data / --split winning, ``--check``, and the errors
that name the fix (vlret.run.eval_inputs, vlret.run.eval_data)."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest

pytest.importorskip("yaml")

from vlret.cli import main  # noqa: E402
from vlret.data.config import DataConfig  # noqa: E402
from vlret.eval import get_protocol, protocol_names  # noqa: E402
from vlret.run import load_config
from vlret.run.eval_data import (  # noqa: E402
    default_split,
    eval_data_config,
    karpathy_eval_data,
    stored_eval_data,
)
from vlret.run.eval_members import run_checkpoint  # noqa: E402
from vlret.train import train
from vlret.worlds import write_synthetic  # noqa: E402

SHORT = [
    "train.epochs=1",
    "train.max_steps_per_epoch=2",
    "train.batch_size=8",
    "train.progress=false",
]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny precomp world ``w`` and a run ``run`` trained on it, named relative to ``base``
    (the folder the run was trained from)."""
    base = tmp_path_factory.mktemp("evalrun")
    write_synthetic("tiny", base / "w")
    sets = [
        f"data.root={base / 'w'}",
        "data.format=precomp",
        "data.captions_per_image=5",
        "model.image.in_dim=32",
        f"output_dir={base / 'run'}",
        *SHORT,
    ]
    train(load_config("synth_f30k_compare", sets))
    return base


def eval_json(args: list[str], out: Path) -> dict:
    assert main(["eval", *args, "--json", str(out), "--no-progress"]) == 0
    return json.loads(out.read_text(encoding="utf-8"))


def test_a_run_folder_takes_its_best_pt_data_root_and_the_protocols_split(
    trained, tmp_path, capsys
):
    run, world = trained / "run", trained / "w"
    explicit = [str(run / "best.pt"), "--data", str(world), "--split", "test"]
    given = eval_json([*explicit, "--protocol", "f30k"], tmp_path / "a.json")
    capsys.readouterr()
    taken = eval_json([str(run), "--protocol", "f30k"], tmp_path / "b.json")
    out = capsys.readouterr().out.splitlines()
    assert out[:3] == [
        f"checkpoint: {run / 'best.pt'} (the run's best.pt)",
        f"data: {world} (the run's data.root)",
        "split: test (protocol f30k's test split of precomp data)",
    ]
    assert taken["metrics"] == given["metrics"] and taken["split"] == "test"
    assert (taken["n_images"], taken["n_texts"]) == (40, 200)  # the tiny world's test split
    # an explicit --split (and --data) wins over the defaults
    dev = eval_json([str(run), "--protocol", "f30k", "--split", "dev"], tmp_path / "c.json")
    assert dev["split"] == "dev" and dev["metrics"] != given["metrics"]
    assert "split:" not in capsys.readouterr().out
    assert main(["eval", str(run), "--protocol", "f30k", "--data", str(tmp_path / "nope")]) == 2
    assert str(tmp_path / "nope") in capsys.readouterr().err


def test_a_run_without_best_pt_is_evaluated_from_last_pt_and_says_so(trained, tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(trained / "run" / "last.pt", run / "last.pt")
    assert run_checkpoint(run) == run / "last.pt"
    assert main(["eval", str(run), "--protocol", "f30k", "--no-progress"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    why = "the run has no best.pt yet: its last.pt, the latest epoch"
    assert first == f"checkpoint: {run / 'last.pt'} ({why})"
    (run / "last.pt").unlink()
    assert main(["eval", str(run), "--protocol", "f30k"]) == 2
    err = capsys.readouterr().err.strip()
    why = "expected the run folder of vlret train after its first epoch (or pass a checkpoint file)"
    assert err == f"vlret eval: {run}: no best.pt or last.pt; {why}"
    assert main(["eval", str(tmp_path / "gone"), "--protocol", "f30k"]) == 2
    assert "gone: missing; expected a run folder or a checkpoint" in capsys.readouterr().err


def test_errors_name_the_protocols_split_and_the_missing_data(
    trained, tmp_path, capsys, monkeypatch
):
    run = trained / "run"
    # coco5k scores precomp testall, which the tiny world does not hold
    assert main(["eval", str(run), "--protocol", "coco5k"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("vlret eval: --split testall (protocol coco5k's test split of precomp ")
    assert "is not in" in err and "testall_ims.npy: missing" in err and "\n" not in err
    assert main(["eval", str(run), "--protocol", "msrvtt-full"]) == 2
    assert "protocol msrvtt-full evaluates msrvtt data, not precomp" in capsys.readouterr().err
    assert main(["eval", str(run), "--protocol", "cuhk-pedes"]) == 2  # another data set: --data
    assert "pass its folder with --data" in capsys.readouterr().err
    assert main(["eval", "--model-dir", str(tmp_path), "--protocol", "f30k"]) == 2  # no run
    assert "--data: required with --model-dir" in capsys.readouterr().err
    # a run trained with a relative data.root, evaluated from another folder
    moved = tmp_path / "copy"
    shutil.copytree(run, moved)
    config = moved / "best.pt"
    import torch

    state = torch.load(config, weights_only=False)
    state["config"]["data"]["root"] = "w"  # relative: the folder it was trained from
    torch.save(state, config)
    monkeypatch.chdir(tmp_path)
    assert main(["eval", str(moved), "--protocol", "f30k"]) == 2
    assert "its data.root w is missing" in capsys.readouterr().err
    monkeypatch.chdir(trained)
    assert main(["eval", str(moved), "--protocol", "f30k", "--check"]) == 0
    assert "data: w (the run's data.root)" in capsys.readouterr().out


def test_check_prints_what_would_be_evaluated_and_writes_nothing(trained, tmp_path, capsys):
    run = trained / "run"
    before = {p.name: p.stat().st_mtime_ns for p in run.iterdir()}
    out = tmp_path / "m.json"
    assert main(["eval", str(run), "--protocol", "f30k", "--json", str(out), "--check"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[:3] == [
        f"model: {run / 'best.pt'} (the run's best.pt)",
        f"data: {trained / 'w'} (the run's data.root)",
        "split: test (protocol f30k's test split of precomp data)",
    ]
    assert "protocol: f30k" in lines and "size: 40 images x 200 captions" in lines
    assert f"would write: {out}" in lines and lines[-1].startswith("check passed")
    assert not out.exists() and {p.name: p.stat().st_mtime_ns for p in run.iterdir()} == before
    assert not any(tmp_path.iterdir())
    # what the evaluation would refuse, --check refuses the same way
    out.write_text("{}")
    assert main(["eval", str(run), "--protocol", "f30k", "--json", str(out), "--check"]) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert main(["eval", str(run), "--protocol", "f30k", "--split", "testall", "--check"]) == 2
    assert "evaluates the split(s) test, dev, not 'testall'" in capsys.readouterr().err


def test_default_split_is_the_first_split_the_protocol_evaluates_in_that_format():
    expected = {
        ("f30k", "precomp"): "test",
        ("f30k", "karpathy"): "test",
        ("coco5k", "precomp"): "testall",  # precomp COCO's 5000 test images
        ("coco1k", "karpathy"): "test",
        ("msrvtt-full", "msrvtt"): "test",
        ("cuhk-pedes", "cuhk-pedes"): "test",
        ("icfg-pedes", "icfg-pedes"): "test",
    }
    for (protocol, fmt), split in expected.items():
        assert default_split(protocol, data_format=fmt) == split
    for name in protocol_names():  # every registered protocol: its paper's test split first
        protocol = get_protocol(name)
        for fmt in protocol.splits:
            assert default_split(name, data_format=fmt) in protocol.paper_splits
    with pytest.raises(ValueError, match="protocol f30k evaluates precomp or karpathy data, not"):
        default_split("f30k", data_format="msrvtt")


def test_a_shards_run_reads_karpathy_data_and_a_folder_without_it_names_the_fix(tmp_path):
    shards = DataConfig(root="w", format="webdataset", shards="w/s/{0..1}.tar")
    assert stored_eval_data(shards).format == "karpathy"
    assert (
        stored_eval_data(shards, protocol="cuhk-pedes").format == "cuhk-pedes"
    )  # domain generalisation
    precomp = DataConfig(root="w", format="precomp")
    assert stored_eval_data(precomp, protocol="f30k") is precomp
    world = write_synthetic("tiny", tmp_path / "w")  # precomp: no Karpathy JSON, no images
    with pytest.raises(FileNotFoundError) as err:
        eval_data_config(karpathy_eval_data(shards), world)
    line = str(err.value)
    assert "expected the Karpathy JSON dataset_<name>.json in this folder, found none" in line
    assert "written in the precomp format" in line and "--format karpathy" in line
    empty = tmp_path / "e"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match="--data names the folder of a Karpathy JSON"):
        eval_data_config(dataclasses.replace(karpathy_eval_data(shards)), empty)


def test_report_takes_a_run_folder_as_eval_does(trained, tmp_path, capsys):
    run, world = trained / "run", trained / "w"
    explicit = [str(run / "best.pt"), "--data", str(world), "--split", "test", "--no-progress"]
    assert main(["report", *explicit, "--out", str(tmp_path / "a")]) == 0
    capsys.readouterr()
    # the run folder alone: its best.pt, its data.root, the default protocol's test split
    assert main(["report", str(run), "--out", str(tmp_path / "b"), "--no-progress"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[:3] == [
        f"checkpoint: {run / 'best.pt'} (the run's best.pt)",
        f"data: {world} (the run's data.root)",
        "split: test (protocol f30k's test split of precomp data)",
    ]
    given, taken = (
        json.loads((tmp_path / d / "report.json").read_text())["evaluation"] for d in "ab"
    )
    assert taken["protocol"] == given["protocol"] == "f30k"
    assert taken["split"] == "test" and taken["metrics"] == given["metrics"]
    # an explicit --split wins; a protocol of other data names --data
    assert main(["report", str(run), "--split", "dev", "--out", str(tmp_path / "c")]) == 0
    dev = json.loads((tmp_path / "c" / "report.json").read_text())["evaluation"]
    assert dev["split"] == "dev" and dev["metrics"] != given["metrics"]
    capsys.readouterr()
    assert main(["report", str(run), "--protocol", "cuhk-pedes", "--out", str(tmp_path / "d")]) == 2
    assert "pass its folder with --data" in capsys.readouterr().err
    assert not (tmp_path / "d").exists()


def test_prepare_evaluation_reads_each_checkpoint_once_and_takes_the_runs_defaults(
    trained, monkeypatch
):
    """The phases of vlret.run.evaluate: a run folder and a protocol alone give the run's
    best.pt, data.root and the protocol's split; the checkpoint file is read once (before:
    three times, for the defaults, the model and NCR's networks) and the split opened once."""
    import vlret.run.eval_members as members_module
    import vlret.run.evaluate as evaluate_module
    from vlret.run.evaluate import prepare_evaluation

    run, world = trained / "run", trained / "w"
    reads: list[Path] = []
    opened: list[str] = []
    real_load, real_build = members_module.load_checkpoint, evaluate_module.open_dataset

    def counted_load(path, **kwargs):
        reads.append(Path(path))
        return real_load(path, **kwargs)

    def counted_build(data, split, *args, **kwargs):
        opened.append(split)
        return real_build(data, split, *args, **kwargs)

    monkeypatch.setattr(members_module, "load_checkpoint", counted_load)
    monkeypatch.setattr(evaluate_module, "open_dataset", counted_build)
    prepared = prepare_evaluation(run, protocol="f30k", device="cpu")
    assert reads == [run / "best.pt"] and opened == ["test"]
    assert (prepared.root, prepared.split, prepared.checkpoints) == (world, "test", (reads[0],))
    assert prepared.notes == (
        f"checkpoint: {run / 'best.pt'} (the run's best.pt)",
        f"data: {world} (the run's data.root)",
        "split: test (protocol f30k's test split of precomp data)",
    )
    taken = prepared.run().metrics
    given = prepare_evaluation(
        run / "best.pt", data=world, split="test", protocol="f30k", device="cpu"
    )
    assert given.notes == () and given.run().metrics == taken
