"""Zero-shot classification: the metrics against a naive float64 loop, the classifier and the
logits against their definitions (CLIP_benchmark's), a tiny Hugging Face CLIP end to end, the
protocol record and ``vlret zeroshot``."""

from __future__ import annotations

import json
import math
import types
from pathlib import Path

import numpy as np
import pytest
import torch

from vlret.cli import main
from vlret.eval import get_protocol, protocol_names
from vlret.eval.protocols import EvalProtocol
from vlret.eval.zeroshot import (
    ZeroShotResult,
    evaluate_zeroshot,
    fill_template,
    zeroshot_classifier,
    zeroshot_logits,
)
from vlret.metrics import ZEROSHOT_METRICS, zeroshot_classification_metrics
from vlret.metrics import zeroshot as zs_metrics
from zeroshot_helpers import CharTokenizer, Toy, ToySet, to_pixels

Image = pytest.importorskip("PIL.Image")

# ------------------------------------------------------------------------------------------
# The metrics
# ------------------------------------------------------------------------------------------


def naive_metrics(logits, labels, ties="against"):
    """acc1, acc5 and balanced accuracy by loops over float64 values."""
    rows = logits.double().tolist()
    ranks = []
    for row, y in zip(rows, labels, strict=True):
        rank = 0
        for c, v in enumerate(row):
            if c == y:
                continue
            if v > row[y] or (v == row[y] and (ties == "against" or c < y)):
                rank += 1
        ranks.append(rank)
    n, n_classes = len(rows), len(rows[0])
    acc1 = sum(r < 1 for r in ranks) / n
    acc5 = sum(r < 5 for r in ranks) / n if n_classes >= 5 else math.nan
    recalls = []
    for c in range(n_classes):
        mine = [r for r, y in zip(ranks, labels, strict=True) if y == c]
        if mine:
            recalls.append(sum(r < 1 for r in mine) / len(mine))
    return {"acc1": acc1, "acc5": acc5, "mean_per_class_recall": sum(recalls) / len(recalls)}


def same(got, want):
    assert set(got) == set(ZEROSHOT_METRICS)
    for k in ZEROSHOT_METRICS:
        if math.isnan(want[k]):
            assert math.isnan(got[k]), k
        else:  # counts over N: the float64 quotients are the same numbers
            assert got[k] == pytest.approx(want[k], abs=1e-12), k


@pytest.mark.parametrize("n_classes", [3, 7])
@pytest.mark.parametrize("ties", ["against", "index"])
def test_metrics_equal_a_naive_loop_with_ties(n_classes, ties, monkeypatch):
    gen = torch.Generator().manual_seed(n_classes)
    logits = torch.randint(0, 4, (40, n_classes), generator=gen).float()  # many ties
    labels = torch.randint(0, n_classes, (40,), generator=gen)
    want = naive_metrics(logits, labels.tolist(), ties)
    same(zeroshot_classification_metrics(logits, labels, ties=ties), want)
    monkeypatch.setattr(zs_metrics, "_BLOCK_ENTRIES", 2 * n_classes)  # blocks of 2 rows
    same(zeroshot_classification_metrics(logits.numpy(), labels.tolist(), ties=ties), want)


def test_collapsed_logits_are_never_right_unless_ties_go_by_index():
    logits = torch.zeros(6, 5)
    labels = [0, 0, 1, 2, 3, 4]
    got = zeroshot_classification_metrics(logits, labels)
    assert got == {"acc1": 0.0, "acc5": 1.0, "mean_per_class_recall": 0.0}
    by_index = zeroshot_classification_metrics(logits, labels, ties="index")
    assert by_index["acc1"] == pytest.approx(2 / 6)  # class 0 wins every tie
    assert by_index["mean_per_class_recall"] == pytest.approx(1 / 5)


def test_acc5_is_nan_below_five_classes_and_absent_classes_are_left_out():
    logits = torch.tensor([[3.0, 1.0, 0.0, 2.0], [0.0, 1.0, 2.0, 0.5], [1.0, 0.0, 0.5, 3.0]])
    got = zeroshot_classification_metrics(logits, [0, 0, 2])  # classes 1 and 3 have no image
    assert math.isnan(got["acc5"])
    assert got["acc1"] == pytest.approx(1 / 3)
    assert got["mean_per_class_recall"] == pytest.approx((1 / 2 + 0 / 1) / 2)


def test_mean_per_class_recall_is_sklearn_balanced_accuracy_without_ties():
    metrics = pytest.importorskip("sklearn.metrics")
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(60, 9, generator=gen, dtype=torch.float64)
    labels = torch.randint(0, 6, (60,), generator=gen)  # classes 6..8 absent; may be predicted
    with pytest.warns(UserWarning, match="classes not in y_true"):  # absent classes predicted
        want = metrics.balanced_accuracy_score(labels.numpy(), logits.argmax(1).numpy())
    got = zeroshot_classification_metrics(logits, labels)["mean_per_class_recall"]
    assert got == pytest.approx(want, abs=1e-12)


@pytest.mark.parametrize(
    ("logits", "labels", "match"),
    [
        (torch.zeros(4), [0], "logits must be a 2-D floating-point"),
        (torch.zeros(2, 3, dtype=torch.long), [0, 1], "logits must be a 2-D floating-point"),
        (torch.zeros(0, 3), [], "logits is empty"),
        (torch.tensor([[0.0, math.nan]]), [0], "logits contains NaN"),
        (torch.zeros(2, 3), [0], r"one entry per row of logits \(2\), got 1"),
        (torch.zeros(2, 3), [0, 3], r"labels must lie in \[0, 3\).*got 3"),
        (torch.zeros(2, 3), [0.0, 1.0], "labels must be a 1-D integer"),
        (torch.zeros(2, 3), "01", "labels must be a 1-D integer"),
    ],
)
def test_metric_inputs_are_refused_naming_the_argument(logits, labels, match):
    with pytest.raises(ValueError, match=match):
        zeroshot_classification_metrics(logits, labels)


def test_unknown_tie_rule_is_refused():
    with pytest.raises(ValueError, match="ties must be one of against, index"):
        zeroshot_classification_metrics(torch.zeros(1, 2), [0], ties="topk")


# ------------------------------------------------------------------------------------------
# The classifier and the logits, on a toy two-tower model
# ------------------------------------------------------------------------------------------


def oracle_classifier(model, classnames, templates):
    rows = []
    for c in classnames:
        embs = []
        for t in templates:
            ids = CharTokenizer().encode(t.replace("{c}", c))
            e = model.words.weight.double()[ids].sum(0)
            embs.append(e / e.norm())
        mean = torch.stack(embs).mean(0)
        rows.append(mean / mean.norm())
    return torch.stack(rows)


def toy_set(n=11, classes=("cat", "dog", "red car")):
    rng = np.random.default_rng(0)
    images = [Image.fromarray(rng.integers(0, 256, (4, 4, 3), dtype=np.uint8)) for _ in range(n)]
    labels = [i % len(classes) for i in range(n)]
    return ToySet("toy", "test", list(classes), labels, images)


TEMPLATES = ["a photo of a {c}.", "{c}", "a blurry {}"]


def test_fill_template_takes_both_placeholders():
    assert fill_template("a {c} and a {c}", "dog") == "a dog and a dog"
    assert fill_template("a {}.", "dog") == "a dog."
    with pytest.raises(ValueError, match="has no {c} placeholder"):
        fill_template("a photo", "dog")


@pytest.mark.parametrize("batch_size", [1, 4, 256])
def test_classifier_is_the_normalised_mean_of_normalised_prompts(batch_size):
    model = Toy()
    got = zeroshot_classifier(
        model,
        ["cat", "dog", "red car"],
        TEMPLATES,
        tokenizer=CharTokenizer(),
        batch_size=batch_size,
    )
    want = oracle_classifier(
        model, ["cat", "dog", "red car"], [t.replace("{}", "{c}") for t in TEMPLATES]
    )
    assert got.dtype == torch.float32 and got.shape == (3, 6)
    assert torch.allclose(got.double(), want, atol=1e-6)  # float32 sums of 6-d unit vectors


def test_classifier_refuses_empty_or_bad_names():
    model, tok = Toy(), CharTokenizer()
    with pytest.raises(ValueError, match="classnames must be a non-empty list"):
        zeroshot_classifier(model, [], TEMPLATES, tokenizer=tok)
    with pytest.raises(ValueError, match=r"templates\[1\] must be a non-empty string"):
        zeroshot_classifier(model, ["a"], ["{c}", " "], tokenizer=tok)
    with pytest.raises(ValueError, match="batch_size must be a positive integer"):
        zeroshot_classifier(model, ["a"], ["{c}"], tokenizer=tok, batch_size=0)


def test_evaluation_logits_are_100_cosines_and_leave_the_model_and_rng_alone():
    model, data = Toy(), toy_set()
    model.train()
    rng = torch.get_rng_state()
    result = evaluate_zeroshot(model, data, TEMPLATES, tokenizer=CharTokenizer(), batch_size=4)
    assert model.training and torch.equal(torch.get_rng_state(), rng)
    classifier = oracle_classifier(
        model, data.classnames, [t.replace("{}", "{c}") for t in TEMPLATES]
    )
    with torch.no_grad():
        img = torch.stack(
            [model.pixels.weight.double() @ to_pixels(im).double().flatten() for im in data.images]
        )
        img = img + model.pixels.bias.double()
    want = 100 * (img / img.norm(dim=1, keepdim=True)) @ classifier.T
    assert result.logits.shape == (11, 3)
    assert torch.allclose(result.logits.double(), want, atol=1e-4)  # 100 x float32 cosines
    same(result.metrics, zeroshot_classification_metrics(result.logits, data.labels))
    assert (result.num_images, result.num_classes, result.num_templates) == (11, 3, 3)
    assert math.isnan(result.metrics["acc5"])


def test_evaluation_refuses_a_model_without_pixels_and_an_empty_set():
    model = Toy()
    model.image_transform = None
    with pytest.raises(ValueError, match="model has no image_transform"):
        zeroshot_logits(model, toy_set(), torch.zeros(3, 6))
    with pytest.raises(ValueError, match="toy test: no images"):
        evaluate_zeroshot(Toy(), toy_set(n=0), TEMPLATES, tokenizer=CharTokenizer())


def test_record_is_clip_benchmark_schema_and_table_is_percent():
    result = ZeroShotResult("cifar10", "test", {"acc1": 0.5, "acc5": math.nan,
                            "mean_per_class_recall": 0.25}, 8, 4, 2)  # fmt: skip
    rec = result.record(model="m.pt", pretrained="vlret")
    assert {k: rec[k] for k in ("dataset", "model", "pretrained", "task", "language")} == {
        "dataset": "cifar10",
        "model": "m.pt",
        "pretrained": "vlret",
        "task": "zeroshot_classification",
        "language": "en",
    }
    assert rec["metrics"] == {"acc1": 0.5, "acc5": None, "mean_per_class_recall": 0.25}
    json.dumps(rec, allow_nan=False)
    table = result.table().splitlines()
    assert table[0] == "Zero-shot classification: cifar10 test (8 images, 4 classes, 2 templates)"
    assert table[2].split() == ["50.00", "-", "25.00"]


# ------------------------------------------------------------------------------------------
# The protocol
# ------------------------------------------------------------------------------------------


def test_protocol_is_registered_with_class_relevance_and_classification_metrics(capsys):
    p = get_protocol("zeroshot-classification")
    assert p.relevance == "class-label" and p.metrics == ZEROSHOT_METRICS
    assert protocol_names()[-1] == "zeroshot-classification"
    with pytest.raises(ValueError, match="unknown metrics"):
        EvalProtocol(**{**p.__dict__, "name": "t", "metrics": ("rsum",)})
    with pytest.raises(ValueError, match="unknown metrics"):
        EvalProtocol(**{**get_protocol("f30k").__dict__, "name": "t", "metrics": ("acc1",)})
    assert main(["protocols"]) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith("zeroshot-classification ")


# ------------------------------------------------------------------------------------------
# The training hook and its config keys
# ------------------------------------------------------------------------------------------


def test_config_keys_default_off_and_are_checked(tmp_path):
    from train_helpers import tiny_raw
    from vlret.run.config import ConfigError, config_from_dict

    raw = tiny_raw(tmp_path, tmp_path / "run")
    train = config_from_dict(raw).train
    assert (train.zeroshot_every, train.zeroshot_split, train.zeroshot_templates) == (0, "test", "")
    raw["train"]["zeroshot_every"] = -1
    with pytest.raises(ConfigError, match="train.zeroshot_every.*>= 0"):
        config_from_dict(raw)
    raw["train"].update(zeroshot_every=2, zeroshot_dataset="cifar10")
    with pytest.raises(ConfigError, match="train.zeroshot_root.*required when zeroshot_every = 2"):
        config_from_dict(raw)
    raw["train"]["zeroshot_root"] = str(tmp_path)
    assert config_from_dict(raw).train.zeroshot_every == 2


def test_the_hook_refuses_a_model_without_pixels(tmp_path):
    from train_helpers import tiny_config, tiny_data
    from vlret.run.config import ConfigError
    from vlret.train import Trainer

    data = tiny_data(tmp_path / "data")
    sets = [
        "train.zeroshot_every=1",
        "train.zeroshot_dataset=cifar10",
        f"train.zeroshot_root={data}",
    ]
    config = tiny_config(data, tmp_path / "run", sets)
    with pytest.raises(ConfigError, match="train.zeroshot_every.*reads images"):
        Trainer(config, print_fn=None)


def test_the_hook_logs_every_nth_and_the_last_epoch(tmp_path):
    from vlret.train.hooks.zeroshot import ZeroShotEvery

    model, data, lines = Toy(), toy_set(), []
    trainer = types.SimpleNamespace(
        is_main=True, model=model, encoder=CharTokenizer(), device=torch.device("cpu"),
        output_dir=tmp_path, print_fn=lines.append, step=0, epoch=0,
        config=types.SimpleNamespace(train=types.SimpleNamespace(epochs=5)),
    )  # fmt: skip
    hook = ZeroShotEvery(data, TEMPLATES, every=2, batch_size=4)
    for epoch in range(5):
        trainer.epoch, trainer.step = epoch + 1, 10 * (epoch + 1)
        hook.after_epoch(trainer, {"kind": "epoch", "epoch": epoch})
    records = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(r["epoch"], r["step"]) for r in records] == [(1, 20), (3, 40), (4, 50)]
    want = evaluate_zeroshot(model, data, TEMPLATES, tokenizer=CharTokenizer())
    assert records[0]["kind"] == "zeroshot" and records[0]["dataset"] == "toy"
    assert records[0]["zeroshot_acc1"] == want.metrics["acc1"]
    assert records[0]["zeroshot_acc5"] is None  # NaN (3 classes) is null in the log
    assert lines[0].startswith("epoch 1: zero-shot toy test: acc1 ")
    trainer.is_main = False  # other ranks never evaluate
    hook.after_epoch(trainer, {"epoch": 5})
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 3


# ------------------------------------------------------------------------------------------
# A tiny Hugging Face CLIP and vlret zeroshot
# ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def clip_dir(tmp_path_factory):
    transformers = pytest.importorskip("transformers")
    path = tmp_path_factory.mktemp("tiny_clip")
    vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1}
    letters = "abcdefghijklmnopqrstuvwxyz"
    vocab.update({ch: 2 + i for i, ch in enumerate(letters)})
    vocab.update({ch + "</w>": 28 + i for i, ch in enumerate(letters)})
    (path / "vocab.json").write_text(json.dumps(vocab))
    (path / "merges.txt").write_text("#version: 0.2\n")
    tok = transformers.CLIPTokenizer(str(path / "vocab.json"), str(path / "merges.txt"))
    tok.model_max_length = 64
    tok.save_pretrained(str(path))
    config = transformers.CLIPConfig(
        text_config=dict(
            vocab_size=len(vocab), hidden_size=32, intermediate_size=37, num_hidden_layers=2,
            num_attention_heads=2, max_position_embeddings=64, bos_token_id=0, eos_token_id=1,
            pad_token_id=1,
        ),
        vision_config=dict(
            image_size=32, patch_size=16, hidden_size=32, intermediate_size=37,
            num_hidden_layers=2, num_attention_heads=2,
        ),
        projection_dim=16,
    )  # fmt: skip
    torch.manual_seed(0)
    transformers.CLIPModel(config).save_pretrained(str(path))
    size = {"size": {"shortest_edge": 32}, "crop_size": {"height": 32, "width": 32}}
    transformers.CLIPImageProcessor(**size).save_pretrained(str(path))
    return path


def _pooled(output):
    return output if isinstance(output, torch.Tensor) else output.pooler_output


def test_hf_clip_classifier_and_logits_match_clipmodel(clip_dir):
    from vlret.eval.zeroshot import load_hf_clip
    from vlret.models.clip import CLIPImageTransform

    transformers = pytest.importorskip("transformers")
    model, tokenizer = load_hf_clip(clip_dir)
    reference = transformers.CLIPModel.from_pretrained(str(clip_dir), local_files_only=True)
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(clip_dir), local_files_only=True)
    data = toy_set(n=5, classes=("cat", "dog"))
    templates = ["a photo of a {c}", "a {c}"]
    result = evaluate_zeroshot(model, data, templates, tokenizer=tokenizer, batch_size=2)
    with torch.no_grad():
        rows = []
        for c in data.classnames:  # each prompt alone: no padding in the reference
            embs = [
                _pooled(
                    reference.get_text_features(**hf_tok(t.replace("{c}", c), return_tensors="pt"))
                )
                for t in templates
            ]
            e = torch.nn.functional.normalize(torch.cat(embs).double(), dim=-1).mean(0)
            rows.append(e / e.norm())
        transform = CLIPImageTransform.from_pretrained(clip_dir)
        pixels = torch.stack([transform(im) for im in data.images])
        img = torch.nn.functional.normalize(
            _pooled(reference.get_image_features(pixel_values=pixels)).double(), dim=-1
        )
    want = 100 * img @ torch.stack(rows).T
    assert torch.allclose(result.logits.double(), want, atol=1e-3)  # 100 x float32 cosines


def fake_classification(data, templates):
    """A stand-in for vlret.data.classification: load_classification returns ``data``."""
    calls = {}

    def load_classification(name, root, *, split="test", classnames=None):
        calls.update(name=name, root=Path(root), split=split, classnames=classnames)
        if not Path(root).is_dir():
            raise FileNotFoundError(f"{root}: missing; expected the {name} folder")
        return data

    return types.SimpleNamespace(
        load_classification=load_classification,
        default_templates=lambda name: list(templates),
        load_templates=lambda spec: ["{c}"],
        read_classnames=lambda path: Path(path).read_text().split("\n"),
        calls=calls,
    )


def test_cli_writes_clip_benchmark_json_for_a_hf_clip(clip_dir, tmp_path, monkeypatch, capsys):
    from vlret.cli import zeroshot as command
    from vlret.eval.zeroshot import load_hf_clip

    data = toy_set(n=6, classes=("cat", "dog"))
    fake = fake_classification(data, ["a photo of a {c}"])
    monkeypatch.setattr(command, "_classification", lambda: fake)
    out = tmp_path / "res" / "zs.json"
    argv = ["zeroshot", "--model", str(clip_dir), "--dataset", "toy", "--data-root", str(tmp_path)]
    assert main([*argv, "--json", str(out), "--device", "cpu", "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "Zero-shot classification: toy test (6 images, 2 classes, 1 templates)" in printed
    record = json.loads(out.read_text())
    model, tok = load_hf_clip(clip_dir)
    want = evaluate_zeroshot(model, data, ["a photo of a {c}"], tokenizer=tok).metrics
    assert record["metrics"]["acc1"] == pytest.approx(want["acc1"], abs=1e-12)
    assert record["metrics"]["acc5"] is None
    # CLIP_benchmark's columns: the architecture in model, the weights in pretrained
    assert (record["dataset"], record["model"], record["pretrained"]) == (
        "toy", "ViT-custom-v32x2-t32x2-p16-d16-32-quickgelu", str(clip_dir),
    )  # fmt: skip
    assert record["vlret"]["model_source"] == "hf-clip"
    assert record["task"] == "zeroshot_classification" and record["language"] == "en"
    assert fake.calls == {"name": "toy", "root": tmp_path, "split": "test", "classnames": None}


def test_cli_errors_are_one_line(clip_dir, tmp_path, monkeypatch, capsys):
    from vlret.cli import zeroshot as command
    from vlret.run.checkpoint import save_checkpoint

    monkeypatch.setattr(command, "_classification", lambda: fake_classification(toy_set(), ["{c}"]))
    base = ["zeroshot", "--dataset", "toy", "--data-root", str(tmp_path), "--no-progress"]

    def error(*extra):
        assert main([*base, *extra]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("vlret zeroshot: ") and "\n" not in err
        return err

    assert "is a folder" in error("--model", str(clip_dir), "--json", str(tmp_path))
    assert "missing; expected a vlret checkpoint (.pt) or a local" in error("--model", "nope.pt")
    (tmp_path / "bert").mkdir()
    (tmp_path / "bert" / "config.json").write_text('{"model_type": "bert"}')
    assert "not a Hugging Face CLIP directory" in error("--model", str(tmp_path / "bert"))
    assert "not a readable vlret checkpoint" in error("--model", str(clip_dir / "config.json"))
    assert "--device" in error("--model", str(clip_dir), "--device", "tpu")
    from train_helpers import tiny_config, tiny_data
    from vlret.models import build_model

    config = tiny_config(tiny_data(tmp_path / "data"), tmp_path / "run")
    model = build_model(config.model, vocab_size=12)
    words = ["<pad>", "<start>", "<end>", "<unk>", *"abcdefgh"]
    state = {"config": config.to_dict(), "encoder": {"kind": "vocab", "idx2word": words},
             "vocab_size": 12, "model": model.state_dict()}  # fmt: skip
    save_checkpoint(state, tmp_path / "precomp.pt")
    assert "encodes precomputed features, not pixels" in error(
        "--model", str(tmp_path / "precomp.pt")
    )


def test_cli_on_a_real_imagefolder(clip_dir, tmp_path, capsys):
    pytest.importorskip(
        "vlret.data.classification", reason="vlret.data.classification (the data sets) not here"
    )
    for k, name in enumerate(("cat", "dog", "fish")):
        folder = tmp_path / "folder" / name
        folder.mkdir(parents=True)
        for i in range(2):
            Image.new("RGB", (40, 36), (80 * k, 30 * i, 200)).save(folder / f"{i}.jpg")
    out = tmp_path / "zs.json"
    argv = ["zeroshot", "--model", str(clip_dir), "--dataset", "imagefolder", "--data-root"]
    argv += [str(tmp_path / "folder"), "--json", str(out), "--no-progress", "--device", "cpu"]
    assert main(argv) == 0
    record = json.loads(out.read_text())
    assert record["dataset"] == "imagefolder/folder"  # the set named by its folder
    assert set(record["metrics"]) == set(ZEROSHOT_METRICS)
    assert "(6 images, 3 classes" in capsys.readouterr().out
