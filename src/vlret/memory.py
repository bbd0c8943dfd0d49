"""Momentum memory bank: a ring-buffer queue of keys with ids, and an EMA copy of a model.

The AdaCL paper (Sec. 4.1, A.9) follows MoCo (He et al., 2020): negatives from previous batches
are kept in a queue of size ``M = 4096`` filled with keys from a momentum encoder whose weights
are an exponential moving average of the online encoder (momentum ``z = 0.99``).

* :class:`MemoryQueue` keeps everything in module buffers (keys, ids, a validity flag and the
  write pointer), so ``state_dict`` / ``load_state_dict`` restore it exactly and ``.to(device)``
  moves it. Each entry stores the id of the image it belongs to, so an entry is never used as a
  negative of its own pair, nor of another caption of the same image
  (:meth:`MemoryQueue.negative_mask`).
* :class:`MomentumEncoder` holds the EMA copy and runs it without gradient.

Under ``torch.distributed`` the keys (and ids) of all ranks are gathered, in rank order, before
they are enqueued, so every rank holds the same queue; ``enqueue(..., gather=False)`` skips
that step for keys that are already the global batch on every rank.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import nn

from ._checks import check_finite
from ._modules import unwrap_model

#: Id stored for entries enqueued without an id; it never matches a query id.
NO_ID = -1


def _distributed_world() -> int:
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    return 1


def _gather_rows(tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """All-gather tensors sharing their first dimension, which may differ between ranks.

    Sizes are exchanged first, rows are padded to the largest size, gathered, and trimmed, so
    ranks with unequal local batches still produce the same concatenation in rank order.
    """
    world = _distributed_world()
    if world == 1:
        return list(tensors)
    rows = tensors[0].shape[0]
    device = tensors[0].device
    size = torch.tensor([rows], dtype=torch.long, device=device)
    sizes = [torch.zeros_like(size) for _ in range(world)]
    dist.all_gather(sizes, size)
    counts = [int(s) for s in sizes]
    longest = max(counts)
    gathered = []
    for t in tensors:
        padded = t.new_zeros((longest, *t.shape[1:]))
        padded[:rows] = t
        parts = [torch.empty_like(padded) for _ in range(world)]
        dist.all_gather(parts, padded)
        gathered.append(torch.cat([p[:n] for p, n in zip(parts, counts, strict=True)]))
    return gathered


def as_id_tensor(ids: torch.Tensor | Sequence[int], name: str, rows: int) -> torch.Tensor:
    """Integer ids as a 1-D ``long`` tensor, checked for a memory queue.

    Args:
        ids: A 1-D integer tensor or a sequence of ints.
        name: The argument's name, for error messages.
        rows: The expected length.

    Returns:
        The ids as a ``(rows,)`` ``long`` tensor.

    Raises:
        ValueError: ``ids`` is not integer, not of shape ``(rows,)``, or holds a negative id.
    """
    if isinstance(ids, torch.Tensor):
        t = ids
    elif isinstance(ids, Sequence) and not isinstance(ids, str):
        if not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
            raise ValueError(
                f"{name} must hold non-negative integer ids to be stored in a memory queue "
                "(map string ids to integers first)"
            )
        t = torch.tensor(list(ids), dtype=torch.long)
    else:
        raise ValueError(f"{name} must be a 1-D integer tensor or a sequence of ints")
    if t.dim() != 1 or t.shape[0] != rows:
        raise ValueError(f"{name} must have shape ({rows},), got {tuple(t.shape)}")
    if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
        raise ValueError(f"{name} must hold integer ids, got dtype {t.dtype}")
    t = t.long()
    if rows and bool((t < 0).any()):
        raise ValueError(f"{name} must be non-negative (-1 marks an entry without id)")
    return t


class MemoryQueue(nn.Module):
    """First-in first-out queue of ``size`` keys of dimension ``dim`` (MoCo's memory bank).

    Buffers (all in ``state_dict``): ``keys`` ``(size, dim)``, ``ids`` ``(size,)`` (``-1`` where
    unknown), ``valid`` ``(size,)`` (False until a slot is first written) and ``ptr`` (the next
    slot to write). The oldest entries are overwritten first; a batch longer than the queue keeps
    only its last ``size`` rows.

    Args:
        size: Number of slots (AdaCL's ``M``).
        dim: Dimension of the keys.
        dtype: Floating-point dtype of the stored keys.

    Raises:
        ValueError: ``size`` or ``dim`` is not a positive integer, or ``dtype`` is not floating
            point.
    """

    # Registered buffers (typed here: nn.Module's __getattr__ knows no buffer's type).
    keys: torch.Tensor
    ids: torch.Tensor
    valid: torch.Tensor
    ptr: torch.Tensor

    def __init__(self, size: int, dim: int, *, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"size must be a positive integer, got {size!r}")
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
            raise ValueError(f"dim must be a positive integer, got {dim!r}")
        if not dtype.is_floating_point:
            raise ValueError(f"dtype must be a floating-point dtype, got {dtype}")
        self.size = size
        self.dim = dim
        self.register_buffer("keys", torch.zeros(size, dim, dtype=dtype))
        self.register_buffer("ids", torch.full((size,), NO_ID, dtype=torch.long))
        self.register_buffer("valid", torch.zeros(size, dtype=torch.bool))
        self.register_buffer("ptr", torch.zeros((), dtype=torch.long))

    def check_dim(self, t: torch.Tensor, name: str, *, setting: str = "dim") -> None:
        """Check that ``t`` can be scored against (or stored in) the queue.

        Args:
            t: Embeddings ``(n, D)``.
            name: The argument's name, for the error message.
            setting: The setting ``dim`` came from, named in the error message.

        Raises:
            ValueError: ``t`` is not 2-D or ``D != dim``.
        """
        if t.dim() != 2 or t.shape[1] != self.dim:
            raise ValueError(
                f"{name} has dimension {t.shape[-1]} (shape {tuple(t.shape)}) but the memory "
                f"queue holds keys of {setting}={self.dim}; set {setting} to the embeddings' "
                "dimension"
            )

    def __len__(self) -> int:
        """Number of filled slots."""
        return int(self.valid.sum())

    @property
    def is_full(self) -> bool:
        """Whether every slot has been written at least once."""
        return bool(self.valid.all())

    @torch.no_grad()
    def enqueue(
        self,
        keys: torch.Tensor,
        ids: torch.Tensor | Sequence[int] | None = None,
        *,
        mask: torch.Tensor | None = None,
        gather: bool = True,
    ) -> None:
        """Write ``keys`` (detached) and their ``ids`` at the pointer, wrapping around.

        Under ``torch.distributed`` the selected rows of all ranks are gathered in rank order
        first, so every rank must call this method at the same step.

        Args:
            keys: Keys ``(n, dim)``, finite.
            ids: The image id of each key (``>= 0``); None stores ``NO_ID``, which matches no
                query.
            mask: ``(n,)`` bool selecting the rows to enqueue (e.g. dropping padding or
                duplicated captions); the others take no slot.
            gather: False skips the all-gather and writes the rows as given: for keys that are
                already the global batch, identical on every rank (otherwise the ranks' queues
                diverge).

        Raises:
            ValueError: A shape, dtype or id is invalid, or ``keys`` holds NaN or inf.
        """
        if not isinstance(gather, bool):
            raise ValueError(f"gather must be a bool, got {gather!r}")
        if not isinstance(keys, torch.Tensor) or keys.dim() != 2 or keys.shape[1] != self.dim:
            shape = tuple(keys.shape) if isinstance(keys, torch.Tensor) else type(keys).__name__
            raise ValueError(f"keys must have shape (n, {self.dim}), got {shape}")
        if not keys.dtype.is_floating_point:
            raise ValueError(f"keys must be floating point, got dtype {keys.dtype}")
        check_finite(keys, "keys")
        rows = keys.shape[0]
        device = self.keys.device
        keys = keys.detach().to(device=device, dtype=self.keys.dtype)
        if ids is None:
            id_t = torch.full((rows,), NO_ID, dtype=torch.long, device=device)
        else:
            id_t = as_id_tensor(ids, "ids", rows).to(device)
        if mask is not None:
            if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
                raise ValueError("mask must be a bool tensor of shape (n,)")
            if tuple(mask.shape) != (rows,):
                raise ValueError(f"mask must have shape ({rows},), got {tuple(mask.shape)}")
            mask = mask.to(device)
            keys, id_t = keys[mask], id_t[mask]
        if gather:
            keys, id_t = _gather_rows([keys, id_t])
        n = keys.shape[0]
        if n == 0:
            return
        if n > self.size:
            # Only the newest `size` rows survive; they start where the overflow ends.
            keys, id_t = keys[-self.size :], id_t[-self.size :]
            start = self.ptr + (n - self.size)
        else:
            start = self.ptr
        slots = (start + torch.arange(keys.shape[0], device=device)) % self.size
        self.keys.index_copy_(0, slots, keys)
        self.ids.index_copy_(0, slots, id_t)
        self.valid[slots] = True
        self.ptr.copy_((self.ptr + n) % self.size)

    def negative_mask(self, query_ids: torch.Tensor | Sequence[int] | None = None) -> torch.Tensor:
        """Mask of the entries usable as negatives of each query.

        An entry is a negative when it is filled and its id differs from the query's id, so an
        entry is never a negative of its own pair nor of another caption of the same image
        (store image ids for both images and captions).

        Args:
            query_ids: The image id of each query, ``(n_query,)``; None makes every filled entry
                a negative.

        Returns:
            A bool mask ``(n_query, size)``, or ``(1, size)`` (broadcasting over queries) without
            ``query_ids``.

        Raises:
            ValueError: ``query_ids`` is not a 1-D sequence of non-negative integer ids.
        """
        if query_ids is None:
            return self.valid[None, :]
        rows = query_ids.shape[0] if isinstance(query_ids, torch.Tensor) else len(query_ids)
        q = as_id_tensor(query_ids, "query_ids", rows).to(self.ids.device)
        return self.valid[None, :] & (self.ids[None, :] != q[:, None])

    @torch.no_grad()
    def reset(self) -> None:
        """Empty the queue (keys are zeroed, ids cleared, pointer back to 0)."""
        self.keys.zero_()
        self.ids.fill_(NO_ID)
        self.valid.zero_()
        self.ptr.zero_()

    def extra_repr(self) -> str:
        return f"size={self.size}, dim={self.dim}"


class MomentumEncoder(nn.Module):
    """Exponential-moving-average copy of a model (MoCo's key encoder; AdaCL Sec. 4.1).

    ``update(model)`` applies ``theta_k <- z * theta_k + (1 - z) * theta_q`` to every parameter
    and copies every buffer (batch-norm statistics) from the online ``model``; call it once per
    optimiser step. ``forward`` runs the copy without gradient. The copy is a submodule, so it
    is saved and restored with ``state_dict``. A ``DistributedDataParallel`` wrapper is
    unwrapped.

    Args:
        model: The online model to copy.
        momentum: ``z`` in ``[0, 1]`` (AdaCL A.9: 0.99).

    Raises:
        ValueError: ``model`` is not an ``nn.Module`` or ``momentum`` is not in ``[0, 1]``.
    """

    def __init__(self, model: nn.Module, *, momentum: float = 0.99) -> None:
        super().__init__()
        if not isinstance(model, nn.Module):
            raise ValueError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        # Type first: a comparison with a string would raise TypeError, not name the argument.
        if (
            isinstance(momentum, bool)
            or not isinstance(momentum, (int, float))
            or not 0.0 <= momentum <= 1.0
        ):
            raise ValueError(f"momentum must be a number in [0, 1], got {momentum!r}")
        self.momentum = float(momentum)
        self.module = copy.deepcopy(unwrap_model(model))
        self.module.requires_grad_(False)

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        """One EMA step towards ``model``'s parameters; its buffers are copied.

        Args:
            model: The online model (or its ``DistributedDataParallel`` wrapper).

        Raises:
            ValueError: ``model``'s parameters differ in name or shape from the copy's.
        """
        online = unwrap_model(model)
        ema_params = dict(self.module.named_parameters())
        online_params = dict(online.named_parameters())
        if ema_params.keys() != online_params.keys():
            raise ValueError("model must have the same parameters as the one the copy was made of")
        for name, p_k in ema_params.items():
            p_q = online_params[name]
            if p_q.shape != p_k.shape:
                raise ValueError(
                    f"model parameter {name!r} has shape {tuple(p_q.shape)}, "
                    f"the momentum copy {tuple(p_k.shape)}"
                )
            p_k.mul_(self.momentum).add_(p_q.detach().to(p_k.dtype), alpha=1.0 - self.momentum)
        ema_buffers = dict(self.module.named_buffers())
        for name, b_q in online.named_buffers():
            if name in ema_buffers:
                ema_buffers[name].copy_(b_q)

    def forward(self, *args, **kwargs):
        """Run the copy on the arguments without gradient and return its output."""
        with torch.no_grad():
            return self.module(*args, **kwargs)

    def extra_repr(self) -> str:
        return f"momentum={self.momentum}"


__all__ = ["NO_ID", "MemoryQueue", "MomentumEncoder", "as_id_tensor"]
