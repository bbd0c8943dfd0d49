"""Gradient caching: the exact gradient of a big contrastive batch at one chunk's memory.

A contrastive loss couples every pair of the batch, so the encoders' activations of the whole
batch must be alive when it back-propagates: that, not the ``B x B`` similarity matrix (which a
tiled loss never builds), is what stops a batch of 65536 with real encoders. Gradient caching
(GradCache, Gao et al. 2021, "Scaling Deep Contrastive Learning Batch Size under Memory Limited
Setup") splits the step in three:

1. **Encode without a graph**, chunk by chunk: only the ``(B, D)`` embeddings are kept.
2. **Loss on the embeddings**, as leaves that require grad: ``loss.backward()`` leaves
   ``dL/d(embeddings)`` on them (and gives the loss's own parameters their gradient). With a
   tiled loss (``chunk_size``) this step needs ``O(chunk_size x B)`` memory too.
3. **Re-encode each chunk with a graph** and back-propagate its slice of the cached gradient:
   by the chain rule the parameters' gradients sum to exactly the full-batch gradient.

Exactness needs the second encoding of a chunk to be the first one again:

* **Randomness** (dropout, VSE-infinity's region dropout): the torch RNG state (CPU and the
  model's CUDA devices) is saved before each chunk's first encoding and restored before its
  second; afterwards the RNG continues from where it stood when :meth:`GradCache.backward` was
  called, so the stream is the one a run without the replay would see. The full-batch step
  this equals is the one whose dropout masks are drawn chunk by chunk (a mask for ``B`` rows
  at once is another draw).
* **Buffers** (BatchNorm running statistics): restored to their state before the first pass,
  so the second pass updates them once. A BatchNorm normalises each chunk with the chunk's own
  statistics, which is not the full batch's: with gradient caching a model with BatchNorm in
  training mode takes a different (not wrong) step. Transformers and GRUs have no such layer.
* **Mixed precision**: the embeddings keep the dtype the model gave them; back-propagating a
  scaled loss (``GradScaler``) caches scaled gradients, which the second pass carries into the
  parameters, so ``scaler.unscale_`` / ``scaler.step`` work unchanged.
* **DistributedDataParallel**: every chunk but the last back-propagates under ``no_sync()``;
  the last one all-reduces the accumulated gradients once.

Stateful losses (AdaCL's margins, memory queues) see the whole batch once, in step 2.

**Memory.** Beyond one chunk's activations the step holds the ``(B, D)`` outputs and, from
step 2 on, their gradients (the cache), nothing else of the batch's size: each chunk's outputs
are copied into one tensor allocated after the first chunk (a per-chunk output kept until a
final concatenation would survive among that chunk's freed temporaries, and the whole output
would exist twice), the RNG states sit in one block, a gradient that arrives as this rank's
slice of a gathered ``(world x B, D)`` gradient is copied out of it, and the loss's own
temporaries are gone once ``loss.backward()`` returns (the tiled losses keep nothing on their
autograd context, even while the loss tensor is alive). What a plain step of one chunk does
not hold is the parameters' gradients during the forward of every chunk after the first: they
are summed over the chunks, where a plain step allocates them in its backward as its
activations are freed. With a model whose gradients are large next to one chunk's activations
(a BERT-base tower on short captions) that sum is most of the difference.

On the CPU the C allocator adds its own share: glibc keeps freed blocks of up to 32 MB in its
heap (its dynamic mmap threshold), and a chunk's differently laid out blocks do not fit the
holes the loss or the previous chunk left, so the resident memory creeps up chunk after chunk
although nothing stays alive. ``trim_heap`` (default on) hands the heap's free pages back
before each re-encoded chunk (``malloc_trim(0)``, a no-op without glibc; it frees nothing that
is in use and costs a walk of the heap per chunk). Process-wide settings go further:
``MALLOC_MMAP_THRESHOLD_=131072`` (or jemalloc / tcmalloc through ``LD_PRELOAD``) keeps
large blocks out of the heap altogether, at some speed. ``benchmarks/bench_grad_cache.py``
measures all of this (``--worker-env`` for the allocator's settings).

Use in your own loop::

    cache = GradCache(model, chunk_size=128)
    img, txt = cache.forward(batch)          # (B, D) leaves, no graph
    loss = loss_fn(img, txt, ids, ids)       # e.g. InfoNCELoss(chunk_size=1024)
    loss.backward()                          # caches dL/d(img), dL/d(txt)
    cache.backward()                         # re-encodes each chunk, gradients into the model
    optimizer.step()

In a config: ``[train] grad_cache_chunk = 128``. A model that scores image-caption pairs jointly
(cross-attention: SCAN, BFAN, SGRAF) has no per-item embeddings to cache and is refused.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import nn

#: ``split(batch, size)`` -> the batch's chunks of at most ``size`` items, in order.
Splitter = Callable[[Any, int], Sequence[Any]]


def split_batch(batch: Any, size: int) -> list[Any]:
    """Chunks of at most ``size`` items of a batch, in order.

    A tensor is split along dim 0; a tuple, list or dict is split entry by entry (every entry a
    tensor or a list of the batch's length); any other object must have a ``chunks(size)``
    method (``vlret``'s :class:`~vlret.data.dataset.RetrievalBatch` has one).

    Raises:
        TypeError: The batch is none of these.
        ValueError: Its entries disagree on the batch size.
    """
    if isinstance(batch, torch.Tensor):
        return list(batch.split(size))
    if isinstance(batch, dict):
        keys = list(batch)
        columns = [split_batch(batch[k], size) for k in keys]
        _check_lengths(columns, keys)
        return [dict(zip(keys, row, strict=True)) for row in zip(*columns, strict=True)]
    if (
        isinstance(batch, (tuple, list))
        and batch
        and all(isinstance(v, (torch.Tensor, tuple, list, dict)) for v in batch)
    ):
        columns = [split_batch(v, size) for v in batch]
        _check_lengths(columns, list(range(len(batch))))
        return [type(batch)(row) for row in zip(*columns, strict=True)]
    if isinstance(batch, (tuple, list)):
        return [batch[i : i + size] for i in range(0, len(batch), size)]
    chunks = getattr(batch, "chunks", None)
    if chunks is None:
        raise TypeError(
            f"cannot split a batch of type {type(batch).__name__}: pass a tensor, a tuple, list "
            "or dict of them, an object with a chunks(size) method, or GradCache(split=...)"
        )
    return list(chunks(size))


def _check_lengths(columns: list[list[Any]], keys: list[Any]) -> None:
    counts = {len(c) for c in columns}
    if len(counts) > 1:
        found = ", ".join(f"{k!r}: {len(c)} chunks" for k, c in zip(keys, columns, strict=True))
        raise ValueError(f"the batch's entries have different lengths ({found})")


def _outputs(out: Any) -> tuple[torch.Tensor, ...]:
    if isinstance(out, torch.Tensor):
        return (out,)
    if isinstance(out, (tuple, list)) and out and all(isinstance(t, torch.Tensor) for t in out):
        return tuple(out)
    raise TypeError(
        "the model must return a tensor or a tuple of tensors (one row per item), "
        f"got {type(out).__name__}"
    )


class _RNGState:
    """The torch RNG state of the CPU and of some CUDA devices.

    ``into``: a preallocated ``uint8`` row the CPU state is copied into, so that the states of
    all chunks sit in one block instead of one small allocation per chunk among the chunks'
    temporaries (each such survivor pins its heap pages: the creep of ``forward``).
    """

    def __init__(self, devices: list[torch.device], into: torch.Tensor | None = None) -> None:
        self.devices = devices
        state = torch.get_rng_state()
        self.cpu = state if into is None else into.copy_(state)
        self.cuda = [torch.cuda.get_rng_state(d) for d in devices]

    def restore(self) -> None:
        # a copy: torch 2.13's set_rng_state reads a row of a larger tensor from the start of
        # its storage (a segmentation fault at any offset but 0)
        torch.set_rng_state(self.cpu.clone())
        for device, state in zip(self.devices, self.cuda, strict=True):
            torch.cuda.set_rng_state(state, device)


class _Rows:
    """One output of the model, the chunks' rows written into one preallocated tensor.

    Keeping each chunk's output until a final ``torch.cat`` leaves one small survivor per
    chunk among that chunk's freed temporaries (the allocator cannot return those pages: peak
    memory creeps up chunk after chunk) and needs the whole output twice at the end. Here the
    first chunk's output fixes the layout: room for ``chunks`` of its rows, allocated at once;
    each chunk is copied in and its own output freed. A chunk that does not fit (a ``split``
    whose later chunks are larger than the first) or has another dtype or device falls back to
    concatenation, which is what the values were before.
    """

    def __init__(self, first: torch.Tensor, chunks: int) -> None:
        shape = (first.shape[0] * chunks, *first.shape[1:])
        self.data = first.new_empty(shape)
        self.rows = 0
        self.add(first)

    def add(self, out: torch.Tensor) -> None:
        stop = self.rows + out.shape[0]
        d = self.data
        if out.shape[1:] != d.shape[1:]:
            raise ValueError(
                f"the model's outputs have different shapes per chunk: {tuple(d.shape[1:])} "
                f"and {tuple(out.shape[1:])} after the batch dimension"
            )
        if stop > d.shape[0] or out.dtype != d.dtype or out.device != d.device:
            self.data = torch.cat([d[: self.rows], out])
        else:
            d[self.rows : stop].copy_(out)
        self.rows = stop

    def leaf(self) -> torch.Tensor:
        """The rows written, as a leaf that requires grad (a view when fewer rows than room
        were written: at most one chunk's rows are spare)."""
        return self.data[: self.rows].detach().requires_grad_()


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        return ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError, TypeError):  # not glibc (TypeError: Windows)
        return None


def _trim_heap() -> None:
    """Hand the C heap's free pages back to the system (glibc ``malloc_trim(0)``)."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def _compact(grads: list[torch.Tensor | None]) -> list[torch.Tensor | None]:
    """The cached gradients, each copied out of a larger tensor it is a view of.

    Under ``torchrun`` the gradient of a gathered batch comes back as this rank's slice of the
    ``(world x B, D)`` gradient (the backward of ``torch.cat`` and of the summing gather): kept
    as it is, the whole gathered gradient would stay alive through the re-encoding. Gradients
    that share one storage and fill it (one loss concatenating both outputs) are kept as views.
    """
    used: dict[int, int] = {}
    for g in grads:
        if g is not None:
            ptr = g.untyped_storage().data_ptr()
            used[ptr] = used.get(ptr, 0) + g.numel() * g.element_size()
    out: list[torch.Tensor | None] = []
    for g in grads:
        if g is not None:
            storage = g.untyped_storage()
            if storage.nbytes() > used[storage.data_ptr()]:
                g = g.clone(memory_format=torch.contiguous_format)
        out.append(g)
    return out


class GradCache:
    """Encode a batch in chunks without a graph, then back-propagate a loss's cached embedding
    gradients chunk by chunk (module docstring).

    Args:
        model: Maps a chunk of the batch to a tensor or a tuple of tensors with one row per
            item (e.g. ``(img_emb, txt_emb)``); may be wrapped in ``DistributedDataParallel``.
        chunk_size: Items per chunk, a positive int.
        split: ``split(batch, size)`` -> chunks (default :func:`split_batch`).
        autocast: A factory of the context each encoding runs in (e.g.
            ``lambda: torch.autocast("cuda")``); default none.
        trim_heap: Before each re-encoded chunk of a model on the CPU, hand the C heap's
            free pages back to the system (glibc's ``malloc_trim``; nothing where there is
            none): see "Memory" in the module docstring. ``False`` leaves the allocator alone.

    Raises:
        ValueError: ``chunk_size`` is not a positive int.
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        chunk_size: int,
        split: Splitter = split_batch,
        autocast: Callable[[], contextlib.AbstractContextManager] | None = None,
        trim_heap: bool = True,
    ) -> None:
        if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
            raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}")
        self.model = model
        self.chunk_size = chunk_size
        self.split = split
        self.autocast = autocast or contextlib.nullcontext
        self.trim_heap = trim_heap
        self._pending: deque[tuple[Any, _RNGState]] | None = None
        self._leaves: tuple[torch.Tensor, ...] = ()
        self._buffers: dict[str, torch.Tensor] = {}

    def _devices(self) -> list[torch.device]:
        found = {p.device for p in self.model.parameters() if p.device.type == "cuda"}
        return sorted(found, key=str)

    def forward(self, batch: Any) -> tuple[torch.Tensor, ...] | torch.Tensor:
        """Step 1: the batch's outputs, encoded chunk by chunk without a graph.

        Returns:
            What the model returns, concatenated over the chunks, as leaves that require grad
            (detached from the model; back-propagate a loss into them, then call
            :meth:`backward`).
        """
        devices = self._devices()
        self._buffers = {k: b.detach().clone() for k, b in self.model.named_buffers()}
        chunks = list(self.split(batch, self.chunk_size))
        if not len(chunks):
            raise ValueError("the batch is empty")
        # What outlives a chunk is allocated before the chunks' temporaries (see _Rows): the
        # RNG states here, the outputs after the first chunk.
        states = torch.empty(len(chunks), torch.get_rng_state().numel(), dtype=torch.uint8)
        pending: deque[tuple[Any, _RNGState]] = deque()
        rows: list[_Rows] = []
        single = False
        with torch.no_grad():
            for k, chunk in enumerate(chunks):
                state = _RNGState(devices, states[k])
                with self.autocast():
                    out = self.model(chunk)
                single = isinstance(out, torch.Tensor)
                outs = _outputs(out)
                if not rows:
                    rows = [_Rows(o, len(chunks)) for o in outs]
                elif len(outs) != len(rows):
                    raise ValueError("the model returned a different number of outputs per chunk")
                else:
                    for k_out in range(len(rows)):  # no loop variable holding an output
                        rows[k_out].add(outs[k_out])
                del out, outs  # copied: freed before the next chunk's temporaries
                pending.append((chunk, state))
        self._pending = pending
        self._leaves = tuple(r.leaf() for r in rows)
        return self._leaves[0] if single else self._leaves

    def backward(self) -> None:
        """Step 3: re-encode each chunk with a graph and back-propagate the cached gradients.

        Raises:
            RuntimeError: No :meth:`forward` is pending, or no output has a gradient yet (call
                ``loss.backward()`` first).
        """
        if self._pending is None:
            raise RuntimeError("GradCache.backward() needs a GradCache.forward() first")
        grads = _compact([leaf.grad for leaf in self._leaves])
        if all(g is None for g in grads):
            raise RuntimeError(
                "no output of GradCache.forward() has a gradient: call loss.backward() on a "
                "loss of those outputs before GradCache.backward()"
            )
        for leaf, g in zip(self._leaves, grads, strict=True):
            if g is not None and g is not leaf.grad:
                leaf.grad = g  # the compact copy: the gathered gradient is no longer held
        # From here only the gradients are needed (the cache); the embeddings are not held
        # (a caller may still hold them: the trainer logs their statistics after the step).
        pending, self._pending, self._leaves = self._pending, None, ()
        # Where the stream stands now (after the first pass and whatever drew since, e.g. a
        # momentum encoder): it continues from here once the chunks are replayed.
        after = _RNGState(self._devices())
        with torch.no_grad():
            for name, buf in self.model.named_buffers():
                buf.copy_(self._buffers[name])
        trim = self.trim_heap and any(p.device.type == "cpu" for p in self.model.parameters())
        start = 0
        while pending:
            chunk, state = pending.popleft()  # each chunk let go once replayed
            last = not pending
            if trim:  # what the loss or the previous chunk freed, given back (module doc)
                _trim_heap()
            state.restore()
            with self._sync(last):  # DDP: the forward too must run inside no_sync()
                with self.autocast():
                    outs = _outputs(self.model(chunk))
                stop = start + outs[0].shape[0]
                # An output without a graph (its encoder frozen: train.freeze) sends nothing.
                pairs = [
                    (o, g[start:stop])
                    for o, g in zip(outs, grads, strict=True)
                    if g is not None and o.requires_grad
                ]
                torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
                del outs, pairs  # this chunk's outputs: gone before the next chunk's graph
            start = stop
        after.restore()
        self._buffers = {}

    def _sync(self, last: bool) -> contextlib.AbstractContextManager:
        no_sync = getattr(self.model, "no_sync", None)
        return contextlib.nullcontext() if last or no_sync is None else no_sync()

    def chunks(self, batch: Any) -> Iterator[Any]:
        """The chunks :meth:`forward` encodes (for a no-graph pass of another model, e.g. a
        momentum encoder)."""
        yield from self.split(batch, self.chunk_size)


__all__ = ["GradCache", "split_batch"]
