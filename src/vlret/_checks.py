"""Input validation shared by the losses and metrics.

Every check raises ``ValueError`` naming the offending argument and what was expected, so a
bad batch fails loudly at the call site instead of producing a silent NaN three steps later.
"""

from __future__ import annotations

import torch

REDUCTIONS = ("sum", "mean", "none")

_HALF = (torch.float16, torch.bfloat16)


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a loss computes in: float32 for half-precision inputs, else the input dtype."""
    if dtype in _HALF:
        return torch.float32
    if not dtype.is_floating_point:
        raise ValueError(f"expected a floating-point tensor, got dtype {dtype}")
    return dtype


def check_finite(t: torch.Tensor, name: str) -> None:
    if not bool(torch.isfinite(t).all()):
        raise ValueError(f"{name} contains NaN or inf values")


def check_similarity(sim: torch.Tensor, name: str = "sim") -> None:
    """A loss similarity matrix: 2-D, square, at least 2 x 2, floating point and finite."""
    if not isinstance(sim, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(sim).__name__}")
    if sim.dim() != 2:
        raise ValueError(f"{name} must be 2-D (B, B), got shape {tuple(sim.shape)}")
    if sim.shape[0] != sim.shape[1]:
        raise ValueError(
            f"{name} must be square (B, B) with positives on the diagonal, "
            f"got shape {tuple(sim.shape)}"
        )
    if sim.shape[0] < 2:
        raise ValueError(f"{name} needs a batch size of at least 2 to have negatives, got 1")
    if not sim.dtype.is_floating_point:
        raise ValueError(f"{name} must be floating point, got dtype {sim.dtype}")
    check_finite(sim, name)


def check_pos_mask(pos_mask: torch.Tensor | None, size: int, device: torch.device) -> torch.Tensor:
    """Return the (B, B) bool mask of all positives, diagonal included."""
    eye = torch.eye(size, dtype=torch.bool, device=device)
    if pos_mask is None:
        return eye
    if not isinstance(pos_mask, torch.Tensor):
        raise ValueError(f"pos_mask must be a torch.Tensor, got {type(pos_mask).__name__}")
    if pos_mask.dtype != torch.bool:
        raise ValueError(f"pos_mask must have dtype torch.bool, got {pos_mask.dtype}")
    if tuple(pos_mask.shape) != (size, size):
        raise ValueError(
            f"pos_mask must have shape ({size}, {size}) like sim, got {tuple(pos_mask.shape)}"
        )
    return pos_mask.to(device) | eye


def check_reduction(reduction: str) -> None:
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")


def check_positive(value: float, name: str) -> None:
    if not isinstance(value, torch.Tensor) and not (value > 0 and value < float("inf")):
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")


def check_real(value: float, name: str) -> None:
    if not (value == value and abs(value) < float("inf")):
        raise ValueError(f"{name} must be a finite number, got {value!r}")


def check_embeddings(img_emb: torch.Tensor, txt_emb: torch.Tensor) -> None:
    """Paired batch embeddings: two 2-D float tensors of identical shape (B, D)."""
    for name, t in (("img_emb", img_emb), ("txt_emb", txt_emb)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 2:
            raise ValueError(f"{name} must be 2-D (B, D), got shape {tuple(t.shape)}")
        if not t.dtype.is_floating_point:
            raise ValueError(f"{name} must be floating point, got dtype {t.dtype}")
    if img_emb.shape != txt_emb.shape:
        raise ValueError(
            "img_emb and txt_emb must have the same shape (B, D) for paired batches, got "
            f"{tuple(img_emb.shape)} and {tuple(txt_emb.shape)}"
        )
