"""``vlret plot tsne``: a t-SNE of a run's image and text embeddings (vlret.analysis.tsne),
coloured by the synthetic world's primary object category."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("matplotlib")
pytest.importorskip("sklearn")

from train_helpers import tiny_data, tiny_raw  # noqa: E402
from vlret.analysis.tsne import pooled_tokens, sample_pairs, world_groups  # noqa: E402
from vlret.cli import main  # noqa: E402
from vlret.run.config import apply_overrides, config_from_dict  # noqa: E402
from vlret.train import Trainer  # noqa: E402
from vlret.worlds import write_synthetic  # noqa: E402

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
ONE_STEP = ["train.epochs=1", "train.max_steps_per_epoch=1", "train.batch_size=8"]


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def world_run(tmp_path_factory):
    """A tiny synthetic world (precomp) and a two-tower run of one step on it."""
    tmp = tmp_path_factory.mktemp("tsne")
    world = tmp / "world"
    write_synthetic("tiny", world, format="precomp", seed=0, relevance_splits=())
    raw = tiny_raw(world, tmp / "run")
    raw["model"]["image"]["in_dim"] = 32
    Trainer(config_from_dict(apply_overrides(raw, ONE_STEP)), print_fn=None).fit()
    return world, tmp / "run"


def read_points(path: Path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def test_points_carry_their_images_world_category(world_run, tmp_path, capsys):
    world, run = world_run
    out = tmp_path / "map.png"
    args = ["plot", "tsne", str(run), "--split", "dev", "--samples", "12", "--perplexity", "5"]
    assert main([*args, "--out", str(out)]) == 0
    assert capsys.readouterr().out.split() == [
        str(out),
        str(out.with_suffix(".csv")),
        str(out.with_suffix(".json")),
    ]
    assert out.read_bytes()[:8] == PNG_MAGIC
    rows = read_points(out.with_suffix(".csv"))
    images = [r for r in rows if r["modality"] == "image"]
    texts = [r for r in rows if r["modality"] == "text"]
    assert len(images) == len(texts) == 12 and len(rows) == 24
    # the categories straight from the world's side file: scenes (N, 4, 6), the primary
    # object's category in [i, 0, 0]; the names from the lexicon file's canonical names
    scenes = np.load(world / "dev_synth.npz")["scenes"]
    from vlret.worlds.language import CATEGORIES

    t2i = np.load(world / "dev_synth.npz")["txt_to_img"]
    for r in rows:
        image = int(r["image"])
        assert r["group"] == CATEGORIES[int(scenes[image, 0, 0])][0]
        if r["modality"] == "text":  # the caption is one of its image's
            assert int(t2i[int(r["caption"])]) == image
        assert np.isfinite(float(r["x"])) and np.isfinite(float(r["y"]))
    assert sorted({int(r["image"]) for r in images}) == [int(r["image"]) for r in images]
    assert len({int(r["image"]) for r in images}) == 12  # without replacement
    meta = json.loads(out.with_suffix(".json").read_text())
    assert meta["points"] == {"image": 12, "text": 12}
    assert meta["groups"] == "primary object category" and meta["split"] == "dev"
    assert meta["checkpoint"] == str(run / "best.pt")


def test_the_same_seed_draws_the_same_pairs_and_map(world_run, tmp_path):
    _, run = world_run
    paths = []
    for name in ("a", "b"):
        out = tmp_path / f"{name}.png"
        args = ["plot", "tsne", str(run / "best.pt"), "--samples", "6", "--perplexity", "3"]
        assert main([*args, "--seed", "3", "--out", str(out)]) == 0
        paths.append(out.with_suffix(".csv"))
    assert paths[0].read_text() == paths[1].read_text()


def test_sample_pairs_and_groups_without_a_world(tmp_path):
    t2i = torch.arange(4).repeat_interleave(3)
    images, captions = sample_pairs(t2i, samples=10, seed=0)
    assert images == [0, 1, 2, 3]  # at most every image
    assert [int(t2i[c]) for c in captions] == images
    assert world_groups(tmp_path, "dev", 4) is None


def test_a_plain_dataset_is_coloured_by_modality(tmp_path, capsys):
    data = tiny_data(tmp_path / "data")  # not a synthetic world: no groups
    raw = tiny_raw(data, tmp_path / "run")
    Trainer(config_from_dict(apply_overrides(raw, ONE_STEP)), print_fn=None).fit()
    out = tmp_path / "plain.png"
    args = ["plot", "tsne", str(tmp_path / "run"), "--split", "test", "--perplexity", "1"]
    assert main([*args, "--out", str(out)]) == 0
    rows = read_points(out.with_suffix(".csv"))
    assert len(rows) == 4 and {r["group"] for r in rows} == {""}
    assert json.loads(out.with_suffix(".json").read_text())["groups"] is None


def test_errors_are_one_line(world_run, tmp_path, capsys):
    _, run = world_run

    def error(*argv: str) -> str:
        assert main(["plot", *argv]) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("vlret plot: ")
        return lines[0]

    assert "no best.pt" in error("tsne", str(tmp_path))
    assert "exactly one RUN" in error("tsne")
    assert "--out" in error("tsne", str(run), "--out", str(tmp_path / "x.jpg"))
    line = error("tsne", str(run), "--samples", "3", "--out", str(tmp_path / "p.png"))
    assert line.endswith(
        "perplexity: 30 must be less than the number of points, 6 (3 images and their captions)"
    )


def test_pooled_tokens_is_the_mean_of_the_real_rows_normalised():
    g = torch.Generator().manual_seed(0)
    tokens = torch.randn(3, 5, 4, generator=g)
    rows = torch.tensor([5, 2, 1])
    got = pooled_tokens(tokens, rows)
    for n in range(3):  # naive: the first rows[n] rows summed by hand, then unit length
        mean = sum(tokens[n, r] for r in range(int(rows[n]))) / int(rows[n])
        assert torch.allclose(got[n], mean / mean.norm(), atol=1e-6)
    every = pooled_tokens(tokens)
    assert torch.allclose(every[0], got[0], atol=1e-6)
    assert torch.allclose(every.norm(dim=1), torch.ones(3))


def test_a_pair_model_is_mapped_by_its_pooled_tokens(world_run, tmp_path):
    """SCAN on the world: the image points are the pooled encoded regions and the texts the
    pooled encoded words, checked against the model's own encoders, before the t-SNE."""
    world, _ = world_run
    raw = tiny_raw(world, tmp_path / "scan")
    raw["model"] = {
        "kind": "scan",
        "embed_dim": 16,
        "image": {"in_dim": 32},
        "text": {"word_dim": 8},
    }
    kept = [*ONE_STEP, "train.keep_epochs=[0]"]  # epoch_0.pt: a chosen epoch's checkpoint
    Trainer(config_from_dict(apply_overrides(raw, kept)), print_fn=None).fit()
    out = tmp_path / "scan.png"
    ckpt = tmp_path / "scan" / "epoch_0.pt"
    args = ["plot", "tsne", str(ckpt), "--samples", "8", "--perplexity", "3"]
    assert main([*args, "--out", str(out)]) == 0
    meta = json.loads(out.with_suffix(".json").read_text())
    assert meta["embedding"] == "pooled tokens" and meta["model"] == "scan"
    assert meta["checkpoint"] == str(ckpt)
    rows = read_points(out.with_suffix(".csv"))
    assert len(rows) == 16 and {r["group"] for r in rows} != {""}

    import vlret.analysis.tsne as tsne
    from vlret.data.formats import open_dataset
    from vlret.run.builders import load_trained_model
    from vlret.run.eval_data import eval_data_config, stored_eval_data

    model, run, encoder = load_trained_model(ckpt, device="cpu")
    model.eval()
    data = open_dataset(eval_data_config(stored_eval_data(run.data), world), "dev", encoder=encoder)
    seen = {}
    images, captions = sample_pairs(data.txt_to_img, samples=8, seed=0)
    img = tsne._encode(model, data.images(), images, torch.device("cpu"), 4, images=True)
    txt = tsne._encode(model, data.texts(), captions, torch.device("cpu"), 4, images=False)
    with torch.no_grad():
        for k, (i, c) in enumerate(zip(images, captions, strict=True)):
            feats = data.images().collate([data.images()[i]])[0]
            regions = model.encode_images(feats)[0]
            expect = regions.mean(0) / regions.mean(0).norm()
            assert torch.allclose(img[k], expect, atol=1e-5)
            cap, length = data.texts().collate([data.texts()[c]])[:2]
            words = model.encode_texts(cap, length)[0, : int(length[0])]
            expect = words.mean(0) / words.mean(0).norm()
            assert torch.allclose(txt[k], expect, atol=1e-5)
            seen[k] = True
    assert len(seen) == 8
