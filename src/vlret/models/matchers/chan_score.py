"""CHAN's pair score, block by block: hard alignment of each word to its best region, then a
log-sum-exp over the caption's real words (Pan et al., CVPR 2023; ppanzx/CHAN ``VHACoding``
followed by ``LSEPooling``).

For image ``i`` with regions ``v_r`` and caption ``c`` with real words ``t_w`` (``w < m_c``),
all L2-normalised,

* ``a[i, c, w] = max_r <v_r, t_w>``: every word is aligned to its single best region;
* ``S(i, c) = log sum_{w < m_c} exp(a[i, c, w] / beta)`` (``lse_scale="release"``), the
  release's score: not multiplied back by ``beta``, so it lies on a ``1 / beta`` scale (about
  ten times a cosine at ``beta = 0.1``, plus ``log m_c``), which is what its margin (0.05)
  acts on;
* or ``S(i, c) = beta log((1 / m_c) sum_{w < m_c} exp(a[i, c, w] / beta))``
  (``lse_scale="cosine"``, vlret's option): a smooth maximum that lies between the mean and
  the maximum of the caption's alignments, so within ``[-1, 1]`` like a cosine, for the losses
  that assume that scale (AdaCL's margins pin a similarity of 1). Per caption it is an
  increasing affine map of the release's score, so text-to-image rankings are the same.

**Padding.** The release sets every fine-grained score of a padded region or word to the
sentinel ``-1`` before the max, and afterwards treats every aligned score equal to ``-1`` as
padding (``-inf`` before the log-sum-exp), so a real word whose best cosine is exactly ``-1``
would be dropped too. Here the padded words are masked by the caption lengths themselves (a
boolean mask, ``-inf`` before the log-sum-exp), never by value: the two agree except on that
measure-zero case. Padded regions do not exist at this level: every image has ``R`` rows, and
an encoder that drops or pads regions fills those rows with copies of a kept region, which
leaves every maximum unchanged (see :class:`~vlret.models.matchers.chan.CHANRegionEncoder`).

**Blocks.** The raw scores of a block of ``ib`` images and ``cb`` captions are one GEMM,
``(ib R, D) @ (D, cb W)``, followed by a max over the ``R`` rows of each image: the only
intermediate of that size. Captions are sorted by length and each block is trimmed to its
longest caption (:func:`plan_blocks`), so padding costs almost nothing; the release pads every
caption to the longest of the whole evaluation set before its GEMM. Without autograd the GEMM
and the max write into buffers reused across blocks (a fresh buffer per block would pay for
its first writes in page faults). Blocks are as large as ``max_elements`` allows, on a CPU
too: the GEMM does ``2 D`` flops per raw score and the max reads each once, so the GEMM's
efficiency on large operands matters and keeping the raw scores in cache does not.

**Precision.** ``matmul_precision="bfloat16"`` (evaluation only: without autograd, float32
inputs) runs the GEMM on bfloat16 operands with bfloat16 results (float32 accumulation) and
takes the max in bfloat16; the log-sum-exp runs in float32. Each aligned cosine is then off
by at most about ``2^-8`` (operands) plus ``2^-9`` (result), so a release-scale score by at
most about ``0.006 / beta`` and a cosine-scale one by about ``0.006``: not the exact scores,
but on a CPU with bfloat16 dot products the GEMM runs about twice as fast. Training and
autograd always compute in the inputs' precision.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from ..attention import DEFAULT_MAX_ELEMENTS, check_tokens, choice
from ..attention import positive_float as _positive_float
from ..sgraf_ops import PRECISIONS

#: The values of ``lse_scale``: the release's score or vlret's cosine-scaled one.
LSE_SCALES = ("release", "cosine")
#: Captions per block (before the element budget shrinks it): wide enough for an efficient GEMM.
CAPTION_BLOCK = 128


def _budget(max_elements: int | None) -> int:
    if max_elements is None:
        return DEFAULT_MAX_ELEMENTS
    if isinstance(max_elements, bool) or not isinstance(max_elements, int) or max_elements < 1:
        raise ValueError(f"max_elements must be a positive integer or None, got {max_elements!r}")
    return max_elements


def plan_blocks(
    n_img: int, n_regions: int, lengths: Sequence[int], budget: int
) -> list[tuple[int, int, int, int]]:
    """The blocks :func:`chan_scores` scores, over captions sorted longest first.

    Args:
        n_img: Images scored.
        n_regions: Regions per image (``R``).
        lengths: The captions' real words, sorted in decreasing order.
        budget: The most raw scores one block may hold (``ib R cb top``); a block holds one
            image and one caption at least.

    Returns:
        ``(c0, c1, top, img_block)`` per caption block: the sorted captions ``c0:c1``, trimmed to
        ``top`` words (the longest of them), scored against ``img_block`` images at a time.
    """
    blocks = []
    c0, n_cap = 0, len(lengths)
    while c0 < n_cap:
        top = int(lengths[c0])
        cb = min(CAPTION_BLOCK, n_cap - c0, max(1, budget // (n_regions * top)))
        img_block = min(n_img, max(1, budget // (n_regions * top * cb)))
        blocks.append((c0, c0 + cb, top, img_block))
        c0 += cb
    return blocks


def chan_scores(
    regions: torch.Tensor,
    words: torch.Tensor,
    word_lengths: torch.Tensor | Sequence[int],
    *,
    beta: float = 0.1,
    lse_scale: str = "release",
    max_elements: int | None = None,
    matmul_precision: str = "float32",
) -> torch.Tensor:
    """CHAN's score of every (image, caption) pair (see the module docstring).

    Args:
        regions: ``(n_img, R, D)`` region features, L2-normalised.
        words: ``(n_cap, L, D)`` word features, L2-normalised; padding (at or past a caption's
            length) is never read and may hold anything.
        word_lengths: ``(n_cap,)`` real words per caption, in ``1..L``.
        beta: The log-sum-exp temperature (the release's ``belta``, 0.1).
        lse_scale: ``"release"`` or ``"cosine"``.
        max_elements: Bound on the raw scores one block holds (default
            :data:`~vlret.models.attention.DEFAULT_MAX_ELEMENTS`).
        matmul_precision: ``"float32"`` or ``"bfloat16"`` (the GEMM and the max of a call
            without autograd on float32 inputs; see the module docstring).

    Returns:
        The ``(n_img, n_cap)`` scores in the promoted dtype of the inputs, float32 at least;
        differentiable (the gradient of each max goes to its best region, as the release's).

    Raises:
        ValueError: A non-positive ``beta`` or ``max_elements``, an unknown ``lse_scale`` or
            ``matmul_precision``, or malformed tokens
            (:func:`~vlret.models.attention.check_tokens`).
    """
    beta = _positive_float(beta, "beta")
    choice(lse_scale, "lse_scale", LSE_SCALES)
    choice(matmul_precision, "matmul_precision", PRECISIONS)
    budget = _budget(max_elements)
    lengths = check_tokens(regions, words, word_lengths)
    dtype = torch.promote_types(regions.dtype, words.dtype)
    if dtype in (torch.float16, torch.bfloat16):
        dtype = torch.float32
    regions, words = regions.to(dtype), words.to(dtype)
    n_img, n_regions, dim = regions.shape
    n_cap = words.shape[0]
    if n_img == 0 or n_cap == 0:
        return regions.new_zeros((n_img, n_cap))
    grad = torch.is_grad_enabled() and (regions.requires_grad or words.requires_grad)
    low = matmul_precision == "bfloat16" and not grad and dtype == torch.float32
    mm_dtype = torch.bfloat16 if low else dtype
    sorted_lengths, order = torch.sort(lengths, descending=True, stable=True)
    flat_regions = regions.reshape(n_img * n_regions, dim).to(mm_dtype)
    blocks = plan_blocks(n_img, n_regions, sorted_lengths.tolist(), budget)
    raw_buf = best_buf = None
    if not grad:  # the largest block's intermediates, reused by every block
        size = max(min(n_img, ib) * n_regions * (c1 - c0) * top for c0, c1, top, ib in blocks)
        raw_buf = regions.new_empty(size, dtype=mm_dtype)
        best_buf = regions.new_empty(size // n_regions, dtype=mm_dtype)
    columns = []
    for c0, c1, top, img_block in blocks:
        cb, block_lengths = c1 - c0, sorted_lengths[c0:c1]
        pad = torch.arange(top, device=words.device) >= block_lengths[:, None]  # (cb, top)
        cap = words[order[c0:c1], :top]  # the block's captions: a copy, trimmed
        cap = cap.masked_fill_(pad[..., None], 0.0)  # padding may hold anything, NaN too
        cap_t = cap.reshape(cb * top, dim).t().to(mm_dtype)
        rows = []
        for i0 in range(0, n_img, img_block):
            ib = min(n_img, i0 + img_block) - i0
            block_regions = flat_regions[i0 * n_regions : (i0 + ib) * n_regions]
            if raw_buf is None or best_buf is None:
                raw = torch.mm(block_regions, cap_t)
                best = raw.view(ib, n_regions, cb * top).max(dim=1).values
            else:
                raw = raw_buf[: ib * n_regions * cb * top].view(ib * n_regions, cb * top)
                torch.mm(block_regions, cap_t, out=raw)
                best = best_buf[: ib * cb * top].view(ib, cb * top)
                torch.amax(raw.view(ib, n_regions, cb * top), dim=1, out=best)
                best = best.to(dtype)  # a copy for bfloat16 (the pooling writes in place)
            rows.append(_pool(best.view(ib, cb, top), pad, block_lengths, beta, lse_scale, grad))
        columns.append(torch.cat(rows, dim=0) if len(rows) > 1 else rows[0])
    scores = torch.cat(columns, dim=1) if len(columns) > 1 else columns[0]
    return scores[:, torch.argsort(order)]


def _pool(
    best: torch.Tensor,
    pad: torch.Tensor,
    lengths: torch.Tensor,
    beta: float,
    lse_scale: str,
    grad: bool,
) -> torch.Tensor:
    """The log-sum-exp over each caption's real words of ``best (ib, cb, top)`` -> ``(ib,
    cb)``; in place on ``best`` without autograd."""
    if grad:
        logits = (best / beta).masked_fill(pad, -math.inf)
    else:
        logits = best.div_(beta).masked_fill_(pad, -math.inf)
    pooled = torch.logsumexp(logits, dim=-1)
    if lse_scale == "cosine":
        pooled = (pooled - torch.log(lengths.to(pooled.dtype))) * beta
    return pooled


__all__ = ["CAPTION_BLOCK", "LSE_SCALES", "chan_scores", "plan_blocks"]
