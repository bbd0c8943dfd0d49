"""``vlret eval`` runs what it lists: every ``--protocol`` choice runs on a small synthetic
stand-in (tiny runs trained here, person-search folders and an image folder written by PIL),
zero-shot classification gives ``vlret zeroshot``'s numbers and record, and an option a task
does not take is one line naming it."""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import pytest

from pedes_helpers import CUHK_IMAGES, TINY_CLIP, write_pedes
from train_helpers import tiny_data, tiny_msrvtt_run_config, tiny_raw
from vlret.cli import build_parser, main
from vlret.eval import get_task, task_names
from vlret.run.checkpoint import load_checkpoint, save_checkpoint

pytest.importorskip("transformers")
Image = pytest.importorskip("PIL.Image")


def _eval_protocol_choices() -> list[str]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    action = next(a for a in sub.choices["eval"]._actions if a.dest == "protocol")
    return list(action.choices)


def _run(args) -> int:
    return main([str(a) for a in args])


def _image_folder(root: Path) -> Path:
    """Three colour classes, two PNGs each (PIL writes them)."""
    for k, name in enumerate(("red", "green", "blue")):
        folder = root / name
        folder.mkdir(parents=True)
        for i in range(2):
            rgb = [0, 0, 0]
            rgb[k] = 180 + 30 * i
            Image.new("RGB", (20, 18), tuple(rgb)).save(folder / f"{i}.png")
    return root


def _retarget(checkpoint: Path, out: Path, fmt: str, root: Path) -> Path:
    """``checkpoint`` with its stored data section pointing at ``fmt`` data under ``root``."""
    state = load_checkpoint(checkpoint)
    state["config"]["data"].update(format=fmt, root=str(root))
    out.mkdir(parents=True)
    save_checkpoint(state, out / "best.pt")
    return out


@pytest.fixture(scope="module")
def stand_ins(tmp_path_factory):
    """Per protocol: the run folder (or checkpoint) and the extra arguments it runs with."""
    root = tmp_path_factory.mktemp("tasks")
    precomp = tiny_data(root / "precomp")
    raw = tiny_raw(precomp, root / "vse")
    raw["train"]["epochs"] = 1
    (root / "vse.json").write_text(json.dumps(raw))
    assert _run(["train", root / "vse.json"]) == 0
    msrvtt_root, msrvtt_cfg = tiny_msrvtt_run_config(root / "mv")
    assert _run(["train", msrvtt_cfg]) == 0
    cuhk = write_pedes(root / "cuhk").parent
    folder = _image_folder(root / "colours")
    clip = {
        "output_dir": str(root / "clip"),
        "data": {"root": str(cuhk), "format": "cuhk-pedes"},
        "model": {"kind": "clip", "preset": "ViT-B-32", "tokenizer": "bytes", "config": TINY_CLIP},
        "loss": {"name": "infonce"},
        "optim": {"lr": 1e-4},
        "train": {
            "epochs": 1,
            "batch_size": 4,
            "progress": False,
            "eval_batch_size": 8,
            "max_steps_per_epoch": 1,
            "device": "cpu",
            "zeroshot_every": 1,
            "zeroshot_dataset": "imagefolder",
            "zeroshot_root": str(folder),
        },
    }
    (root / "clip.json").write_text(json.dumps(clip))
    assert _run(["train", root / "clip.json"]) == 0
    runs = {
        "f30k": (root / "vse", []),
        "coco1k": (root / "vse", []),  # precomp testall: 5 images, 5 folds of 1
        "coco5k": (root / "vse", []),
        "msrvtt-full": (root / "mv" / "run", []),
        "msrvtt-1ka": (root / "mv" / "run", []),
        "cuhk-pedes": (root / "clip", []),
        "zeroshot-classification": (root / "clip", []),  # the run's train.zeroshot_* defaults
    }
    for fmt in ("icfg-pedes", "rstpreid"):
        # ICFG-PEDES has no validation split: its images go to test
        images = [(p, "test" if s == "val" else s, n) for p, s, n in CUHK_IMAGES]
        data = write_pedes(root / fmt, fmt, images).parent
        runs[fmt] = (_retarget(root / "clip" / "best.pt", root / f"run-{fmt}", fmt, data), [])
    return {"root": root, "runs": runs, "folder": folder, "msrvtt": msrvtt_root}


def test_every_protocol_eval_offers_is_a_task_with_a_stand_in(stand_ins):
    assert _eval_protocol_choices() == list(task_names())
    assert set(_eval_protocol_choices()) == set(stand_ins["runs"])  # a new task needs one here


@pytest.mark.parametrize("protocol", _eval_protocol_choices())
def test_eval_runs_what_it_lists(stand_ins, protocol, tmp_path, capsys):
    run, extra = stand_ins["runs"][protocol]
    out = tmp_path / "m.json"
    args = ["eval", run, "--protocol", protocol, "--no-progress", *extra]
    assert _run([*args, "--check"]) == 0
    assert "check passed: nothing encoded, nothing written" in capsys.readouterr().out
    assert _run([*args, "--json", out]) == 0
    printed = capsys.readouterr().out
    record = json.loads(out.read_text())
    task = get_task(protocol)
    assert record["protocol"] == protocol and record["split"] in task.protocol.paper_splits
    assert set(record["metrics"]) == set(task.metrics)
    assert record["title"] in printed


def test_zeroshot_through_eval_equals_vlret_zeroshot(stand_ins, tmp_path, capsys):
    checkpoint = stand_ins["runs"]["zeroshot-classification"][0] / "best.pt"
    folder = stand_ins["folder"]
    a, b, c = tmp_path / "eval.json", tmp_path / "zeroshot.json", tmp_path / "vlret.json"
    common = ["--batch-size", "4", "--no-progress", "--templates", "openai"]
    argv = ["eval", checkpoint, "--protocol", "zeroshot-classification", "--dataset"]
    argv += ["imagefolder", "--data", folder, *common]
    assert _run([*argv, "--json", a, "--json-format", "clip_benchmark"]) == 0
    table = capsys.readouterr().out
    assert _run([*argv, "--json", c]) == 0
    capsys.readouterr()
    zs = ["zeroshot", "--model", checkpoint, "--dataset", "imagefolder", "--data-root", folder]
    assert _run([*zs, *common, "--json", b]) == 0
    assert json.loads(a.read_text()) == json.loads(b.read_text())  # the same record
    assert table.splitlines()[0] == capsys.readouterr().out.splitlines()[0]
    mine = json.loads(c.read_text())
    assert mine["metrics"] == json.loads(b.read_text())["metrics"]
    assert (mine["checkpoint"], mine["n_images"], mine["n_classes"]) == (str(checkpoint), 6, 3)
    assert mine["n_templates"] == 80 and mine["dataset"] == "imagefolder/colours"


def test_zeroshot_classnames_file_names_the_classes(stand_ins, tmp_path, capsys):
    names = tmp_path / "names.txt"
    names.write_text("azure\nlime\nscarlet\n")  # the sorted folders: blue, green, red
    run = stand_ins["runs"]["zeroshot-classification"][0]
    out = tmp_path / "z.json"
    base = ["--protocol", "zeroshot-classification", "--classnames", names, "--no-progress"]
    assert _run(["eval", run, *base, "--json", out]) == 0
    assert json.loads(out.read_text())["n_classes"] == 3
    zs = ["zeroshot", "--model", run / "best.pt", "--dataset", "imagefolder", "--data-root"]
    assert _run([*zs, stand_ins["folder"], "--classnames", names, "--no-progress"]) == 0
    names.write_text("one\ntwo\n")
    assert _run(["eval", run, *base]) == 2
    assert "names.txt: holds 2 class names for the 3 class folders" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("protocol", "extra", "words"),
    [
        ("zeroshot-classification", ["--shortlist", "3"], "--shortlist: protocol zeroshot-"),
        ("zeroshot-classification", ["--captions-per-image", "5"], "--captions-per-image: "),
        ("zeroshot-classification", ["--rescore", "dsl"], "--rescore: protocol zeroshot-"),
        ("f30k", ["--templates", "openai"], "--templates: protocol f30k (retrieval) does not"),
        ("f30k", ["--dataset", "cifar10"], "--dataset: protocol f30k (retrieval)"),
        ("zeroshot-classification", ["--split", "dev"], "--split: protocol zeroshot-classif"),
        ("zeroshot-classification", ["--num-workers", "-1"], "--num-workers must be >= 0"),
        ("zeroshot-classification", ["--json-format", "clip_benchmark"], "give --json OUT"),
        ("zeroshot-classification", ["--data", "nowhere"], "--data nowhere: missing"),
        ("zeroshot-classification", ["--device", "tpu"], "--device"),
        ("zeroshot-classification", ["--templates", "nope"], "nope"),
    ],
)
def test_bad_input_is_one_line_naming_the_option(stand_ins, protocol, extra, words, capsys):
    run = stand_ins["runs"]["zeroshot-classification"][0]
    assert _run(["eval", run, "--protocol", protocol, "--no-progress", *extra]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert err.startswith("vlret eval: ") and "\n" not in err and "Traceback" not in err
    assert words in err
    assert captured.out == ""


def test_zeroshot_refuses_an_ensemble_and_a_model_without_pixels(stand_ins, capsys):
    clip, vse = stand_ins["runs"]["zeroshot-classification"][0], stand_ins["runs"]["f30k"][0]
    args = ["--protocol", "zeroshot-classification", "--no-progress"]
    assert _run(["eval", clip, clip, *args]) == 2
    assert "RUN_OR_CKPT: zero-shot classification scores one model, got 2" in (
        capsys.readouterr().err
    )
    folder = stand_ins["folder"]
    assert _run(["eval", vse, *args, "--dataset", "imagefolder", "--data", folder]) == 2
    err = capsys.readouterr().err
    assert "encodes precomputed features, not pixels" in err and err.count("\n") == 1


def test_zeroshot_needs_a_set_where_the_run_names_none(stand_ins, tmp_path, capsys):
    clip = stand_ins["runs"]["zeroshot-classification"][0] / "best.pt"
    state = load_checkpoint(clip)
    state["config"]["train"].update(zeroshot_every=0, zeroshot_dataset="", zeroshot_root="")
    save_checkpoint(state, tmp_path / "plain.pt")
    args = ["eval", tmp_path / "plain.pt", "--protocol", "zeroshot-classification"]
    assert _run([*args, "--no-progress"]) == 2
    assert "--dataset: required" in capsys.readouterr().err
    assert _run([*args, "--dataset", "imagefolder", "--no-progress"]) == 2
    assert "--data: required, the folder of the imagefolder set" in capsys.readouterr().err
    shutil.copytree(stand_ins["folder"], tmp_path / "again")
    assert _run([*args, "--dataset", "imagefolder", "--data", tmp_path / "again", "--check"]) == 0
    assert "data: imagefolder/again in" in capsys.readouterr().out


def test_protocols_long_says_what_each_task_runs_on(capsys):
    assert main(["protocols", "--long"]) == 0
    lines = capsys.readouterr().out.splitlines()
    heads = [line for line in lines if not line.startswith("    ")]
    assert [h.split()[0] for h in heads] == list(task_names())
    at = lines.index(get_task("zeroshot-classification").line())
    block = lines[at + 1 : at + 7]
    assert block[0].startswith("    model: one vlret checkpoint or run folder of a model")
    assert block[3].startswith("    classes: the set's class names (--classnames FILE")
    assert block[5] == "    metrics: acc1, acc5, mean_per_class_recall"
    f30k = lines[
        lines.index(get_task("f30k").line()) + 1 : lines.index(get_task("f30k").line()) + 6
    ]
    assert f30k[2].startswith("    split: precomp test/dev; karpathy test/dev (default:")
    assert not any(line.startswith("    classes:") for line in f30k)


@pytest.mark.parametrize("layout", ["v5", "none"])
def test_zeroshot_of_a_clip_folder_equals_vlret_zeroshot(stand_ins, tmp_path, capsys, layout):
    """--model-dir: a folder transformers' save_pretrained wrote (``none``: no processor file,
    taken with --default-preprocessing openai-clip, as vlret zeroshot takes it)."""
    from clip_folder_helpers import tiny_clip_parts, write_folder

    folder = write_folder(tmp_path / "clip", tiny_clip_parts(tmp_path), layout)
    extra = ["--default-preprocessing", "openai-clip"] if layout == "none" else []
    a, b = tmp_path / "eval.json", tmp_path / "zeroshot.json"
    common = ["--dataset", "imagefolder", "--no-progress", "--device", "cpu", *extra]
    argv = ["eval", "--model-dir", folder, "--protocol", "zeroshot-classification", *common]
    assert _run([*argv, "--data", stand_ins["folder"], "--check"]) == 0
    assert "(a local Hugging Face CLIP folder)" in capsys.readouterr().out
    assert _run([*argv, "--data", stand_ins["folder"], "--json", a]) == 0
    zs = ["zeroshot", "--model", folder, "--data-root", stand_ins["folder"], *common]
    assert _run([*zs, "--json", b]) == 0
    mine, theirs = json.loads(a.read_text()), json.loads(b.read_text())
    assert mine["metrics"] == theirs["metrics"] and mine["model_dir"] == str(folder)
    assert theirs["vlret"]["model_source"] == "hf-clip"
    if layout == "none":  # without the flag the folder is refused, in one line
        assert _run([*argv[:-2], "--data", stand_ins["folder"]]) == 2
        assert "processor" in capsys.readouterr().err
