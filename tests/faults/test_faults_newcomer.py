"""Fault pass, newcomer friction (issue 26, item 11): ``vlret synth`` checks every extra a world
needs before writing anything, a world whose writing stopped half-way does not block the rerun
(a whole one still needs ``--overwrite``), and the printed MMT command trains as printed.

"Without transformers" (or Pillow) is ``sys.modules[name] = None``: the import then raises
ImportError, as on an install without the ``hf`` extra.
"""

from __future__ import annotations

import json
import resource
import shlex
import signal
import sys
from dataclasses import replace
from pathlib import Path

import pytest

import vlret.worlds.bert as bert_module
import vlret.worlds.io as io_module
from vlret.cli import main
from vlret.worlds import PRESETS

#: a cut of the video-experts world: seconds, not the preset's 3000 / 300 / 1000 videos
SMALL = {"train": 12, "dev": 4, "test": 6}


@pytest.fixture
def small_experts(monkeypatch):
    """`vlret synth video-experts` writes the cut world (the CLI has no size options)."""
    monkeypatch.setitem(
        PRESETS, "video-experts", replace(PRESETS["video-experts"], splits=SMALL, n_1ka=3)
    )


def _one_line(err: str) -> str:
    assert err.startswith("vlret synth: ") and err.count("\n") == 1, err
    return err


def _synth(out: Path, *extra: str) -> int:
    return main(["synth", "video-experts", "--out", str(out), *extra])


# --------------------------------------------------------------- extras checked before writing


def test_random_bert_without_transformers_writes_nothing(tmp_path, capsys, monkeypatch):
    # Before: the whole world (25 MB) was written, then "needs transformers"; the rerun after
    # installing transformers was refused without --overwrite.
    monkeypatch.setitem(sys.modules, "transformers", None)
    out = tmp_path / "w"
    assert _synth(out, "--random-bert") == 2
    err = _one_line(capsys.readouterr().err)
    assert "--random-bert needs transformers" in err and "pip install 'vlret[hf]'" in err
    assert not out.exists()


def test_random_bert_on_a_picture_world_writes_nothing(tmp_path, capsys):
    out = tmp_path / "w"
    args = ["synth", "tiny", "--out", str(out), "--random-bert", "--format", "karpathy"]
    assert main(args) == 2
    err = _one_line(capsys.readouterr().err)
    assert "--random-bert needs an MSR-VTT-format world" in err and "'karpathy'" in err
    assert not out.exists()


def test_rendered_images_without_pillow_is_one_line(tmp_path, capsys, monkeypatch):
    # Before: an ImportError traceback (a plain ImportError, which the CLI did not catch).
    monkeypatch.setitem(sys.modules, "PIL", None)
    out = tmp_path / "w"
    assert main(["synth", "tiny", "--out", str(out), "--format", "karpathy"]) == 2
    err = _one_line(capsys.readouterr().err)
    assert "needs Pillow" in err and "pip install 'vlret[hf]'" in err
    assert not out.exists()


# ------------------------------------------------------- a world that stopped half-way


class Stopped(BaseException):
    """Stands for Ctrl-C or a kill half-way through the writing."""


def test_a_world_stopped_at_the_bert_is_replaced_by_the_rerun(
    tmp_path, capsys, monkeypatch, small_experts
):
    # Before: the world was whole on disk but its BERT was not; the rerun was refused
    # ("already holds a synthetic world; pass --overwrite").
    out = tmp_path / "w"
    real = bert_module.write_random_bert

    def stop_half_way(folder, captions, **kw):
        Path(folder).mkdir(parents=True)
        (Path(folder) / "vocab.txt").write_text("[PAD]\n")
        raise Stopped

    monkeypatch.setattr(bert_module, "write_random_bert", stop_half_way)
    with pytest.raises(Stopped):
        _synth(out, "--random-bert")
    assert (out / io_module.UNFINISHED_FILE).is_file()
    monkeypatch.setattr(bert_module, "write_random_bert", real)
    capsys.readouterr()
    assert _synth(out, "--random-bert") == 0
    assert not (out / io_module.UNFINISHED_FILE).exists()
    assert (out / "random-bert" / "config.json").is_file()
    assert (out / "synthetic.json").is_file()
    # a whole world is still refused without --overwrite
    capsys.readouterr()
    assert _synth(out, "--random-bert", "--seed", "3") == 2
    err = _one_line(capsys.readouterr().err)
    assert "already holds a synthetic world" in err and "--overwrite" in err


def test_a_world_stopped_mid_write_is_replaced_by_the_rerun(tmp_path, capsys, monkeypatch):
    # Before: the rerun was refused ("not empty and holds no synthetic.json; pass --overwrite")
    out = tmp_path / "w"
    real = io_module._write_side_files

    def stop(*args, **kw):
        raise Stopped

    monkeypatch.setattr(io_module, "_write_side_files", stop)
    with pytest.raises(Stopped):
        main(["synth", "tiny", "--out", str(out)])
    assert (out / "train_ims.npy").is_file() and not (out / "synthetic.json").exists()
    monkeypatch.setattr(io_module, "_write_side_files", real)
    capsys.readouterr()
    assert main(["synth", "tiny", "--out", str(out)]) == 0
    assert json.loads((out / "synthetic.json").read_text())["preset"] == "tiny"
    assert not (out / io_module.UNFINISHED_FILE).exists()


def test_overwriting_a_world_that_stops_half_way_leaves_no_whole_looking_world(
    tmp_path, monkeypatch
):
    # An overwrite that stops must not leave the old synthetic.json describing new data:
    # `vlret demo` reuses a world by its synthetic.json.
    out = tmp_path / "w"
    assert main(["synth", "tiny", "--out", str(out)]) == 0
    monkeypatch.setattr(
        io_module, "_write_side_files", lambda *a, **k: (_ for _ in ()).throw(Stopped)
    )
    with pytest.raises(Stopped):
        main(["synth", "tiny", "--out", str(out), "--seed", "1", "--overwrite"])
    assert not (out / "synthetic.json").exists()
    assert io_module.is_unfinished(out)


def test_a_full_disk_mid_world_is_one_line_and_the_rerun_is_not_refused(tmp_path, capsys):
    # RLIMIT_FSIZE below the feature file: the write fails with EFBIG half-way through.
    out = tmp_path / "w"
    old_limit = resource.getrlimit(resource.RLIMIT_FSIZE)
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, old_limit[1]))
    try:
        code = main(["synth", "tiny", "--out", str(out)])
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old_limit)
        signal.signal(signal.SIGXFSZ, old_handler)
    assert code == 2
    err = _one_line(capsys.readouterr().err)
    assert str(out) in err
    assert io_module.is_unfinished(out)
    assert main(["synth", "tiny", "--out", str(out)]) == 0
    assert not io_module.is_unfinished(out)


def test_overwrite_replaces_the_worlds_random_bert(tmp_path, capsys, small_experts):
    # Before: --overwrite --random-bert on a world with its BERT ended in a FileExistsError
    # traceback ("already holds a model (config.json)") after rewriting the world.
    out = tmp_path / "w"
    assert _synth(out, "--random-bert") == 0
    vocab = (out / "random-bert" / "vocab.txt").read_text()
    assert _synth(out, "--random-bert", "--overwrite", "--seed", "2") == 0
    assert (out / "random-bert" / "config.json").is_file()
    assert (out / "random-bert" / "vocab.txt").read_text().splitlines()[:5] == vocab.splitlines()[
        :5
    ]
    # a world rewritten without --random-bert keeps no BERT of the old world's captions
    assert _synth(out, "--overwrite") == 0
    assert not (out / "random-bert").exists()
    capsys.readouterr()


# ------------------------------------------------------------ the printed MMT command


def _printed_commands(text: str) -> dict[str, list[str]]:
    """config name -> its --set overrides, for every `vlret train` command printed."""
    out = {}
    for line in text.splitlines():
        if "vlret train " not in line:
            continue
        argv = shlex.split(line[line.index("vlret train ") :])
        out[argv[2]] = [argv[i + 1] for i, a in enumerate(argv) if a == "--set"]
    return out


@pytest.mark.parametrize("config", ["synth_video_experts_ce", "synth_video_experts_mmt"])
def test_printed_expert_commands_train_as_printed(
    tmp_path, capsys, monkeypatch, small_experts, config
):
    # Before: the MMT config kept its own text.path (runs/data-video-experts/random-bert), so
    # on a world written anywhere else it failed: "...random-bert: missing; expected a local
    # tokenizer directory".
    from vlret.run import load_config
    from vlret.train import train

    out = tmp_path / "world"
    monkeypatch.chdir(tmp_path)  # no runs/data-video-experts here
    assert _synth(out, "--random-bert") == 0
    commands = _printed_commands(capsys.readouterr().out)
    assert set(commands) == {"synth_video_experts_ce", "synth_video_experts_mmt"}
    sets = commands[config]
    if config.endswith("mmt"):
        assert f"model.text.path={out / 'random-bert'}" in sets
    run = [
        "train.epochs=1",
        "train.max_steps_per_epoch=1",
        "train.batch_size=4",
        "train.progress=false",
        f"output_dir={tmp_path / 'run'}",
    ]
    result = train(load_config(config, [*sets, *run]))
    assert result.steps == 1


def test_hint_without_the_bert_says_how_to_write_it(tmp_path, capsys, small_experts):
    out = tmp_path / "world"
    assert _synth(out) == 0
    text = capsys.readouterr().out
    assert "synth_video_experts_mmt" in text and "--random-bert" in text


def test_a_read_only_out_is_refused_before_the_world_is_made(tmp_path, capsys, monkeypatch):
    # Before: the world was generated, then the first write failed (one line, after the work).
    from fault_helpers import read_only_folder

    def never(*args, **kw):
        raise AssertionError("the world was generated before the folder was checked")

    monkeypatch.setattr(io_module, "generate_world", never)
    with read_only_folder(tmp_path / "ro") as folder:
        assert main(["synth", "tiny", "--out", str(folder / "w")]) == 2
        err = _one_line(capsys.readouterr().err)
        assert "--out" in err and str(folder) in err
