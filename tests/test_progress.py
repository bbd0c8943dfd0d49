"""Progress bars: drawn by default on a terminal, never in a log or a pipe, switched off by
``--no-progress`` and ``train.progress = false``, and never an error without tqdm
(:mod:`vlret._progress`)."""

from __future__ import annotations

import io
import os
import sys

import numpy as np
import pytest
import yaml
from PIL import Image

from train_helpers import tiny_data, tiny_raw
from vlret import _progress
from vlret._progress import (
    QuietBar,
    bars_enabled,
    hugging_face_bars,
    progress_bar,
    set_enabled,
    shows,
    switched_off,
)
from vlret.cli import PROGRESS_COMMANDS, main
from zeroshot_helpers import CharTokenizer, Toy, ToySet


class Terminal(io.StringIO):
    """A stream that says it is a terminal, and keeps what was drawn on it."""

    def isatty(self) -> bool:
        return True


def on_a_terminal(monkeypatch) -> None:
    """The captured stderr (capsys) says it is a terminal, as a console's would."""
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)


def block_tqdm(monkeypatch) -> None:
    """``import tqdm`` / ``from tqdm.auto import tqdm`` fail, as in the core install."""
    for name in ("tqdm", "tqdm.auto"):
        monkeypatch.setitem(sys.modules, name, None)


@pytest.fixture(autouse=True)
def _not_a_rank(monkeypatch):
    monkeypatch.delenv("RANK", raising=False)


# -- the rule ----------------------------------------------------------------------------------


def test_a_terminal_gets_a_bar_that_counts_to_the_end():
    stream = Terminal()
    bar = progress_bar(range(7), file=stream, desc="counting", unit="item")
    assert not isinstance(bar, QuietBar)
    assert list(bar) == list(range(7))
    drawn = stream.getvalue()
    assert "counting" in drawn and "7/7" in drawn and "item/s" in drawn


def test_a_stream_that_is_no_terminal_gets_nothing(monkeypatch):
    plain = io.StringIO()
    monkeypatch.setattr(sys, "stderr", plain)
    bar = progress_bar(range(3), desc="counting")
    assert isinstance(bar, QuietBar) and list(bar) == [0, 1, 2]
    with progress_bar(total=5, desc="counting") as counted:
        counted.update(2)
        counted.set_postfix(loss="1.0")
        assert counted.n == 2 and len(counted) == 5
    assert plain.getvalue() == "" and not shows()


def test_the_default_stream_is_stderr_at_the_time_of_the_call(monkeypatch):
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    assert shows()
    list(progress_bar(range(2), desc="now"))
    assert "now" in terminal.getvalue()


@pytest.mark.parametrize("why", ["not asked", "switched off", "no tqdm", "rank 1"])
def test_nothing_is_drawn_on_a_terminal_when(why, monkeypatch):
    stream = Terminal()
    if why == "switched off":
        monkeypatch.setattr(_progress, "_ENABLED", False)
    elif why == "no tqdm":
        block_tqdm(monkeypatch)
    elif why == "rank 1":
        monkeypatch.setenv("RANK", "1")  # a torchrun rank before its process group exists
    bar = progress_bar(range(4), file=stream, show=why != "not asked", desc="counting")
    assert isinstance(bar, QuietBar) and sum(bar) == 6
    assert stream.getvalue() == ""


def test_a_jupyter_kernels_output_counts_as_a_terminal():
    kernel_stream = type("OutStream", (io.StringIO,), {"__module__": "ipykernel.iostream"})
    assert not kernel_stream().isatty() and shows(kernel_stream())
    assert not shows(io.StringIO())


def test_switched_off_restores_the_previous_setting():
    assert bars_enabled()
    with switched_off():
        assert not bars_enabled() and not shows(Terminal())
        with switched_off(False):  # not asked to: stays as it was
            assert not bars_enabled()
    assert bars_enabled() and shows(Terminal())
    assert set_enabled(False) is True and set_enabled(True) is False


# -- the command line --------------------------------------------------------------------------


@pytest.mark.parametrize("command", PROGRESS_COMMANDS)
def test_each_command_that_draws_bars_takes_no_progress(command, capsys):
    with pytest.raises(SystemExit):
        main([command, "--help"])
    assert "--no-progress" in capsys.readouterr().out


@pytest.mark.parametrize("flag", [[], ["--no-progress"]])
def test_no_progress_switches_bars_off_for_the_command_only(flag, monkeypatch, tmp_path):
    import vlret.cli.caption as caption

    seen = []

    def run(args):
        seen.append((bars_enabled(), args.no_progress))
        return 0

    monkeypatch.setattr(caption, "run", run)
    argv = ["caption", str(tmp_path), "--data", str(tmp_path), "--split", "train"]
    assert main([*argv, "--out", str(tmp_path / "c.txt"), *flag]) == 0
    assert seen == [(not flag, bool(flag))]
    assert bars_enabled()  # the next command (or test) starts with bars on


# -- commands, drawn on a (fake) terminal ------------------------------------------------------


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("progress")
    data = tiny_data(root / "data")
    config = root / "run.yaml"
    config.write_text(yaml.safe_dump(tiny_raw(data, root / "run")))
    assert main(["train", str(config), "--set", "train.epochs=1"]) == 0
    return data, root / "run" / "last.pt"


def run_config(tmp_path, progress: bool | None):
    raw = tiny_raw(tiny_data(tmp_path / "data"), tmp_path / "run")
    raw["train"].update(epochs=2, log_every=1)
    raw["train"].pop("progress")
    if progress is not None:
        raw["train"]["progress"] = progress
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_training_draws_its_bar_on_a_terminal_apart_from_the_epoch_lines(
    tmp_path, capsys, monkeypatch
):
    on_a_terminal(monkeypatch)
    assert main(["train", str(run_config(tmp_path, None))]) == 0  # the default: a bar
    out, err = capsys.readouterr()
    assert "epoch 0 (1/2)" in err and "epoch 1 (2/2)" in err and "batch" in err
    lines = out.splitlines()
    summaries = [line for line in lines if line.startswith("epoch ")]
    assert len(summaries) == 2  # the per-epoch line, printed whole, on stdout
    assert "\r" not in out and "batch/s" not in out


@pytest.mark.parametrize("off", ["no terminal", "--no-progress", "train.progress = false"])
def test_training_draws_nothing_when(off, tmp_path, capsys, monkeypatch):
    if off != "no terminal":
        on_a_terminal(monkeypatch)
    config = run_config(tmp_path, False if off == "train.progress = false" else None)
    flags = ["--no-progress"] if off == "--no-progress" else []
    assert main(["train", str(config), *flags]) == 0
    out, err = capsys.readouterr()
    assert "(1/2)" not in err and "\r" not in err
    assert len([line for line in out.splitlines() if line.startswith("epoch ")]) == 2


def eval_argv(trained):
    data, ckpt = trained
    return ["eval", str(ckpt), "--data", str(data), "--split", "test", "--protocol", "f30k"]


def test_eval_shows_its_encoding_on_a_terminal(trained, capsys, monkeypatch):
    on_a_terminal(monkeypatch)
    assert main(eval_argv(trained)) == 0
    out, err = capsys.readouterr()
    assert "encoding images" in err and "encoding captions" in err
    assert "rsum" in out and "encoding" not in out


@pytest.mark.parametrize("off", ["no terminal", "--no-progress"])
def test_eval_draws_nothing_when(off, trained, capsys, monkeypatch):
    if off != "no terminal":
        on_a_terminal(monkeypatch)
    flags = ["--no-progress"] if off == "--no-progress" else []
    assert main([*eval_argv(trained), *flags]) == 0
    out, err = capsys.readouterr()
    assert "rsum" in out and "encoding" not in err and "\r" not in err


def test_without_tqdm_eval_and_train_run_and_draw_nothing(trained, tmp_path, capsys, monkeypatch):
    on_a_terminal(monkeypatch)
    block_tqdm(monkeypatch)
    assert main(eval_argv(trained)) == 0
    out, err = capsys.readouterr()
    assert "rsum" in out and err == ""
    assert main(["train", str(run_config(tmp_path, True))]) == 0
    out, err = capsys.readouterr()
    assert len([line for line in out.splitlines() if line.startswith("epoch ")]) == 2
    assert "\r" not in err and "needs tqdm" not in err


def test_mine_negatives_shows_encoding_and_mining(trained, tmp_path, capsys, monkeypatch):
    data, ckpt = trained
    argv = ["mine-negatives", str(ckpt), "--data", str(data), "--k", "4"]
    on_a_terminal(monkeypatch)
    assert main([*argv, "--out", str(tmp_path / "a.npz")]) == 0
    err = capsys.readouterr().err
    assert "encoding images" in err and "mining" in err and "caption" in err
    assert main([*argv, "--out", str(tmp_path / "b.npz"), "--no-progress"]) == 0
    assert "mining" not in capsys.readouterr().err


def test_report_shows_its_thumbnails(trained, tmp_path, capsys, monkeypatch):
    data, ckpt = trained
    argv = ["report", str(ckpt), "--data", str(data), "--split", "test"]
    argv += ["--top-k", "1", "--samples", "1", "--worst", "1"]
    on_a_terminal(monkeypatch)
    assert main([*argv, "--out", str(tmp_path / "a")]) == 0
    err = capsys.readouterr().err
    assert "encoding images" in err and "thumbnails" in err
    assert main([*argv, "--out", str(tmp_path / "b"), "--no-progress"]) == 0
    assert "thumbnails" not in capsys.readouterr().err


@pytest.mark.parametrize("terminal", [True, False])
def test_compare_draws_one_bar_over_its_plan_and_none_per_run(
    terminal, tmp_path, capsys, monkeypatch
):
    raw = tiny_raw(tiny_data(tmp_path / "data"), tmp_path / "base")
    raw["train"].pop("progress")  # the run's default: a bar, which a comparison's run leaves out
    raw["train"]["epochs"] = 1
    config = tmp_path / "cmp.yaml"
    config.write_text(yaml.safe_dump(raw))
    if terminal:
        on_a_terminal(monkeypatch)
    argv = ["compare", str(config), "--losses", "triplet", "--seeds", "1"]
    assert main([*argv, "--out", str(tmp_path / "out")]) == 0
    err = capsys.readouterr().err
    assert ("1/1 [" in err and "epoch" in err) == terminal  # the plan's bar, counted in epochs
    assert "batch" not in err and "(1/1):" not in err  # no per-run, per-batch bar
    stored = yaml.safe_load((tmp_path / "out/runs/triplet/seed0/config.yaml").read_text())
    assert stored["train"]["progress"] is False


@pytest.mark.parametrize("terminal", [True, False])
def test_zeroshot_shows_the_prompts_and_the_images_on_a_terminal(terminal, capsys, monkeypatch):
    from vlret.eval.zeroshot import evaluate_zeroshot

    rng = np.random.default_rng(0)
    images = [Image.fromarray(rng.integers(0, 256, (4, 4, 3), dtype=np.uint8)) for _ in range(6)]
    data = ToySet("toy", "test", ["cat", "dog"], [0, 1] * 3, images)
    if terminal:
        on_a_terminal(monkeypatch)
    result = evaluate_zeroshot(
        Toy(), data, ["a {c}", "{c}"], tokenizer=CharTokenizer(), batch_size=2, progress=True
    )
    assert (result.num_images, result.num_classes, result.num_templates) == (6, 2, 2)
    err = capsys.readouterr().err
    assert ("class prompts" in err and "toy images" in err) == terminal
    assert terminal or err == ""


@pytest.fixture
def hf_logging(monkeypatch):
    if "HF_HUB_DISABLE_PROGRESS_BARS" in os.environ:
        pytest.skip("HF_HUB_DISABLE_PROGRESS_BARS decides Hugging Face's bars here")
    logging = pytest.importorskip("transformers.utils.logging")
    import huggingface_hub.utils as hub

    assert logging.is_progress_bar_enabled() and not hub.are_progress_bars_disabled()
    return logging, hub


def test_hugging_face_bars_are_off_where_vlret_draws_none(hf_logging):
    logging, hub = hf_logging
    with hugging_face_bars(False):
        assert not logging.is_progress_bar_enabled() and hub.are_progress_bars_disabled()
    assert logging.is_progress_bar_enabled() and not hub.are_progress_bars_disabled()
    with hugging_face_bars(True):
        assert logging.is_progress_bar_enabled()


@pytest.mark.parametrize(
    ("terminal", "flag", "drawn"),
    [(True, [], True), (True, ["--no-progress"], False), (False, [], False)],
)
def test_a_command_loads_models_without_their_bars_where_it_draws_none(
    terminal, flag, drawn, hf_logging, monkeypatch, tmp_path
):
    import vlret.cli.zeroshot as zeroshot

    logging, _ = hf_logging
    seen = []

    def run(args):
        seen.append(logging.is_progress_bar_enabled())
        return 0

    monkeypatch.setattr(zeroshot, "run", run)
    if terminal:
        on_a_terminal(monkeypatch)
    argv = ["zeroshot", "--model", str(tmp_path), "--dataset", "imagefolder"]
    assert main([*argv, "--data-root", str(tmp_path), *flag]) == 0
    assert seen == [drawn] and logging.is_progress_bar_enabled()
