"""`vlret eval --rescore dsl | qbnorm` end to end: a tiny trained two-tower checkpoint, a seeded
pair-scoring (SCAN) checkpoint and a tiny MSR-VTT run; the metrics equal the re-scoring of
score matrices computed here item by item, every output says NON-STANDARD, and the default
output is unchanged."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import yaml

from train_helpers import tiny_msrvtt_run_config, tiny_raw
from vlret.cli import main
from vlret.data import MSRVTTDataset, PrecompDataset, Vocabulary
from vlret.data.formats.precomp import build_precomp_vocab
from vlret.data.writers import make_tiny_precomp
from vlret.metrics import (
    Rescoring,
    coco_5fold_metrics,
    draw_bank,
    rescored_metrics,
    retrieval_metrics,
)
from vlret.models import build_model
from vlret.run.builders import encoder_state
from vlret.run.checkpoint import load_checkpoint, save_checkpoint
from vlret.run.config import config_from_dict

SIZES = {"train": 8, "dev": 2, "test": 3, "testall": 10}  # train: 40 captions


def run_cli(*args) -> int:
    return main([str(a) for a in args])


def load_model(checkpoint: Path):
    state = load_checkpoint(checkpoint)
    model = build_model(state["config"]["model"], vocab_size=state["vocab_size"])
    model.load_state_dict(state["model"])
    return model.eval()


@torch.no_grad()
def item_by_item(model, test, train=None, bank_index=None):
    """The test matrix ``(N_img, N_txt)`` and the querybank's ``(N_bank, N_img)``, each image
    and caption encoded alone (two-tower: cosines; pair-scoring: ``model.score``)."""
    img = torch.cat([model.encode_images(test.image(i)[None]) for i in range(test.num_images)])

    def texts(ds, index):
        caps = [ds.caption(int(j)) for j in index]
        return [model.encode_texts(c[None], torch.tensor([len(c)])) for c in caps]

    def scores(txt):
        if getattr(model, "scores_pairs", False):
            cols = [model.score(img, w, torch.tensor([w.shape[1]]))[:, 0] for w in txt]
            return torch.stack(cols, dim=1)
        return F.normalize(img, dim=1) @ F.normalize(torch.cat(txt), dim=1).t()

    sim = scores(texts(test, range(test.num_captions)))
    bank = None if bank_index is None else scores(texts(train, bank_index)).t()
    return sim.double(), bank


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A tiny two-tower run trained by `vlret train`, and a seeded SCAN checkpoint."""
    root = tmp_path_factory.mktemp("rescore")
    data = root / "data"
    make_tiny_precomp(data, sizes=SIZES, feature_shape=(4, 16), seed=0)
    raw = tiny_raw(data, root / "run")
    raw["train"]["epochs"] = 1
    (root / "run.yaml").write_text(yaml.safe_dump(raw))
    assert run_cli("train", root / "run.yaml") == 0
    vocab = build_precomp_vocab(data, min_count=1)
    raw["model"] = {"kind": "scan", "embed_dim": 16, "image": {"in_dim": 16}}
    raw["model"]["text"] = {"word_dim": 8}
    config = config_from_dict(raw)
    torch.manual_seed(3)
    scan = build_model(config.model, vocab_size=len(vocab))
    state = {"config": config.to_dict(), "encoder": encoder_state(vocab, config)}
    save_checkpoint({**state, "vocab_size": len(vocab), "model": scan.state_dict()}, root / "s.pt")
    return data, root / "run" / "last.pt", root / "s.pt"


def eval_json(ckpt, data, split, protocol, out, *extra) -> dict:
    args = ["eval", ckpt, "--data", data, "--split", split, "--protocol", protocol]
    assert run_cli(*args, "--json", out, *extra) == 0
    return json.loads(out.read_text())


def expected(ckpt, data, split, protocol, rescoring, bank_size=None):
    encoder = Vocabulary(load_checkpoint(ckpt)["encoder"]["idx2word"])
    test = PrecompDataset(data, split, encoder=encoder)
    train = index = None
    if rescoring.needs_bank:
        train = PrecompDataset(data, "train", encoder=encoder)
        index = draw_bank(train.num_captions, size=bank_size, seed=0)
    sim, bank = item_by_item(load_model(ckpt), test, train, index)
    blocks = None
    if protocol == "coco1k":
        per = test.num_captions // 5
        blocks = [(f * 2, f * 2 + 2, f * per, (f + 1) * per) for f in range(5)]
    bank = None if bank is None else bank.double()
    return rescored_metrics(sim, test.txt_to_img, rescoring, bank_sim=bank, blocks=blocks)


@pytest.mark.parametrize("which", ["two_tower", "scan"])
@pytest.mark.parametrize(("split", "protocol"), [("test", "f30k"), ("testall", "coco1k")])
def test_rescore_dsl_end_to_end(run, tmp_path, capsys, which, split, protocol):
    data, tower, scan = run
    ckpt = tower if which == "two_tower" else scan
    record = eval_json(ckpt, data, split, protocol, tmp_path / "m.json", "--rescore", "dsl")
    printed = capsys.readouterr().out
    assert printed.startswith("NON-STANDARD: dual softmax re-scoring") and "0.01" in printed
    assert record["title"].startswith("NON-STANDARD") and record["standard"] is False
    assert record["rescore"] == {
        "method": "dsl",
        "standard": False,
        "temperature": 0.01,
        "directions": "i2t and t2i",
        "uses_test_statistics": True,
    }
    want, _ = expected(ckpt, data, split, protocol, Rescoring("dsl"))
    assert record["metrics"] == pytest.approx(want.as_dict(), abs=1e-9)
    if protocol == "coco1k":
        assert len(record["folds"]) == len(want.folds) == 5
        for got, fold in zip(record["folds"], want.folds, strict=True):
            assert got == pytest.approx(fold.as_dict(), abs=1e-9)


@pytest.mark.parametrize("which", ["two_tower", "scan"])
def test_rescore_qbnorm_end_to_end(run, tmp_path, capsys, which):
    data, tower, scan = run
    ckpt = tower if which == "two_tower" else scan
    extra = ["--rescore", "qbnorm", "--bank-size", "12", "--qb-beta", "10", "--qb-k", "2"]
    record = eval_json(ckpt, data, "testall", "coco5k", tmp_path / "m.json", *extra)
    printed = capsys.readouterr().out
    assert printed.startswith("NON-STANDARD: QB-Norm re-scoring (dynamic inverted softmax")
    assert "querybank of 12 training captions" in printed and "text->image only" in printed
    rescoring = Rescoring("qbnorm", beta=10.0, k=2, bank_size=12)
    want, info = expected(ckpt, data, "testall", "coco5k", rescoring, bank_size=12)
    assert record["standard"] is False and record["rescore"] == pytest.approx(
        rescoring.record(info)
    )
    assert record["rescore"]["bank_size"] == 12 and record["rescore"]["directions"].startswith(
        "t2i only"
    )
    assert record["metrics"] == pytest.approx(want.as_dict(), abs=1e-9)


def test_rescore_qbnorm_static_and_a_bank_larger_than_the_train_split(run, tmp_path, capsys):
    data, tower, _ = run
    extra = ["--rescore", "qbnorm", "--qb-static", "--bank-size", "1000"]
    record = eval_json(tower, data, "test", "f30k", tmp_path / "m.json", *extra)
    assert "(inverted softmax" in capsys.readouterr().out
    rescore = record["rescore"]
    assert (rescore["dynamic"], rescore["bank_size"], rescore["t2i_queries_normalised"]) == (
        False,
        40,
        1.0,
    )
    want, _ = expected(
        tower, data, "test", "f30k", Rescoring("qbnorm", dynamic=False), bank_size=1000
    )
    assert record["metrics"] == pytest.approx(want.as_dict(), abs=1e-9)


@pytest.mark.parametrize(("split", "protocol"), [("test", "f30k"), ("testall", "coco1k")])
def test_default_output_is_unchanged(run, tmp_path, capsys, split, protocol):
    data, tower, _ = run
    record = eval_json(tower, data, split, protocol, tmp_path / "m.json")
    assert "NON-STANDARD" not in capsys.readouterr().out
    assert "rescore" not in record and "standard" not in record
    assert "NON-STANDARD" not in record["title"]
    encoder = Vocabulary(load_checkpoint(tower)["encoder"]["idx2word"])
    test = PrecompDataset(data, split, encoder=encoder)
    img_emb, txt_emb = embeddings(tower, test)
    metric = coco_5fold_metrics if protocol == "coco1k" else retrieval_metrics
    assert record["metrics"] == pytest.approx(metric(img_emb, txt_emb, test.txt_to_img).as_dict())


@torch.no_grad()
def embeddings(ckpt, dataset):
    model = load_model(ckpt)
    img = torch.stack([dataset.image(i) for i in range(dataset.num_images)])
    caps = [dataset.caption(j) for j in range(dataset.num_captions)]
    txt = torch.cat([model.encode_texts(c[None], torch.tensor([len(c)])) for c in caps])
    return F.normalize(model.encode_images(img), dim=1), F.normalize(txt, dim=1)


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (["--qb-beta", "5"], "--qb-beta: only used with the qbnorm re-scoring"),
        (["--rescore", "dsl", "--bank-size", "5"], "--bank-size: only used with the qbnorm"),
        (["--rescore", "qbnorm", "--dsl-temperature", "1"], "--dsl-temperature: only used"),
        (["--rescore", "dsl", "--dsl-temperature", "0"], "temperature must be a positive"),
        (["--rescore", "qbnorm", "--bank-size", "0"], "bank_size must be a positive integer"),
        (["--rescore", "dsl", "--shortlist", "3"], "does not combine with shortlist"),
    ],
)
def test_rescore_flag_errors(run, tmp_path, capsys, extra, words):
    data, _, scan = run
    args = ["eval", scan, "--data", data, "--split", "test", "--protocol", "f30k", *extra]
    assert run_cli(*args) == 2
    err = capsys.readouterr().err
    assert err.startswith("vlret eval: ") and words in err and "Traceback" not in err


def test_rescore_choices(run, capsys):
    data, tower, _ = run
    with pytest.raises(SystemExit):
        run_cli("eval", tower, "--data", data, "--split", "test", "--protocol", "f30k",
                "--rescore", "csls")  # fmt: skip
    assert "invalid choice: 'csls'" in capsys.readouterr().err


def test_qbnorm_needs_the_train_split(run, tmp_path, capsys):
    data, tower, _ = run
    only_test = tmp_path / "only_test"
    only_test.mkdir()
    for path in data.iterdir():
        if not path.name.startswith("train"):
            (only_test / path.name).symlink_to(path)
    args = ["eval", tower, "--data", only_test, "--split", "test", "--protocol", "f30k"]
    assert run_cli(*args) == 0  # the standard protocol needs no training data
    assert run_cli(*args, "--rescore", "qbnorm") == 2
    err = capsys.readouterr().err
    assert "rescore qbnorm: the querybank is the train split's captions" in err


def test_rescore_msrvtt_full(tmp_path, capsys):
    root, cfg = tiny_msrvtt_run_config(tmp_path)
    assert run_cli("train", cfg) == 0
    ckpt = tmp_path / "run" / "last.pt"
    encoder = Vocabulary.load(tmp_path / "run" / "vocab.json")
    test = MSRVTTDataset(root, "test", protocol="full", encoder=encoder, captions_per_video=4)
    train = MSRVTTDataset(root, "train", protocol="full", encoder=encoder, captions_per_video=4)
    for method, extra in (("dsl", []), ("qbnorm", ["--bank-size", "6"])):
        out = tmp_path / f"{method}.json"
        record = eval_json(ckpt, root, "test", "msrvtt-full", out, "--rescore", method, *extra)
        rescoring = Rescoring(method, bank_size=6)
        index = draw_bank(train.num_captions, size=6) if rescoring.needs_bank else None
        sim, bank = item_by_item(load_model(ckpt), test, train, index)
        bank = None if bank is None else bank.double()
        want, _ = rescored_metrics(sim, test.txt_to_img, rescoring, bank_sim=bank)
        assert record["metrics"] == pytest.approx(want.as_dict(), abs=1e-9)
        assert record["rescore"]["method"] == method and record["standard"] is False
    assert capsys.readouterr().out.count("NON-STANDARD") == 2
