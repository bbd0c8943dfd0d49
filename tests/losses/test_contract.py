"""The contract every registered loss keeps, parametrised over ``available_losses()``.

As torchmetrics' ``RetrievalMetricTester`` serves every retrieval metric, these tests serve every
loss family: a new family is picked up by the registry and checked here, so its own test file
only needs its oracle (the paper's equation, a naive loop). The properties:

* **dense equals tiled**: with ``chunk_size`` set (a ``TiledLossParams`` declaration) the tiled
  form gives the dense form's values and gradients (embeddings and the loss's own parameters);
* **local shards add up** (``LossCapabilities.local_shards``, or per-pair terms that take a
  shard without tiles): over uneven shards ``(start, stop)`` of one batch,
  ``sum_s L_sum(shard=s) == L_sum``, ``sum_s L_mean(shard=s) == L_mean`` (``"mean"`` divides by
  the whole batch) and ``cat_s L_none(shard=s) == L_none``, gradients included;
* **pair blocks add up** (``LossCapabilities.pairwise_sum``, the ring exchange's unit): the sum
  of ``pair_block_terms`` over the column blocks of a batch is its ``"none"`` terms;
* **reductions**: ``"none"`` gives ``(B,)`` terms, ``"sum"`` their sum and ``"mean"`` their sum
  over ``B`` (``reduce_per_index``);
* **float64 gradients**: ``torch.autograd.gradcheck`` on each entry point;
* **half precision**: float16 / bfloat16 inputs are computed in float32 (the numerics rule),
  finite, and within the input's rounding of the float32 value;
* **named errors**: bad input raises ``ValueError`` naming the argument.

Every case builds a fresh, seeded loss (:func:`build`): a stateful loss (AdaCL's margins, a
memory queue) carries nothing from one case to the next. What a loss needs beyond its defaults
(a semantic model, an embedding width, identities, offline negatives, per-item scores) is read
from its declared capabilities and parameters; a property skipped for a loss names the
capability or declaration that says it does not apply. Tolerances: float64 paths that differ
in the order of their sums agree to a thousand roundings; half precision is bounded by its
``eps`` and the input size.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from torch.autograd.gradcheck import GradcheckError

from vlret.losses import LossCapabilities, PairLoss, available_losses, build_loss, loss_class
from vlret.losses.aoq import OFFLINE_EMBEDDINGS
from vlret.losses.params import TiledLossParams
from vlret.similarity import positive_mask

pytestmark = pytest.mark.usefixtures("one_thread")

#: Every registered loss, read when the module is collected: a new family is a new case. A
#: loss of a cross-modal encoder's token scores (``masked_language``, IRRA's ``mlm``) reads
#: neither the embeddings nor a score matrix: tests/losses/test_mlm.py checks it.
TOKEN_LOSSES = [n for n in available_losses() if loss_class(n).capabilities().masked_language]
LOSSES = [n for n in available_losses() if n not in TOKEN_LOSSES]

B, D = 6, 4
#: Repeated ids: pairs 0 and 3, 1 and 5 are further positives of each other.
IDS = [0, 1, 2, 0, 3, 1]
#: Uneven shards of the batch and uneven tiles (a last tile shorter than the others).
SHARDS = [(0, 1), (1, 4), (4, B)]
TILES = (1, 4)
#: float64 paths that differ only in the order of their sums agree to this, relative to the
#: largest reference value (or 1): a thousand roundings of float64.
TOL64 = 1e3 * torch.finfo(torch.float64).eps

# -- what a loss needs beyond its defaults --------------------------------------------------
#
# Read from its declarations: its capabilities (``needs_semantics``, ``needs_embed_dim``,
# ``similarity_inputs``, ``offline_negatives``, ``train_identities``) and its parameter names,
# as the run's loss builder fills them. The one table of names says what no declaration says.

#: Losses whose gradient is prescribed rather than the derivative of their value, as each
#: documents (no capability declares it); with the parameters given, where there are any, it
#: is the derivative. test_float64_gradcheck checks that each entry is still true.
PRESCRIBED_GRADIENT: dict[str, tuple[str, dict[str, Any] | None]] = {
    "circle": ("its weights alpha_p, alpha_n are constants (Sun et al. 2020, circle_loss)", None),
    "goal": ("the value is the hinge, the gradient the weights' surrogate (goal.objective)", None),
    "tal": ("the positives' weights are constants by default (RDE)", {"detach_weights": False}),
}


def caps(name: str, params: dict[str, Any] | None = None) -> LossCapabilities:
    return loss_class(name).capabilities(params or {})


def declares(name: str, param: str) -> bool:
    return param in loss_class(name).Params.names()


def stateful_params(name: str) -> dict[str, Any]:
    """The parameters that give a loss a memory queue (``owns_queue``), or none."""
    return {"queue_size": 2 * B} if declares(name, "queue_size") else {}


def tiled_form(name: str) -> bool:
    """A tiled form: the declaration has a tile height (``TiledLossParams.chunk_size``)."""
    return issubclass(loss_class(name).Params, TiledLossParams)


def semantic_model() -> Any:
    """A fitted caption TF-IDF over the images of :data:`IDS` (``needs_semantics``)."""
    from vlret.semantic import CaptionTfidf

    words = ["red", "car", "dog", "park", "blue", "tree", "man", "river"]
    captions = {
        i: [f"{words[i]} {words[i + 1]} near the {words[(i + 3) % 8]}", f"{words[i + 2]} photo"]
        for i in sorted(set(IDS))
    }
    return CaptionTfidf().fit(captions)


def build(name: str, *, dtype: torch.dtype = torch.float64, **params: Any) -> PairLoss:
    """A fresh loss ``name`` with its required parameters and ``params``, its parameters in
    ``dtype``, seeded (an ID classifier draws its weights), in training mode."""
    full = dict(params)
    if "reduction" in params and declares(name, "base_params"):
        # a base loss keeps its own reduction, and "none" needs both (VSLParams)
        full.setdefault("base_params", {"reduction": params["reduction"]})
    c = caps(name, full)
    if c.needs_semantics:
        full.setdefault("semantic", semantic_model())
    if c.needs_embed_dim:
        full.setdefault("embed_dim", D)
    if c.train_identities:  # the identity count and the width, as a run fills them
        full.setdefault("num_classes", max(IDS) + 1)
        full.setdefault("dim", D)
    torch.manual_seed(1234)
    return build_loss(name, **full).to(dtype).train()


def batch(seed: int = 0, dtype: torch.dtype = torch.float64) -> tuple[torch.Tensor, ...]:
    """``(img_emb, txt_emb)``, Gaussian (no ties among the scores), requiring gradients."""
    g = torch.Generator().manual_seed(seed)
    x, y = (torch.randn(B, D, generator=g, dtype=torch.float64) for _ in range(2))
    return x.to(dtype).requires_grad_(), y.to(dtype).requires_grad_()


def embedding_inputs(name: str, dtype: torch.dtype = torch.float64) -> dict[str, Any]:
    """The ids and a loss's further embeddings (constants) for ``forward``."""
    g = torch.Generator().manual_seed(7)
    offline = OFFLINE_EMBEDDINGS if caps(name).offline_negatives else ()
    extras = {k: exact_values((B, D), g, dtype) for k in offline}
    return {"img_ids": torch.tensor(IDS), **extras}


def exact_values(shape: tuple[int, ...], g: torch.Generator, dtype: torch.dtype) -> torch.Tensor:
    """Values in ``[-1, 1)`` on a grid of ``1/32``: the same in every float dtype."""
    return (torch.randint(-32, 32, shape, generator=g) / 32).to(dtype)


def similarity_inputs(name: str, dtype: torch.dtype = torch.float64) -> dict[str, Any]:
    """``pos_mask`` of the ids and what ``LossCapabilities.similarity_inputs`` names: ids, or
    per-item ``(B,)`` scores (AOQ's offline scores)."""
    g = torch.Generator().manual_seed(8)
    out: dict[str, Any] = {"pos_mask": positive_mask(IDS, IDS)}
    for key in caps(name).similarity_inputs:
        if key in ("img_ids", "txt_ids"):
            out[key] = list(IDS)
        else:
            out[key] = exact_values((B,), g, dtype)
    return out


def similarity(seed: int = 0, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """A ``(B, B)`` score matrix of cosine-like values, no ties, requiring gradients."""
    g = torch.Generator().manual_seed(seed)
    return (
        (torch.rand(B, B, generator=g, dtype=torch.float64) * 1.8 - 0.9).to(dtype).requires_grad_()
    )


def has_similarity_entry(name: str) -> bool:
    """A loss that classifies the training identities (``train_identities``) classifies
    embeddings: a score matrix has none (test_builds_and_scores checks it refuses one)."""
    return not caps(name).train_identities


def needs_similarity_entry(name: str) -> None:
    if not has_similarity_entry(name):
        pytest.skip(f"{name}: LossCapabilities.train_identities: it classifies embeddings")


def needs_tiled_form(name: str) -> None:
    if not tiled_form(name):
        pytest.skip(f"{name}'s Params is no TiledLossParams: no chunk_size, no tiled form")


def close(actual: torch.Tensor, expected: torch.Tensor, tol: float, what: str) -> None:
    if not expected.is_floating_point():  # a queue's filled slots, its ids
        assert torch.equal(actual, expected), what
        return
    scale = max(float(expected.detach().abs().max()), 1.0)
    torch.testing.assert_close(
        actual.detach(), expected.detach(), rtol=tol, atol=tol * scale, msg=lambda m: f"{what}: {m}"
    )


def grads(value: torch.Tensor, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    out = torch.autograd.grad(value, inputs, allow_unused=True)
    return [torch.zeros_like(t) if g is None else g for t, g in zip(inputs, out, strict=True)]


def learnable(loss: PairLoss) -> list[torch.Tensor]:
    return [p for p in loss.parameters() if p.requires_grad]


# -- coverage and fresh instances -------------------------------------------------------------


def test_parametrisation_is_the_registry():
    """Every registered loss is a case (read from the registry, not listed here), and the
    table of prescribed gradients names registered losses only."""
    assert sorted(LOSSES + TOKEN_LOSSES) == available_losses()
    assert len(LOSSES) >= 18  # the families of the package (a lost import would show here)
    stale = set(PRESCRIBED_GRADIENT) - set(LOSSES)
    assert not stale, f"PRESCRIBED_GRADIENT names unregistered losses: {sorted(stale)}"


@pytest.mark.parametrize("name", LOSSES)
def test_builds_and_scores_both_entry_points(name):
    """The case builder covers the loss: a finite scalar with a gradient from the embeddings,
    and from a score matrix unless the loss declares none (which then refuses it by name)."""
    loss = build(name)
    x, y = batch()
    value = loss(x, y, **embedding_inputs(name))
    assert value.shape == () and torch.isfinite(value)
    gx, gy = grads(value, [x, y])
    assert torch.isfinite(gx).all() and torch.isfinite(gy).all() and gx.abs().sum() > 0
    sim = similarity()
    if not has_similarity_entry(name):
        with pytest.raises(ValueError, match=name):
            loss.from_similarity(sim, **similarity_inputs(name))
        return
    value = build(name).from_similarity(sim, **similarity_inputs(name))
    assert value.shape == () and torch.isfinite(value)
    assert grads(value, [sim])[0].abs().sum() > 0


@pytest.mark.parametrize("name", LOSSES)
def test_fresh_instances_share_no_state(name):
    """Each case builds its own loss: training calls on one instance (AdaCL re-estimates its
    margins) leave another instance's state and value as built."""
    state = stateful_params(name)
    used, fresh = build(name, **state), build(name, **state)
    before = {k: v.clone() for k, v in fresh.state_dict().items() if isinstance(v, torch.Tensor)}
    reference = build(name, **state)(*batch(1), **embedding_inputs(name))
    for seed in (2, 3):
        x, y = batch(seed)
        used(x, y, **embedding_inputs(name)).backward()
    after = {k: v for k, v in fresh.state_dict().items() if isinstance(v, torch.Tensor)}
    assert before.keys() == after.keys()
    for key, value in before.items():
        assert torch.equal(value, after[key]), key
    close(fresh(*batch(1), **embedding_inputs(name)), reference, 0.0, "a fresh instance's value")


# -- dense equals tiled -----------------------------------------------------------------------


@pytest.mark.parametrize("tile", TILES)
@pytest.mark.parametrize("name", LOSSES)
def test_dense_equals_tiled(name, tile):
    """The tiled form's ``(B,)`` terms, its default reduction, the gradients of the
    embeddings and of the loss's own parameters, and its state after a training call (AdaCL's
    margins) are the dense form's, in float64."""
    needs_tiled_form(name)
    inputs = embedding_inputs(name)
    weights = torch.linspace(0.5, 1.5, B, dtype=torch.float64)  # every term seen apart
    results = []
    for chunk_size in (None, tile):
        loss = build(name, reduction="none", chunk_size=chunk_size)
        x, y = batch()
        terms = loss(x, y, **inputs)
        assert terms.shape == (B,)
        default = build(name, chunk_size=chunk_size)(*batch(), **inputs)
        results.append((terms, default, grads(terms @ weights, [x, y, *learnable(loss)]), loss))
    (dense, dense_default, dense_grads, dense_loss), (tiled, tiled_default, tiled_grads, loss) = (
        results
    )
    close(tiled, dense, TOL64, "the terms")
    close(tiled_default, dense_default, TOL64, "the default reduction")
    for i, (a, b) in enumerate(zip(tiled_grads, dense_grads, strict=True)):
        close(a, b, TOL64, f"gradient {i} (img_emb, txt_emb, then the loss's parameters)")
    for (key, a), (_, b) in zip(
        loss.state_dict().items(), dense_loss.state_dict().items(), strict=True
    ):
        if isinstance(a, torch.Tensor):
            close(a, b, TOL64, f"state {key}")


@pytest.mark.parametrize("name", LOSSES)
def test_stateful_dense_equals_tiled_over_steps(name):
    """A loss built with state (AdaCL's memory queue, filled from every training batch, and
    its margins): over training steps that fill the queue and wrap it, the tiled form's values,
    gradients and state stay the dense form's."""
    params = stateful_params(name)
    if not caps(name, params).owns_queue:
        pytest.skip(f"{name}: LossCapabilities.owns_queue is False (no queue_size)")
    needs_tiled_form(name)
    dense, tiled = build(name, **params), build(name, chunk_size=TILES[1], **params)
    for seed in range(4):
        (a, ga), (b, gb) = (
            (value, grads(value, [x, y]))
            for loss in (dense, tiled)
            for x, y in [batch(seed)]
            for value in [loss(x, y, **embedding_inputs(name))]
        )
        close(b, a, TOL64, f"step {seed}'s value")
        for g_tiled, g_dense in zip(gb, ga, strict=True):
            close(g_tiled, g_dense, TOL64, f"step {seed}'s gradients")
    for (key, a), (_, b) in zip(
        dense.state_dict().items(), tiled.state_dict().items(), strict=True
    ):
        if isinstance(a, torch.Tensor):
            close(b, a, TOL64, f"state {key}")


# -- local shards and pair blocks -------------------------------------------------------------


@pytest.mark.parametrize("reduction", ["sum", "mean", "none"])
@pytest.mark.parametrize("name", LOSSES)
def test_local_shards_add_up(name, reduction):
    """``shard=(start, stop)`` computes the terms of pairs ``start:stop`` of the gathered
    batch: over uneven shards the values and gradients add up to the whole batch's."""
    c = caps(name)
    per_pair = bool(getattr(loss_class(name), "pairwise_terms", False))
    if not (c.local_shards or per_pair):
        pytest.skip(
            f"{name}: LossCapabilities.local_shards is False and its terms are not per pair"
        )
    tile = {"chunk_size": TILES[1]} if c.local_shards else {}
    inputs = embedding_inputs(name)
    loss = build(name, reduction=reduction, **tile)
    x, y = batch()
    whole = loss(x, y, **inputs)
    params = [x, y, *learnable(loss)]
    weights = torch.linspace(0.5, 1.5, B, dtype=torch.float64)

    def scalar(value: torch.Tensor, start: int, stop: int) -> torch.Tensor:
        return value @ weights[start:stop] if reduction == "none" else value

    expected = grads(scalar(whole, 0, B), params)
    sharded = build(name, reduction=reduction, **tile)  # one rank's module, called per shard
    xs, ys = batch()
    parts = [sharded(xs, ys, **inputs, shard=shard) for shard in SHARDS]
    if reduction == "none":
        assert [p.shape for p in parts] == [(stop - start,) for start, stop in SHARDS]
        close(torch.cat(parts), whole, TOL64, "the shards' terms")
    else:
        close(sum(parts), whole, TOL64, f"the sum of the shards' {reduction}")
    total = sum(scalar(p, *shard) for p, shard in zip(parts, SHARDS, strict=True))
    got = grads(total, [xs, ys, *learnable(sharded)])
    for i, (a, b) in enumerate(zip(got, expected, strict=True)):
        close(a, b, TOL64, f"gradient {i} (img_emb, txt_emb, then the loss's parameters)")


@pytest.mark.parametrize("chunk_size", [None, 2])
@pytest.mark.parametrize("name", LOSSES)
def test_pair_blocks_add_up(name, chunk_size):
    """``LossCapabilities.pairwise_sum``: row ``i``'s ``pair_block_terms`` summed over the
    column blocks of the batch (positives: the own pair and equal ids, as the ring exchange
    passes them) is row ``i``'s ``"none"`` term, values and gradients."""
    if not caps(name).pairwise_sum:
        pytest.skip(f"{name}: LossCapabilities.pairwise_sum is False")
    ids = torch.tensor(IDS)
    loss = build(name, reduction="none", chunk_size=chunk_size)
    x, y = batch()
    whole = loss(x, y, ids)
    weights = torch.linspace(0.5, 1.5, B, dtype=torch.float64)
    expected = grads(whole @ weights, [x, y, *learnable(loss)])
    x, y = batch()
    blocks = [(0, 2), (2, 3), (3, B)]

    def positives_of(lo: int, hi: int):
        def positives(start: int, stop: int) -> torch.Tensor:
            rows = torch.arange(start, stop)[:, None]
            cols = torch.arange(lo, hi)[None, :]
            return (ids[start:stop, None] == ids[None, lo:hi]) | (rows == cols)

        return positives

    summed = sum(loss.pair_block_terms(x, y[lo:hi], positives_of(lo, hi)) for lo, hi in blocks)
    close(summed, whole, TOL64, "the blocks' sum")
    got = grads(summed @ weights, [x, y, *learnable(loss)])
    for i, (a, b) in enumerate(zip(got, expected, strict=True)):
        close(a, b, TOL64, f"gradient {i} (img_emb, txt_emb, then the loss's parameters)")


# -- reductions -------------------------------------------------------------------------------


@pytest.mark.parametrize("entry", ["embeddings", "similarity"])
@pytest.mark.parametrize("name", LOSSES)
def test_reductions_agree(name, entry):
    """``"none"`` gives the ``(B,)`` per-index terms, ``"sum"`` their sum and ``"mean"`` their
    mean (``reduce_per_index``: the sum over ``B``)."""
    if entry == "similarity":
        needs_similarity_entry(name)
    values = {}
    for reduction in ("none", "sum", "mean"):
        loss = build(name, reduction=reduction)
        if entry == "embeddings":
            values[reduction] = loss(*batch(), **embedding_inputs(name))
        else:
            values[reduction] = loss.from_similarity(similarity(), **similarity_inputs(name))
    none = values["none"]
    assert none.shape == (B,) and values["sum"].shape == () == values["mean"].shape
    close(values["sum"], none.sum(), TOL64, '"sum" against the sum of "none"')
    close(values["mean"], none.sum() / B, TOL64, '"mean" against the mean of "none"')


# -- float64 gradients ------------------------------------------------------------------------

ENTRIES = ["embeddings", "tiled", "similarity"]


def entry_function(name: str, entry: str, loss: PairLoss, dtype: torch.dtype = torch.float64):
    """``(f, inputs)``: the loss at one entry point as a function of its differentiable
    inputs (the embeddings; or the score matrix and the per-item scores it takes)."""
    if entry == "similarity":
        needs_similarity_entry(name)
        given = similarity_inputs(name, dtype)
        keys = [
            k for k, v in given.items() if isinstance(v, torch.Tensor) and v.is_floating_point()
        ]
        tensors = [similarity(dtype=dtype), *(given[k].requires_grad_() for k in keys)]

        def f(sim: torch.Tensor, *scores: torch.Tensor) -> torch.Tensor:
            return loss.from_similarity(sim, **{**given, **dict(zip(keys, scores, strict=True))})

        return f, tensors
    inputs = embedding_inputs(name, dtype)
    return (lambda x, y: loss(x, y, **inputs)), list(batch(dtype=dtype))


@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize("name", LOSSES)
def test_float64_gradcheck(name, entry):
    """Autograd's gradient is the finite-difference one at every entry point. The loss is in
    eval mode: a training call re-estimates AdaCL's margins from the detached batch (no
    gradient by design), which a finite difference would see. Gaussian inputs have no ties
    (a hardest negative is unique) and no hinge at its kink."""
    tile = {}
    if entry == "tiled":
        needs_tiled_form(name)
        tile = {"chunk_size": TILES[1]}
    f, inputs = entry_function(name, entry, build(name, **tile).eval())
    params: dict[str, Any] = {}
    if name in PRESCRIBED_GRADIENT:
        reason, params = PRESCRIBED_GRADIENT[name]
        with pytest.raises(GradcheckError):  # the entry is still true
            torch.autograd.gradcheck(f, inputs, eps=1e-6, atol=1e-6, rtol=1e-5)
        if params is None:
            pytest.skip(f"{name}'s gradient is prescribed: {reason}")
    f, inputs = entry_function(name, entry, build(name, **tile, **params).eval())
    assert torch.autograd.gradcheck(f, inputs, eps=1e-6, atol=1e-6, rtol=1e-5)


# -- half precision ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize("name", LOSSES)
def test_half_precision(name, entry, dtype):
    """A half-precision input is computed in float32 or wider (ARCHITECTURE, numerics):

    * the value is finite, not in ``dtype``, and the float32 computation on the same (rounded)
      values, up to ``eps32`` per input element;
    * it lies within the input's rounding of the float32 value on the unrounded input: rounding
      moves each input ``v`` by at most ``u |v|`` (``u = eps / 2`` of ``dtype``), so the value
      by at most about ``u sum |dL/dv| |v|`` (first order, taking the larger slope of the two
      ends, doubled for the second order);
    * the gradients reach the half inputs finite, in their dtype.
    """
    tile = {}
    if entry == "tiled":
        needs_tiled_form(name)
        tile = {"chunk_size": TILES[1]}

    def at(dtype_: torch.dtype):
        return entry_function(name, entry, build(name, dtype=torch.float32, **tile), dtype_)

    f32, exact = at(torch.float32)
    f16, _ = at(dtype)
    rounded = [t.detach().to(dtype).requires_grad_() for t in exact]
    value = f16(*rounded)
    assert torch.isfinite(value)
    assert torch.finfo(value.dtype).eps <= torch.finfo(torch.float32).eps, value.dtype
    upcast = [t.detach().float().requires_grad_() for t in rounded]
    size = sum(t.numel() for t in exact)
    close(value, f32(*upcast), size * torch.finfo(torch.float32).eps, "float32, rounded input")
    slopes = []
    for point in (exact, upcast):
        g = grads(at(torch.float32)[0](*point), point)
        slopes.append(
            sum(float((gp.abs() * p.detach().abs()).sum()) for gp, p in zip(g, point, strict=True))
        )
    u = torch.finfo(dtype).eps / 2
    reference = f32(*exact).detach()
    tol = 2 * u * max(slopes) + size * torch.finfo(torch.float32).eps * max(
        float(reference.abs()), 1.0
    )
    assert abs(float(value.detach()) - float(reference)) <= tol
    for g in grads(value, rounded):
        assert g.dtype == dtype and torch.isfinite(g).all()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("tiled", [False, True], ids=["dense", "tiled"])
@pytest.mark.parametrize("name", LOSSES)
def test_stateful_half_precision_over_steps(name, tiled, dtype):
    """With a memory queue, a half-precision batch is scored against the queue in float32
    too: over steps that fill the queue, the values are those of a twin fed the same (rounded)
    values in float32."""
    params = stateful_params(name)
    if not caps(name, params).owns_queue:
        pytest.skip(f"{name}: LossCapabilities.owns_queue is False (no queue_size)")
    if tiled:
        needs_tiled_form(name)
        params = {**params, "chunk_size": TILES[1]}
    half, full = (build(name, dtype=torch.float32, **params) for _ in range(2))
    for seed in range(3):
        x, y = (t.detach().to(dtype) for t in batch(seed))
        value = half(x, y, **embedding_inputs(name, dtype))
        assert value.dtype == torch.float32
        twin = full(x.float(), y.float(), **embedding_inputs(name, torch.float32))
        close(value, twin, 2 * B * D * torch.finfo(torch.float32).eps, f"step {seed}")


# -- named errors -----------------------------------------------------------------------------


def _nan(t: torch.Tensor) -> torch.Tensor:
    t = t.detach().clone()
    t[1, 2] = math.nan
    return t


#: Bad score matrices and masks for ``from_similarity``: (what, sim, pos_mask, the name).
BAD_SIMILARITY = {
    "non-square sim": (lambda: torch.rand(B, B + 1, dtype=torch.float64), None, "sim"),
    "1-D sim": (lambda: torch.rand(B, dtype=torch.float64), None, "sim"),
    "integer sim": (lambda: torch.ones(B, B, dtype=torch.long), None, "sim"),
    "NaN in sim": (lambda: _nan(similarity()), None, "sim"),
    "pos_mask of another shape": (
        similarity,
        lambda: torch.eye(B - 1, dtype=torch.bool),
        "pos_mask",
    ),
    "float pos_mask": (similarity, lambda: torch.eye(B, dtype=torch.float64), "pos_mask"),
}


@pytest.mark.parametrize("bad", list(BAD_SIMILARITY))
@pytest.mark.parametrize("name", LOSSES)
def test_bad_similarity_is_named(name, bad):
    needs_similarity_entry(name)
    sim, mask, argument = BAD_SIMILARITY[bad]
    inputs = {**similarity_inputs(name), "pos_mask": None if mask is None else mask()}
    with pytest.raises(ValueError, match=rf"\b{argument}\b"):
        build(name).from_similarity(sim(), **inputs)


def _short(t: torch.Tensor) -> torch.Tensor:
    return t.detach()[: B - 1]


#: Bad embedding batches for ``forward``: (what, change to img_emb, txt_emb, ids; the name).
BAD_EMBEDDINGS = {
    "batch sizes differ": (lambda x: x, _short, None, r"img_emb and txt_emb"),
    "1-D img_emb": (lambda x: x.detach()[0], lambda y: y, None, "img_emb"),
    "integer txt_emb": (lambda x: x, lambda y: y.detach().long(), None, "txt_emb"),
    "NaN in img_emb": (_nan, lambda y: y, None, "img_emb"),
    "NaN in txt_emb": (lambda x: x, _nan, None, "txt_emb"),
    "img_ids of another length": (lambda x: x, lambda y: y, IDS[:-1], "img_ids"),
}


@pytest.mark.parametrize("tiled", [False, True], ids=["dense", "tiled"])
@pytest.mark.parametrize("bad", list(BAD_EMBEDDINGS))
@pytest.mark.parametrize("name", LOSSES)
def test_bad_embeddings_are_named(name, bad, tiled):
    tile = {}
    if tiled:
        needs_tiled_form(name)
        tile = {"chunk_size": TILES[1]}
    change_x, change_y, ids, argument = BAD_EMBEDDINGS[bad]
    x, y = batch()
    inputs = embedding_inputs(name)
    if ids is not None:
        inputs["img_ids"] = torch.tensor(ids)
    with pytest.raises(ValueError, match=rf"\b{argument}\b"):
        build(name, **tile)(change_x(x), change_y(y), **inputs)
