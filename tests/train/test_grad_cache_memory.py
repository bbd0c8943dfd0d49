"""Gradient caching holds nothing batch-sized into the re-encoding but the cached gradients.

During :meth:`GradCache.backward` the only ``(B, D)`` tensors needed are the embeddings'
gradients (the cache). These tests look, at the moment the first chunk is re-encoded, at every
tensor still alive: every Python tensor object (``gc.get_objects``, which also finds what an
autograd ``ctx`` keeps as an attribute) and every tensor the loss saved for its backward
(weak references taken by ``saved_tensors_hooks``). The loss tensor is kept alive, as in the
custom loop of the module docstring (``loss.backward(); cache.backward()``); the embeddings
themselves are the caller's (that loop's ``img``, ``txt`` and the loss graph's leaves) and are
told apart by their storage. Also: no chunk's output outlives its chunk in the first pass (the
survivors that made the peak creep chunk after chunk), a gathered gradient's slice is copied
out of the gathered tensor, and every case still equals the plain full-batch step in float64.
"""

from __future__ import annotations

import gc
import warnings
import weakref

import pytest
import torch
from torch import nn

from vlret.losses import InfoNCELoss, build_loss
from vlret.train.parallel.grad_cache import GradCache

B, D, IN = 40, 16, 3  # inputs narrower than the embeddings: the batch is not "batch-sized"


class Towers(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.img = nn.Sequential(nn.Linear(IN, 24), nn.Tanh(), nn.Linear(24, D))
        self.txt = nn.Sequential(nn.Linear(IN, 24), nn.Tanh(), nn.Linear(24, D))
        self.watch = None  # called at the start of every forward

    def forward(self, batch):
        if self.watch is not None:
            self.watch()
        return self.img(batch[0]), self.txt(batch[1])


def _batch(seed=0):
    gen = torch.Generator().manual_seed(seed)
    return (
        torch.randn(B, IN, generator=gen, dtype=torch.float64),
        torch.randn(B, IN, generator=gen, dtype=torch.float64),
    )


def _ptr(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def _alive_batch_sized(exclude: set[int]) -> list[tuple[int, ...]]:
    """Shapes of the live floating-point Python tensors (not parameters) with at least
    ``B x D`` elements outside ``exclude`` (the RNG states are bytes)."""
    return [shape for shape, _ in _batch_sized(exclude)]


def _batch_sized(exclude: set[int]) -> list[tuple[tuple[int, ...], int]]:
    """``(shape, storage pointer)`` of each tensor :func:`_alive_batch_sized` counts."""
    gc.collect()
    found = []
    with warnings.catch_warnings():  # isinstance on torch.distributed's deprecated reduce_op
        warnings.simplefilter("ignore", FutureWarning)
        objects = [o for o in gc.get_objects() if isinstance(o, torch.Tensor)]
    for obj in objects:
        if obj.is_floating_point() and not isinstance(obj, nn.Parameter):
            if obj.numel() >= B * D and _ptr(obj) not in exclude:
                found.append((tuple(obj.shape), _ptr(obj)))
    return found


LOSSES = {
    "infonce tiled, several tiles": lambda: InfoNCELoss(temperature=0.1, chunk_size=8),
    "infonce tiled, one tile (kept)": lambda: InfoNCELoss(temperature=0.1, chunk_size=64),
    "infonce dense": lambda: InfoNCELoss(temperature=0.1),
    "triplet tiled (hinges)": lambda: build_loss("triplet", chunk_size=8),
    "siglip tiled (checkpointed tiles)": lambda: build_loss("siglip", chunk_size=8),
}


def _plain_grads(model, loss_fn, batch, ids):
    model.zero_grad(set_to_none=True)
    img, txt = model(batch)
    loss_fn(img, txt, ids, ids).backward()
    return {k: p.grad.clone() for k, p in model.named_parameters()}


def _assert_grads_equal(model, want):
    for k, p in model.named_parameters():
        atol = 1e-12 * max(1.0, float(want[k].abs().max()))
        torch.testing.assert_close(p.grad, want[k], rtol=0, atol=atol, msg=k)


@pytest.mark.parametrize("name", list(LOSSES))
def test_only_the_cached_gradients_are_batch_sized_during_re_encoding(name):
    # what earlier tests in this process left alive is not this step's
    earlier = {ptr for _, ptr in _batch_sized(set())}
    torch.manual_seed(0)
    model, loss_fn = Towers().double(), LOSSES[name]().double()
    batch, ids = _batch(), torch.arange(B) // 2
    want = _plain_grads(model, loss_fn, batch, ids)
    model.zero_grad(set_to_none=True)

    cache = GradCache(model, chunk_size=16)
    img, txt = cache.forward(batch)
    saved: list[weakref.ref] = []

    def pack(t):
        if t.numel() >= B * D:
            saved.append(weakref.ref(t))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = loss_fn(img, txt, ids, ids)
    loss.backward()
    embeddings = {_ptr(img), _ptr(txt)}
    cached = {_ptr(img.grad), _ptr(txt.grad)}
    del img, txt  # the loss graph still holds the leaves: they are told apart by storage
    seen = []

    def watch():
        if not seen:
            held = [
                tuple(r().shape) for r in saved if r() is not None and _ptr(r()) not in embeddings
            ]
            seen.append((_alive_batch_sized(embeddings | cached | earlier), held))

    model.watch = watch
    cache.backward()
    assert seen == [([], [])], f"alive into the re-encoding: {seen}"
    assert saved, "the hooks saw the loss's saved tensors"
    _assert_grads_equal(model, want)
    assert loss.grad_fn is not None  # the loss was alive all along


def test_no_chunk_output_outlives_its_chunk_in_the_first_pass():
    torch.manual_seed(0)
    model = Towers().double()
    outputs: list[weakref.ref] = []
    alive_at_next: list[int] = []
    forward = Towers.forward

    def recording(self, batch):
        alive_at_next.append(sum(r() is not None for r in outputs))
        out = forward(self, batch)
        outputs.extend(weakref.ref(o) for o in out)
        return out

    model.forward = recording.__get__(model)
    cache = GradCache(model, chunk_size=7)
    img, txt = cache.forward(_batch())
    assert alive_at_next == [0] * 6  # 40 rows in chunks of 7: none survives into the next
    with torch.no_grad():
        parts = [forward(model, tuple(t[a : a + 7] for t in _batch())) for a in range(0, B, 7)]
    assert torch.equal(img, torch.cat([p[0] for p in parts]))
    assert torch.equal(txt, torch.cat([p[1] for p in parts]))
    assert img.is_leaf and img.requires_grad and img.shape == (B, D)


def test_chunks_larger_than_the_first_or_of_another_dtype_are_concatenated():
    model = Towers().double()
    calls = []

    def split(batch, size):  # a custom split whose chunks grow: 4, 12, 24 rows
        return [tuple(t[a:b] for t in batch) for a, b in ((0, 4), (4, 16), (16, B))]

    def forward(batch):
        calls.append(len(batch[0]))
        img, txt = Towers.forward(model, batch)
        return (img.float() if len(calls) == 2 else img), txt

    cache = GradCache(model, chunk_size=4, split=split)
    cache.model = type("M", (nn.Module,), {"forward": lambda self, b: forward(b)})()
    img, txt = cache.forward(_batch())
    with torch.no_grad():
        parts = [Towers.forward(model, c) for c in split(_batch(), 4)]
    want_img = torch.cat([parts[0][0], parts[1][0].float(), parts[2][0]])  # promoted back
    assert img.dtype == torch.float64 and torch.equal(img, want_img)
    assert torch.equal(txt, torch.cat([p[1] for p in parts]))


def test_outputs_of_another_shape_per_chunk_are_named():
    shapes = iter([(4, D), (4, D + 1)])

    class Odd(nn.Module):
        def forward(self, batch):
            return torch.zeros(next(shapes), dtype=torch.float64)

    cache = GradCache(Odd(), chunk_size=4)
    with pytest.raises(ValueError, match=r"different shapes per chunk: \(16,\) and \(17,\)"):
        cache.forward(torch.zeros(8, 2))


class GatheredLoss(nn.Module):
    """InfoNCE over the batch and rows of another "rank", concatenated as a gather does: the
    embeddings' gradients come back as slices of the ``(3B, D)`` gradient of the gathered
    batch (the backward of ``torch.cat``)."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = InfoNCELoss(temperature=0.1, chunk_size=16).double()
        gen = torch.Generator().manual_seed(5)
        self.other = torch.randn(2, B, D, generator=gen, dtype=torch.float64)

    def forward(self, img, txt, ids, _):
        img = torch.cat([self.other[0], img, self.other[1]])
        txt = torch.cat([self.other[1], txt, self.other[0]])
        everyone = torch.cat([ids + B, ids, ids + 2 * B])
        return self.inner(img, txt, everyone, everyone)


def test_a_gathered_gradients_slice_is_copied_out_before_re_encoding():
    torch.manual_seed(0)
    model, loss_fn = Towers().double(), GatheredLoss()
    batch, ids = _batch(), torch.arange(B)
    want = _plain_grads(model, loss_fn, batch, ids)
    model.zero_grad(set_to_none=True)

    cache = GradCache(model, chunk_size=16)
    img, txt = cache.forward(batch)
    loss_fn(img, txt, ids, ids).backward()
    # the premise: views of the (3B, D) gathered gradients
    assert img.grad.untyped_storage().nbytes() == 3 * B * D * 8
    assert txt.grad.untyped_storage().nbytes() == 3 * B * D * 8
    views = [weakref.ref(img.grad), weakref.ref(txt.grad)]
    grads = img.grad.clone(), txt.grad.clone()
    seen = []
    model.watch = lambda: seen.append([r() is not None for r in views]) if not seen else None
    cache.backward()
    assert seen == [[False, False]]  # the (3B, D) gradients were freed before re-encoding
    assert img.grad.untyped_storage().nbytes() == B * D * 8  # the leaf holds the compact copy
    assert torch.equal(img.grad, grads[0]) and torch.equal(txt.grad, grads[1])
    _assert_grads_equal(model, want)


def test_gradients_sharing_one_storage_that_they_fill_are_not_copied():
    """One loss concatenating both outputs: the two gradients are the halves of one tensor,
    nothing is wasted and nothing is copied."""
    torch.manual_seed(0)
    model = Towers().double()
    cache = GradCache(model, chunk_size=16)
    img, txt = cache.forward(_batch())
    torch.cat([img, txt]).pow(2).sum().backward()
    before = img.grad, txt.grad
    assert _ptr(before[0]) == _ptr(before[1])  # the premise: halves of one (2B, D) gradient
    cache.backward()
    assert img.grad is before[0] and txt.grad is before[1]


@pytest.mark.parametrize("trim", [True, False])
def test_the_heap_is_trimmed_before_each_re_encoded_chunk_on_cpu(monkeypatch, trim):
    import vlret.train.parallel.grad_cache as module

    events = []
    monkeypatch.setattr(module, "_trim_heap", lambda: events.append("trim"))
    torch.manual_seed(0)
    model = Towers().double()
    model.watch = lambda: events.append("forward")
    cache = GradCache(model, chunk_size=16, trim_heap=trim)
    img, txt = cache.forward(_batch())  # 3 chunks, no trimming in the first pass
    InfoNCELoss(temperature=0.1).double()(img, txt).backward()
    cache.backward()
    replay = ["trim", "forward"] if trim else ["forward"]
    assert events == ["forward"] * 3 + replay * 3
