"""VSL with ``text_side=true`` trains: the trainer hands the batch's captions to the loss through
StepInputs (VSL Eq. 7, ``L_ts``), and the logged loss equals Eq. (6) + (7) by hand."""

from __future__ import annotations

import json
import math

import pytest
import torch

from train_helpers import tiny_config, tiny_data
from vlret.train import Trainer

TAU = 0.001  # VSL's default smooth-rank temperature
BETA = 10.0  # VSL's default weight of L_vs (+ L_ts)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return tiny_data(tmp_path_factory.mktemp("data"))


@pytest.fixture
def float64():
    """The model and the loss in float64, so the oracle's rounding is float64's."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(previous)


def omega(x: float) -> float:
    """VSL's sigmoid 1 / (1 + exp(-x / tau)), in a form that does not overflow."""
    return 0.5 * (1.0 + math.tanh(x / (2 * TAU)))


def naive_rank_disagreement(s: list[list[float]], c: list[list[float]]) -> float:
    """``1 - 1/n^2 sum_ij min(sr, cr) / max(sr, cr)`` with the smooth ranks of Eq. (4), largest
    first: ``R(i, j) = 1 + sum_{k != j} omega(m_ik - m_ij)``."""
    n = len(s)
    total = 0.0
    for i in range(n):
        for j in range(n):
            sr = 1 + sum(omega(s[i][k] - s[i][j]) for k in range(n) if k != j)
            cr = 1 + sum(omega(c[i][k] - c[i][j]) for k in range(n) if k != j)
            total += min(sr, cr) / max(sr, cr)
    return 1.0 - total / n**2


def _first_batch(trainer: Trainer):
    trainer.sampler.set_epoch(0)
    indices = next(iter(trainer.sampler))
    return trainer.train_set.collate([trainer.train_set[i] for i in indices])


def test_text_side_loss_is_eq6_plus_eq7_by_hand(tmp_path, data, float64):
    # alpha = 0: the loss is beta (L_vs + L_ts), VSL Eq. (6) + (7) without the base loss
    overrides = ["loss.name=vsl", "loss.text_side=true", "loss.alpha=0"]
    trainer = Trainer(tiny_config(data, tmp_path / "run", overrides))
    batch = _first_batch(trainer)
    _, logged, ctx = trainer.compute_loss(batch)
    img = torch.nn.functional.normalize(ctx["img"], dim=1)
    txt = torch.nn.functional.normalize(ctx["txt"], dim=1)
    assert img.dtype == torch.float64
    sim = (img @ txt.t()).tolist()
    sim_t = [list(col) for col in zip(*sim, strict=True)]  # row j: text j against every image
    ids = batch.img_index
    semantic = trainer.loss_fn.semantic
    c = semantic.similarity(ids, ids).double().tolist()  # Eq. (3): the loss's float32 C
    captions = [trainer.train_set.captions[i] for i in batch.cap_index.tolist()]
    assert len(set(captions)) == len(captions)
    tc = semantic.caption_similarity(captions).double().tolist()  # TC: the loss's float32 TF-IDF
    l_vs = naive_rank_disagreement(sim, c)
    l_ts = naive_rank_disagreement(sim_t, tc)
    assert l_ts > 0.05  # the text side adds a term that is not negligible here
    n = len(sim)
    # float64 cosines, each sigmoid argument magnified 1 / tau; sums of n^2 terms; 16x headroom
    tol = BETA * 16 * (n * n + 1 / TAU) * torch.finfo(torch.float64).eps
    assert float(logged) == pytest.approx(BETA * (l_vs + l_ts), abs=tol)
    without = Trainer(tiny_config(data, tmp_path / "vs", overrides[:1] + overrides[2:]))
    _, logged_vs, _ = without.compute_loss(_first_batch(without))
    assert float(logged_vs) == pytest.approx(BETA * l_vs, abs=tol)


def test_text_side_run_trains_and_logs_the_same_loss(tmp_path, data):
    overrides = ["loss.name=vsl", "loss.text_side=true", "train.log_every=1", "train.epochs=2"]
    cfg = tiny_config(data, tmp_path / "run", overrides)  # the config refuses nothing
    assert cfg.loss.params["text_side"] is True
    probe = Trainer(tiny_config(data, tmp_path / "probe", overrides))
    assert "captions" in probe.loss_fn.step_inputs()
    _, first, _ = probe.compute_loss(_first_batch(probe))
    result = Trainer(cfg).fit()
    assert result.epochs_done == 2 and result.steps == 10
    records = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if r["kind"] == "step"]
    assert len(steps) == 10 and all(math.isfinite(r["loss"]) for r in steps)
    assert steps[0]["loss"] == float(first)  # the same model, batch and captions
    assert steps[-1]["loss"] != steps[0]["loss"]


@pytest.mark.parametrize("model", ["scan", "saf"])
def test_text_side_trains_a_pair_scorer_and_is_eq6_plus_eq7_on_its_scores(
    tmp_path, data, float64, model
):
    # The shipped VSL configs train SGRAF: its score matrix goes through similarity_step,
    # which must receive the same captions (column order) as the embedding path.
    from test_train_cross import cross_config

    overrides = ["loss.name=vsl", "loss.text_side=true", "loss.alpha=0", "train.epochs=1"]
    trainer = Trainer(cross_config(data, tmp_path / "run", model, overrides))
    assert trainer.scores_pairs and "captions" in trainer.loss_fn.step_inputs()
    batch = _first_batch(trainer)
    _, logged, ctx = trainer.compute_loss(batch)
    sim = ctx["sim"].tolist()
    sim_t = [list(col) for col in zip(*sim, strict=True)]
    ids = batch.img_index
    semantic = trainer.loss_fn.semantic
    c = semantic.similarity(ids, ids).double().tolist()
    captions = [trainer.train_set.captions[i] for i in batch.cap_index.tolist()]
    tc = semantic.caption_similarity(captions).double().tolist()
    l_vs, l_ts = naive_rank_disagreement(sim, c), naive_rank_disagreement(sim_t, tc)
    assert l_ts > 0.05
    n = len(sim)
    tol = BETA * 16 * (n * n + 1 / TAU) * torch.finfo(torch.float64).eps
    assert float(logged) == pytest.approx(BETA * (l_vs + l_ts), abs=tol)
    assert Trainer(cross_config(data, tmp_path / "fit", model, overrides)).fit().steps == 5
