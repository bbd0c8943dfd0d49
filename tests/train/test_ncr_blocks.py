"""NCR's loss pass scores each distinct image of a block once (``ncr/blocks.py``): the rows it
repeats are the whole-block forward's rows (exact in float64, to float32 rounding in the run),
so the per-pair losses and the division are those of scoring every block's ``B x B`` matrix."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from vlret.train.procedures.ncr import clean_probability, split_clean
from vlret.train.procedures.ncr import step as step_module
from vlret.train.procedures.ncr.blocks import block_scores, distinct_images

SGR = {"kind": "sgraf", "module": "sgr", "sim_dim": 4, "sgr_steps": 2, "num_regions": 3}
SAF = {"kind": "sgraf", "module": "saf", "sim_dim": 4, "num_regions": 3}
SCAN = {"kind": "scan", "direction": "t2i", "aggregation": "mean"}


def _config(tmp_path, model, **train):
    from vlret.run.config import config_from_dict

    return config_from_dict(
        {
            "output_dir": str(tmp_path / "run"),
            "data": {
                "root": str(tmp_path / "data"),
                "format": "precomp",
                "min_count": 1,
                "noise_ratio": 0.3,
                "noise_seed": 2,
            },
            "model": {"embed_dim": 8, "image": {"in_dim": 16}, "text": {"word_dim": 4}, **model},
            "loss": {"name": "triplet"},
            "train": {
                "epochs": 2,
                "batch_size": 12,
                "progress": False,
                "procedure": "ncr",
                "procedure_options": {"warmup_epochs": 1},
                **train,
            },
        }
    )


@pytest.fixture
def world(tmp_path):
    from vlret.data.writers import make_tiny_precomp

    sizes = {"train": 9, "dev": 2, "test": 2}
    make_tiny_precomp(tmp_path / "data", sizes=sizes, feature_shape=(3, 16))
    return tmp_path


def _batch(img_index, features):
    return SimpleNamespace(img_index=torch.tensor(img_index), features=features)


def test_distinct_images_finds_each_images_first_pair_and_refuses_what_it_cannot_share():
    feats = torch.randn(4, 2, 3)
    rows = feats[[2, 0, 2, 1, 0, 3]]  # pairs of images 2, 0, 2, 1, 0, 3
    first, inverse = distinct_images(_batch([2, 0, 2, 1, 0, 3], rows))
    assert first.tolist() == [1, 3, 0, 5]  # images 0, 1, 2, 3: their first pairs
    assert inverse.tolist() == [2, 0, 2, 1, 0, 3]
    assert torch.equal(rows[first][inverse], rows)
    # every image distinct, or a single image: nothing to share
    assert distinct_images(_batch([0, 1, 2, 3], feats)) is None
    assert distinct_images(_batch([1, 1], feats[[1, 1]])) is None
    # two pairs of image 0 with different features (per-pair augmentation): the whole block
    augmented = rows.clone()
    augmented[4, 0, 0] += 1
    assert distinct_images(_batch([2, 0, 2, 1, 0, 3], augmented)) is None
    # features that are not one tensor (expert or pixel batches)
    assert distinct_images(_batch([0, 0, 1], [rows[0], rows[0], rows[1]])) is None


@pytest.mark.parametrize("model", [SGR, SAF, SCAN], ids=["sgr", "saf", "scan"])
def test_block_scores_are_the_whole_block_forwards_rows_in_float64(world, model):
    from vlret.train import Trainer

    trainer = Trainer(_config(world, model), print_fn=None)
    net = copy.deepcopy(trainer.model).double().eval()
    ds = trainer.train_set
    batch = ds.collate([ds[i] for i in range(12)])  # 12 consecutive captions: shared images
    batch.features = batch.features.double()
    distinct = distinct_images(batch)
    assert distinct is not None and len(distinct[0]) < 12
    with torch.no_grad():
        want = net(batch)
        got = block_scores(net, batch, distinct=distinct, autocast=trainer.context.autocast)
    assert got.dtype == torch.float64 and got.shape == (12, 12)
    # the same per-pair arithmetic on fewer image rows: float64 rounding of O(1) scores
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    assert block_scores(net, batch, distinct=None, autocast=trainer.context.autocast) is None


def test_the_loss_pass_equals_the_whole_block_pass_and_divides_alike(world, monkeypatch):
    from vlret.train import Trainer

    trainer = Trainer(_config(world, SGR), print_fn=None)
    trainer.fit()  # both networks trained through the warm-up and one divided epoch
    ncr, ctx = trainer.loss_step, trainer.context
    shared = []
    real = step_module.block_scores
    monkeypatch.setattr(
        step_module,
        "block_scores",
        lambda *a, **k: shared.append(k["distinct"] is not None) or real(*a, **k),
    )
    got = ncr.loss_pass(ctx)
    assert any(shared)  # blocks of consecutive captions shared images
    monkeypatch.setattr(step_module, "distinct_images", lambda batch: None)
    want = ncr.loss_pass(ctx)
    for g, w in zip(got, want, strict=True):
        assert g.shape == (45,) and g.dtype == np.float64
        # float32 scores in (0, 1) from GEMMs of other row counts: a few ulps of O(1) values
        np.testing.assert_allclose(g, w, rtol=0, atol=1e-5)
        prob_g, prob_w = clean_probability(g, random_state=4), clean_probability(w, random_state=4)
        np.testing.assert_allclose(prob_g, prob_w, rtol=0, atol=1e-3)
        np.testing.assert_array_equal(split_clean(prob_g), split_clean(prob_w))
