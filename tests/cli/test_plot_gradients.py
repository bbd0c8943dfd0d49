"""``vlret train --log-gradients N`` and ``vlret plot gradients`` on a tiny run
(vlret.analysis.gradient_log)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("matplotlib")

from PIL import Image  # noqa: E402

from train_helpers import model_params, tiny_config, tiny_data  # noqa: E402
from vlret.analysis.gradient_log import GradientLog, read_gradient_log  # noqa: E402
from vlret.analysis.gradients import gradient_record  # noqa: E402
from vlret.cli import main  # noqa: E402
from vlret.train import StepOutput, Trainer, TrainHook  # noqa: E402

OVERRIDES = ["train.epochs=2"]


class KeepBatches(TrainHook):
    """Keeps the embeddings of every step (to recompute the log's records)."""

    def __init__(self) -> None:
        self.steps: dict[int, dict] = {}

    def after_step(self, ctx, step: StepOutput) -> None:
        self.steps[ctx.step] = {k: step.context[k].clone() for k in ("img", "txt", "ids")}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("gradients")
    data = tiny_data(root / "data")
    keep = KeepBatches()
    logged = Trainer(
        tiny_config(data, root / "logged", OVERRIDES),
        hooks=[GradientLog(every=3), keep],
        print_fn=None,
    )
    logged.fit()
    plain = Trainer(tiny_config(data, root / "plain", OVERRIDES), print_fn=None)
    plain.fit()
    return root, data, logged, plain, keep


def test_the_log_holds_every_nth_step_and_changes_nothing(runs):
    root, _, logged, plain, keep = runs
    records = read_gradient_log(root / "logged")
    steps = [r["step"] for r in records]
    assert steps == list(range(1, logged.context.step + 1, 3))  # 1, 4, 7, 10 of 10
    assert {r["epoch"] for r in records} == {0, 1}
    # the records are the analysis of each step's own batch, recomputed here
    for rec in records:
        batch = keep.steps[rec["step"]]
        expected = gradient_record(logged.loss_fn, batch["img"], batch["txt"], img_ids=batch["ids"])
        for key, value in expected.items():
            assert rec[key] == (pytest.approx(value, rel=1e-9) if key[3] == "_" else value), key
    # the run with the log trained exactly as the run without
    a, b = model_params(logged.model), model_params(plain.model)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_vlret_plot_gradients_draws_one_png(runs, tmp_path, capsys):
    root = runs[0]
    out = tmp_path / "fig.png"
    assert main(["plot", "gradients", str(root / "logged"), "--out", str(out)]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    with Image.open(out) as im:
        assert im.format == "PNG" and im.size[0] > 1000
    rel = tmp_path / "rel.png"
    assert main(["plot", "gradients", str(root / "logged"), "--out", str(rel), "--relative"]) == 0
    assert rel.stat().st_size > 0


def test_vlret_train_log_gradients_option(tmp_path, capsys):
    data = tiny_data(tmp_path / "data")
    config = tmp_path / "tiny.toml"
    config.write_text(
        f"""output_dir = "{tmp_path / "run"}"
[data]
root = "{data}"
format = "precomp"
min_count = 1
[model]
embed_dim = 16
image = {{ kind = "precomp", in_dim = 16, pooling = "max" }}
text = {{ kind = "gru", word_dim = 8, bidirectional = true, pooling = "last" }}
[loss]
name = "unified"
[optim]
name = "adam"
lr = 0.001
[train]
epochs = 1
batch_size = 8
progress = false
""",
        encoding="utf-8",
    )
    assert main(["train", str(config), "--log-gradients", "2"]) == 0
    lines = (tmp_path / "run" / "gradients.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1, 3, 5]
    assert json.loads(lines[0])["loss"] == "unified"
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:  # argparse's own one line
        main(["train", str(config), "--log-gradients", "0"])
    assert exit_.value.code == 2
    assert "--log-gradients" in capsys.readouterr().err


def _log(path: Path, lines: list[str]) -> Path:
    path.mkdir(parents=True)
    (path / "gradients.jsonl").write_text("".join(x + "\n" for x in lines), encoding="utf-8")
    return path


@pytest.mark.parametrize(
    "argv, message",
    [
        (["plot", "gradients"], "gradients needs at least one RUN folder"),
        (["plot", "gradients", "{a}", "{b}"], "gradients of several runs needs --out FILE.png"),
        (["plot", "gradients", "{a}", "--out", "{tmp}/x.pdf"], "expected a .png file"),
        (["plot", "gradients", "{tmp}/none", "--out", "{tmp}/x.png"], "no gradient log"),
        (["plot", "gradients", "{empty}", "--out", "{tmp}/x.png"], "no gradient record"),
        (["plot", "gradients", "{a}", "{a}", "--out", "{tmp}/x.png"], "given twice"),
    ],
)
def test_vlret_plot_gradients_errors_are_one_line(tmp_path, capsys, argv, message):
    rec = {"kind": "gradients", "step": 1, "epoch": 0, "loss": "triplet", "i2t_tangent": 1.0}
    a = _log(tmp_path / "a", [json.dumps(rec)])
    b = _log(tmp_path / "b", [json.dumps(rec)])
    empty = _log(tmp_path / "empty", ['{"kind": "epoch", "step": 3}', '{"cut'])
    names = {"a": a, "b": b, "empty": empty, "tmp": tmp_path}
    assert main([x.format(**names) for x in argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("vlret plot: ") and message in err and "\n" not in err


def test_a_model_that_keeps_no_embeddings_is_refused(tmp_path):
    data = tiny_data(tmp_path / "data")
    config = tiny_config(data, tmp_path / "run", [*OVERRIDES, "train.grad_cache_chunk=4"])
    with pytest.raises(ValueError, match="gradient caching"):
        Trainer(config, hooks=[GradientLog(every=1)], print_fn=None).fit()
    with pytest.raises(ValueError, match="every must be a positive integer"):
        GradientLog(every=0)


def test_a_resumed_run_drops_the_records_after_its_checkpoint(tmp_path):
    data = tiny_data(tmp_path / "data")
    first = Trainer(
        tiny_config(data, tmp_path / "run", ["train.epochs=1"]),
        hooks=[GradientLog(every=2)],
        print_fn=None,
    )
    first.fit()
    log = tmp_path / "run" / "gradients.jsonl"
    with log.open("a", encoding="utf-8") as fh:  # written after the checkpoint by a killed run
        fh.write(json.dumps({"kind": "gradients", "epoch": 1, "step": 7}) + "\n")
    again = Trainer(
        tiny_config(data, tmp_path / "run", ["train.epochs=2"]),
        resume=tmp_path / "run" / "last.pt",
        hooks=[GradientLog(every=2)],
        print_fn=None,
    )
    again.fit()
    steps = [r["step"] for r in read_gradient_log(log)]
    assert steps == [1, 3, 5, 7, 9]
    assert all("i2t_tangent" in r for r in read_gradient_log(log))  # the stray line is gone
