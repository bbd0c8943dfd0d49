"""Gradient caching: a step with the batch encoded in chunks equals the full-batch step.

The oracle for a model that draws random numbers (dropout) is the full-batch graph built chunk
by chunk in the same order (each chunk draws its own mask, as the cached first pass does): the
replay must give that step exactly, and without the replay it could not. Without randomness the
oracle is the plain ``model(batch)`` step. Float64 throughout; the two sides sum the same terms
in another order, so they agree to a few ulps of each tensor's scale.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from train_helpers import assert_same_params, model_params, tiny_config, tiny_data, tiny_raw
from vlret.data.dataset import RetrievalBatch
from vlret.losses import InfoNCELoss, build_loss
from vlret.run.config import ConfigError, apply_overrides, config_from_dict
from vlret.train import Trainer
from vlret.train.parallel.grad_cache import GradCache, split_batch


class Towers(nn.Module):
    """Two towers with dropout, LayerNorm and a BatchNorm'd image tower (running statistics)."""

    def __init__(self, dropout: float = 0.3, batch_norm: bool = False) -> None:
        super().__init__()
        norm = nn.BatchNorm1d(12) if batch_norm else nn.LayerNorm(12)
        self.img = nn.Sequential(nn.Linear(6, 12), norm, nn.Tanh(), nn.Dropout(dropout))
        self.txt = nn.Sequential(nn.Linear(5, 12), nn.Dropout(dropout), nn.Linear(12, 8))
        self.img_out = nn.Linear(12, 8)

    def forward(self, batch):
        return self.img_out(self.img(batch["img"])), self.txt(batch["txt"])


def _batch(n=23, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return {
        "img": torch.randn(n, 6, generator=gen, dtype=torch.float64),
        "txt": torch.randn(n, 5, generator=gen, dtype=torch.float64),
    }


def _grads(model):
    return {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}


def _close(got, want, scale_tol=1e-12):
    assert got.keys() == want.keys()
    for k in want:
        atol = scale_tol * max(1.0, float(want[k].abs().max()))
        torch.testing.assert_close(got[k], want[k], rtol=0, atol=atol, msg=k)


def _chunked_graph_step(model, batch, chunk, loss_fn, ids):
    """The oracle: the same chunks with a graph (the same RNG draws in the same order)."""
    outs = [model(c) for c in split_batch(batch, chunk)]
    img, txt = (torch.cat(o) for o in zip(*outs, strict=True))
    loss = loss_fn(img, txt, ids, ids)
    loss.backward()
    return loss


@pytest.mark.parametrize("chunk", [1, 5, 23, 40])
def test_replayed_dropout_gives_the_full_batch_gradient_of_the_same_draws(chunk):
    ids = torch.arange(23) // 2  # pairs of captions share an image: multi-positive
    loss_fn = InfoNCELoss(temperature=0.1, learnable_temperature=True, chunk_size=4).double()
    model = Towers().double()
    torch.manual_seed(11)
    want = _chunked_graph_step(model, _batch(), chunk, loss_fn, ids)
    want_grads, want_next = _grads(model) | _grads(loss_fn), torch.rand(3)
    model.zero_grad(set_to_none=True)
    loss_fn.zero_grad(set_to_none=True)

    torch.manual_seed(11)
    cache = GradCache(model, chunk_size=chunk)
    img, txt = cache.forward(_batch())
    assert img.requires_grad and img.grad_fn is None and img.shape == (23, 8)
    assert not any(p.grad is not None for p in model.parameters())
    got = loss_fn(img, txt, ids, ids)
    got.backward()
    cache.backward()
    torch.testing.assert_close(got, want, rtol=0, atol=1e-13)
    _close(_grads(model) | _grads(loss_fn), want_grads)
    # The RNG goes on as after the first pass: the replay leaves no trace in the stream.
    assert torch.equal(torch.rand(3), want_next)


def test_without_the_replay_the_gradient_would_differ():
    """The oracle can tell: re-drawing the dropout masks in the second pass changes the step."""
    ids = torch.arange(23)
    loss_fn = InfoNCELoss(temperature=0.1)
    model = Towers(dropout=0.5).double()
    torch.manual_seed(3)
    _chunked_graph_step(model, _batch(), 6, loss_fn, ids)
    want = _grads(model)
    model.zero_grad(set_to_none=True)
    torch.manual_seed(3)
    cache = GradCache(model, chunk_size=6)
    img, txt = cache.forward(_batch())
    loss_fn(img, txt, ids, ids).backward()
    for _chunk, state in cache._pending:  # what the replay must undo: fresh draws
        state.cpu = torch.get_rng_state()
    cache.backward()
    assert not torch.allclose(_grads(model)["txt.0.weight"], want["txt.0.weight"])


def test_without_randomness_it_equals_the_plain_full_batch_step():
    ids = torch.arange(23) % 7
    loss_fn = build_loss("unified", margin=0.2, gamma=10.0)
    model = Towers(dropout=0.0).double()
    img, txt = model(_batch())
    loss_fn(img, txt, ids, ids).backward()
    want = _grads(model)
    model.zero_grad(set_to_none=True)
    cache = GradCache(model, chunk_size=4)
    img, txt = cache.forward(_batch())
    loss_fn(img, txt, ids, ids).backward()
    cache.backward()
    _close(_grads(model), want)


def test_batch_norm_running_statistics_are_updated_once_per_chunk_not_twice():
    model = Towers(dropout=0.0, batch_norm=True).double()
    loss_fn = InfoNCELoss(temperature=0.1)
    ids = torch.arange(23)
    reference = Towers(dropout=0.0, batch_norm=True).double()
    reference.load_state_dict(model.state_dict())
    _chunked_graph_step(reference, _batch(), 8, loss_fn, ids)
    cache = GradCache(model, chunk_size=8)
    img, txt = cache.forward(_batch())
    loss_fn(img, txt, ids, ids).backward()
    cache.backward()
    assert int(model.img[1].num_batches_tracked) == 3  # 3 chunks, one update each
    assert_same_params(
        {k: v for k, v in model_params(model).items() if "running" in k},
        {k: v for k, v in model_params(reference).items() if "running" in k},
        atol=1e-15,
    )
    _close(_grads(model), _grads(reference))


def test_amp_loss_scaling_carries_the_scale_through_the_cached_gradients():
    """bfloat16 autocast and a GradScaler: the unscaled gradients and the step equal the
    oracle's under the same scaler (a CPU GradScaler; the trainer uses its CUDA twin)."""
    ids = torch.arange(16)
    results = []
    for cached in (False, True):
        torch.manual_seed(0)
        model = Towers(dropout=0.2)
        loss_fn = InfoNCELoss(temperature=0.1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0**12)
        batch = {k: v.float() for k, v in _batch(16, seed=4).items()}

        def autocast():
            return torch.autocast("cpu", dtype=torch.bfloat16)

        torch.manual_seed(5)
        if cached:
            cache = GradCache(model, chunk_size=5, autocast=autocast)
            img, txt = cache.forward(batch)
            assert img.dtype == torch.bfloat16
            scaler.scale(loss_fn(img.float(), txt.float(), ids, ids)).backward()
            scaled_grad = img.grad.float().abs().max()
            cache.backward()
        else:
            outs = []
            for c in split_batch(batch, 5):  # one autocast per chunk, as the cache runs them: a
                with autocast():  # shared one would sum the chunks' weight grads in bfloat16
                    outs.append(model(c))
            img, txt = (torch.cat(o).float() for o in zip(*outs, strict=True))
            scaler.scale(loss_fn(img, txt, ids, ids)).backward()
        scaler.unscale_(optimizer)
        grads = _grads(model)
        scaler.step(optimizer)
        scaler.update()
        results.append((grads, model_params(model)))
    assert scaled_grad > 100.0  # the cached gradients carried the 2^12 scale
    (want_g, want_p), (got_g, got_p) = results
    _close(got_g, want_g, scale_tol=1e-6)  # float32 sums in another order
    _close(got_p, want_p, scale_tol=1e-6)


def test_misuse_is_named():
    model = Towers().double()
    cache = GradCache(model, chunk_size=4)
    with pytest.raises(RuntimeError, match="forward"):
        cache.backward()
    cache.forward(_batch(8))
    with pytest.raises(RuntimeError, match="loss.backward"):
        cache.backward()
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="chunk_size"):
            GradCache(model, chunk_size=bad)
    with pytest.raises(TypeError, match="cannot split"):
        split_batch(object(), 2)
    with pytest.raises(ValueError, match="different lengths"):
        split_batch({"a": torch.zeros(4), "b": torch.zeros(6)}, 2)


def test_retrieval_batches_split_into_consecutive_chunks_of_the_same_padding():
    batch = RetrievalBatch(
        torch.arange(10.0).reshape(5, 2),
        torch.arange(15).reshape(5, 3),
        torch.tensor([3, 1, 2, 3, 2]),
        torch.tensor([0, 0, 1, 2, 2]),
        torch.arange(5),
    )
    parts = batch.chunks(2)
    assert [len(p.img_index) for p in parts] == [2, 2, 1]
    assert all(p.captions.shape[1] == 3 for p in parts)
    for field in ("features", "captions", "lengths", "img_index", "cap_index"):
        joined = torch.cat([getattr(p, field) for p in parts])
        assert torch.equal(joined, getattr(batch, field)), field
    texts = RetrievalBatch(["a", "b", "c"], ["x", "y", "z"], None, torch.arange(3), torch.arange(3))
    assert [p.captions for p in split_batch(texts, 2)] == [["x", "y"], ["z"]]
    assert split_batch(texts, 2)[1].lengths is None


SETTINGS = {
    "infonce_learnable_tiled": [
        "loss.name=infonce",
        "loss.learnable_temperature=true",
        "loss.chunk_size=3",
    ],
    "triplet_warmup": ["train.all_negatives_epochs=1"],
    # Stateful: the queue and its momentum keys update once per batch, not once per chunk.
    "adacl_queue_momentum": ["loss.name=adacl", "loss.queue_size=12", "train.momentum_encoder=0.9"],
}


def _run(tmp_path, name, chunk):
    data = tiny_data(tmp_path / "data")
    overrides = [
        *SETTINGS[name],
        "train.epochs=2",
        "train.validate=false",
        "optim.name=sgd",
        "optim.lr=0.1",
        "train.device=cpu",
    ]
    if chunk is not None:
        overrides.append(f"train.grad_cache_chunk={chunk}")
    config = tiny_config(data, tmp_path / f"out{chunk}", overrides)
    torch.set_default_dtype(torch.float64)
    try:
        with Trainer(config, print_fn=None) as trainer:
            trainer.fit()
            return model_params(trainer.model), trainer.loss_fn.state_dict()
    finally:
        torch.set_default_dtype(torch.float32)


@pytest.mark.parametrize("name", list(SETTINGS))
def test_trainer_steps_with_gradient_caching_equal_the_plain_steps(tmp_path, name):
    want_model, want_loss = _run(tmp_path, name, None)
    got_model, got_loss = _run(tmp_path, name, 3)  # batch 8: chunks of 3, 3, 2
    _close(got_model, want_model, scale_tol=1e-11)
    assert got_loss.keys() == want_loss.keys()
    for k, want in want_loss.items():
        if not isinstance(want, torch.Tensor):  # extra state (AdaCL's margins and statistics)
            torch.testing.assert_close(got_loss[k], want, rtol=1e-9, atol=1e-12, msg=k)
        elif want.is_floating_point():
            _close({k: got_loss[k]}, {k: want}, scale_tol=1e-11)
        else:
            assert torch.equal(got_loss[k], want), k  # queue pointers and ids


def test_grad_cache_chunk_must_be_positive(tmp_path):
    raw = apply_overrides(tiny_raw(tmp_path, tmp_path / "out"), ["train.grad_cache_chunk=0"])
    with pytest.raises(ConfigError, match="train.grad_cache_chunk"):
        config_from_dict(raw)


def test_step_log_statistics_with_gradient_caching_equal_the_plain_run(tmp_path):
    """With gradient caching the step context keeps no embeddings (they would be held through
    the re-encoding): the step log's batch statistics are taken before it, on logging steps
    only, and equal the plain run's."""
    import json

    from vlret.train.hooks.core import TrainHook

    class Contexts(TrainHook):
        def __init__(self):
            self.seen = []

        def after_step(self, trainer, step):
            self.seen.append(dict(step.context))

    data = tiny_data(tmp_path / "data")
    logs, contexts = {}, {}
    for chunk in (None, 3):
        overrides = ["train.epochs=1", "train.validate=false", "train.log_every=2"]
        overrides += ["train.device=cpu"] + ([f"train.grad_cache_chunk={chunk}"] if chunk else [])
        out = tmp_path / f"out{chunk}"
        hook = Contexts()
        torch.set_default_dtype(torch.float64)
        try:
            with Trainer(tiny_config(data, out, overrides), print_fn=None, hooks=[hook]) as t:
                t.fit()
        finally:
            torch.set_default_dtype(torch.float32)
        lines = (out / "metrics.jsonl").read_text().splitlines()
        logs[chunk] = [r for r in map(json.loads, lines) if r["kind"] == "step"]
        contexts[chunk] = hook.seen
    assert [r["step"] for r in logs[3]] == [r["step"] for r in logs[None]] and logs[3]
    for got, want in zip(logs[3], logs[None], strict=True):
        for key in ("pos_sim", "hardest_neg_sim"):
            assert got[key] == pytest.approx(want[key], rel=0, abs=1e-9), key
    assert all("img" in c and "txt" in c for c in contexts[None])
    for k, c in enumerate(contexts[3], start=1):  # steps 1, 2, ...: every second one logged
        assert "img" not in c and "txt" not in c and "ids" in c
        assert ("batch_stats" in c) == (k % 2 == 0)
