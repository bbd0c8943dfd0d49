"""The attention step and the input checks shared by the pair scorers (SCAN, BFAN and SGRAF).

:mod:`vlret.models.cross_attention` (SCAN, BFAN) and :mod:`vlret.models.sgraf` (SGRAF) both
build on this module, which imports neither, so ``cross_attention`` can re-export
:class:`~vlret.models.sgraf.SGRAFScorer` without an import cycle.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F

#: The reference code's ``l2norm`` adds this to the norm before dividing.
NORM_EPS = 1e-8
#: Default bound on the numbers held by the largest intermediate of one block.
DEFAULT_MAX_ELEMENTS = 2**24
#: CPU inference blocks hold at most this many raw scores, so that a block's buffers (a few MB)
#: stay in the CPU caches across the element-wise passes.
CPU_BLOCK_ELEMENTS = 2**19


def attention_weights(
    raw: torch.Tensor,
    *,
    query_mask: torch.Tensor | None,
    context_mask: torch.Tensor | None,
    lambda_softmax: float,
) -> torch.Tensor:
    """The "clipped l2norm" attention step shared by SCAN, BFAN and SGRAF (SCAN Eq. 1-2).

    The raw scores go through LeakyReLU (slope 0.1), each context item's scores are
    L2-normalised over the queries (the norm plus :data:`NORM_EPS`, as in the reference
    ``l2norm``), and a softmax over the context with inverse temperature ``lambda_softmax``
    gives the weights.

    Args:
        raw: ``(..., q, c)`` raw scores ``<c_j, q_k>`` of every query item ``k`` with every
            context item ``j``.
        query_mask: ``(..., q)`` bool, True at real query items (broadcastable to ``raw``
            without its last dimension); a padded query contributes nothing to the norm.
        context_mask: ``(..., c)`` bool, True at real context items; a padded one gets
            weight 0.
        lambda_softmax: Inverse temperature of the softmax.

    Returns:
        The ``(..., q, c)`` weights, each row summing to 1. A padded query's own row is
        meaningless and must be ignored by the caller.
    """
    scores = F.leaky_relu(raw, negative_slope=0.1)
    if query_mask is not None:
        scores = scores.masked_fill(~query_mask.unsqueeze(-1), 0.0)
    norm = scores.square().sum(dim=-2, keepdim=True).sqrt() + NORM_EPS
    logits = scores / norm * lambda_softmax
    if context_mask is not None:
        logits = logits.masked_fill(~context_mask.unsqueeze(-2), torch.finfo(logits.dtype).min)
    return torch.softmax(logits, dim=-1)


# ----------------------------------------------------------------------------- validation


def _finite(x: torch.Tensor) -> bool:
    # two reductions instead of an isfinite() copy of a tensor that may hold 10^8 numbers;
    # max/min propagate NaN
    if x.numel() == 0:
        return True
    return bool(torch.isfinite(x.amax()) and torch.isfinite(x.amin()))


def check_tokens(
    regions: torch.Tensor, words: torch.Tensor, word_lengths: torch.Tensor | Sequence[int]
) -> torch.Tensor:
    """Validate the token inputs of a pair scorer.

    Padding words (at or past a caption's length) are never read and may hold anything.

    Args:
        regions: ``(n_img, R, D)`` floating region features (``R``, ``D`` >= 1), finite.
        words: ``(n_cap, L, D)`` floating word features on the same device, same ``D``; each
            caption's real words finite.
        word_lengths: ``(n_cap,)`` integers in ``1..L``.

    Returns:
        ``word_lengths`` as int64 on ``words``' device.

    Raises:
        ValueError: An input breaks one of these conditions (the message names it).
    """
    if not isinstance(regions, torch.Tensor) or regions.ndim != 3:
        raise ValueError(f"regions must be a tensor (n_img, R, D), got {_describe(regions)}")
    if not isinstance(words, torch.Tensor) or words.ndim != 3:
        raise ValueError(f"words must be a tensor (n_cap, L, D), got {_describe(words)}")
    if not regions.is_floating_point():
        raise ValueError(f"regions must be floating point, got {regions.dtype}")
    if not words.is_floating_point():
        raise ValueError(f"words must be floating point, got {words.dtype}")
    if regions.shape[1] < 1 or regions.shape[2] < 1:
        raise ValueError(f"regions needs R >= 1 regions of D >= 1, got {tuple(regions.shape)}")
    if words.shape[2] != regions.shape[2]:
        raise ValueError(
            f"words has dimension D={words.shape[2]} but regions has D={regions.shape[2]}"
        )
    if words.device != regions.device:
        raise ValueError(f"words is on {words.device} but regions is on {regions.device}")
    n_cap, max_len = words.shape[0], words.shape[1]
    if not isinstance(word_lengths, torch.Tensor):
        try:
            word_lengths = torch.as_tensor(word_lengths)
        except (TypeError, ValueError, RuntimeError) as err:
            raise ValueError(f"word_lengths must be a 1-D sequence of integers: {err}") from err
    if word_lengths.ndim != 1 or word_lengths.shape[0] != n_cap:
        raise ValueError(
            f"word_lengths must have shape ({n_cap},) (one per caption of words), "
            f"got {tuple(word_lengths.shape)}"
        )
    if word_lengths.dtype not in (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64):
        raise ValueError(f"word_lengths must hold integers, got {word_lengths.dtype}")
    lengths = word_lengths.to(device=words.device, dtype=torch.long)
    if n_cap and (int(lengths.min()) < 1 or int(lengths.max()) > max_len):
        raise ValueError(
            f"word_lengths must lie in 1..{max_len} (L of words), "
            f"got min {int(lengths.min())}, max {int(lengths.max())}"
        )
    if not _finite(regions):
        raise ValueError("regions holds NaN or infinite values")
    if n_cap and not _finite_real_words(words, lengths):
        raise ValueError("words holds NaN or infinite values within the captions' lengths")
    return lengths


def _finite_real_words(words: torch.Tensor, lengths: torch.Tensor) -> bool:
    # per-word max and min (no element-wise copy), then only the real words count
    real = _length_mask(lengths, words.shape[1])
    hi, lo = words.amax(dim=-1), words.amin(dim=-1)
    return bool((torch.isfinite(hi) & torch.isfinite(lo) | ~real).all())


def _describe(x: object) -> str:
    if isinstance(x, torch.Tensor):
        return f"shape {tuple(x.shape)}"
    return type(x).__name__


def _length_mask(lengths: torch.Tensor, max_len: int) -> torch.Tensor:
    return torch.arange(max_len, device=lengths.device) < lengths.unsqueeze(-1)


def positive_int(value: object, name: str) -> int:
    """Check a positive int setting.

    Args:
        value: The value to check.
        name: The setting's name, for the message (``"name: must be ..."``).

    Returns:
        ``value``.

    Raises:
        ValueError: ``value`` is not an int >= 1 (a bool is not an int here).
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}: must be a positive int, got {value!r}")
    return value


def positive_float(value: object, name: str) -> float:
    """Check a positive finite number setting.

    Args:
        value: The value to check.
        name: The setting's name, for the message (``"name: must be ..."``).

    Returns:
        ``value`` as a float.

    Raises:
        ValueError: ``value`` is not a finite number > 0.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{name}: must be a number > 0, got {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{name}: must be finite, got {value!r}")
    return float(value)


def choice(value: object, name: str, choices: tuple[str, ...]) -> str:
    """Check a setting with a fixed set of values.

    Args:
        value: The value to check.
        name: The setting's name, for the message (``"name: must be ..."``).
        choices: The valid values.

    Returns:
        ``value``.

    Raises:
        ValueError: ``value`` is not one of ``choices``.
    """
    if value not in choices:
        raise ValueError(f"{name}: must be one of {list(choices)}, got {value!r}")
    return value


__all__ = [
    "CPU_BLOCK_ELEMENTS",
    "DEFAULT_MAX_ELEMENTS",
    "NORM_EPS",
    "attention_weights",
    "check_tokens",
]
