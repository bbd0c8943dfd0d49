"""SCAN and BFAN pair scores, and the attention step they share with SGRAF.

:func:`scan_scores` and :func:`bfan_scores` score every (image, caption) pair of two sets
from ``regions (n_img, R, D)`` and ``words (n_cap, L, D)``, already projected and
L2-normalised, with ``word_lengths (n_cap,)``; words at or past a caption's length never
take part. The attention step and the input checks they share with SGRAF live in
:mod:`vlret.models.attention`; :class:`~vlret.models.sgraf.SGRAFScorer` is re-exported here.

The reference implementations (kuanghuei/SCAN ``xattn_score_t2i``/``xattn_score_i2t``,
CrossmodalGroup/BFAN ``xattn_score``) loop over captions, repeat each caption over all images
and form every attended vector ``a_k = sum_j w_kj c_j`` (D numbers per query item and pair).
:func:`scan_scores` and :func:`bfan_scores` compute the same scores without them: the cosine
between a query item ``q_k`` and its attended context only needs

* ``<q_k, a_k> = sum_j w_kj <c_j, q_k>``, the attention-weighted raw scores, and
* ``|a_k|^2 = w_k^T G w_k`` with the context's Gram matrix ``G`` (R x R per image for
  text-to-image, L x L per caption for image-to-text),

while ``|q_k|`` comes from the data. The raw scores of a block of images x captions are one
GEMM, ``(n_i R, D) @ (D, n_c L)``, and every other intermediate has ``n_i R n_c L`` numbers at
most. Captions are scored in blocks of similar length (sorted by length, each block trimmed to
its longest caption), so padding costs nothing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F

from .attention import (
    CPU_BLOCK_ELEMENTS,
    DEFAULT_MAX_ELEMENTS,
    NORM_EPS,
    _length_mask,
    attention_weights,
    check_tokens,
    choice,
    positive_float,
)
from .sgraf import SGRAFScorer

#: The reference ``cosine_similarity`` divides by ``(|x1| |x2|).clamp(min=COSINE_EPS)``.
COSINE_EPS = 1e-8
#: Up to this inverse temperature the unnormalised softmax ``exp(logits)`` (logits in
#: ``[-lambda, lambda]``) and its Gram quadratic form stay far inside float32's range.
_UNSHIFTED_LAMBDA = 20.0
SCAN_DIRECTIONS = ("t2i", "i2t")
SCAN_AGGREGATIONS = ("lse", "mean", "max", "sum")
BFAN_FOCALS = ("equal", "prob")


def _check_max_elements(max_elements: int | None) -> int:
    if max_elements is None:
        return DEFAULT_MAX_ELEMENTS
    if isinstance(max_elements, bool) or not isinstance(max_elements, int) or max_elements < 1:
        raise ValueError(f"max_elements must be a positive integer or None, got {max_elements!r}")
    return max_elements


# ----------------------------------------------------------------------------- scorers


def scan_scores(
    regions: torch.Tensor,
    words: torch.Tensor,
    word_lengths: torch.Tensor | Sequence[int],
    *,
    direction: str = "t2i",
    lambda_softmax: float = 9.0,
    aggregation: str = "lse",
    lambda_lse: float = 6.0,
    max_elements: int | None = None,
) -> torch.Tensor:
    """SCAN's score of every (image, caption) pair (Lee et al., ECCV 2018, Sec. 3.1-3.2).

    ``direction="t2i"``: every real word ``e_k`` attends over the image's regions (the
    :func:`attention_weights` step with ``lambda_softmax``; the L2 norm of each region's
    scores runs over the caption's real words), its relevance is the cosine
    ``r_k = cos(e_k, a_k)`` with its attended image vector ``a_k``, and the pair score pools
    the relevances of the caption's real words. ``direction="i2t"``: every region attends
    over the caption's real words (the norm of each word's scores runs over all regions) and
    the relevances of the regions are pooled. Pooling (``aggregation``): ``"lse"``
    ``(1/lambda_lse) log sum_k exp(lambda_lse r_k)``, ``"mean"``, ``"max"`` or
    ``"sum"``, as the reference code's ``LogSumExp``, ``Mean``, ``Max`` and ``Sum``.

    Numerics follow kuanghuei/SCAN so that its released checkpoints reproduce its scores: the
    attention's L2 norm adds :data:`NORM_EPS` to the norm, and the cosine divides by
    ``(|q_k| |a_k|).clamp(min=COSINE_EPS)``. The attended vectors are never formed (see the
    module docstring); the result is the reference's up to rounding.

    Args:
        regions: ``(n_img, R, D)`` region features, projected and L2-normalised.
        words: ``(n_cap, L, D)`` word features, projected and L2-normalised.
        word_lengths: ``(n_cap,)`` real words per caption, in ``1..L``.
        direction: ``"t2i"`` or ``"i2t"``.
        lambda_softmax: Inverse temperature of the attention softmax.
        aggregation: ``"lse"``, ``"mean"``, ``"max"`` or ``"sum"``.
        lambda_lse: The ``"lse"`` pooling's sharpness.
        max_elements: Bound on the numbers held by the largest intermediate (default
            :data:`DEFAULT_MAX_ELEMENTS`); a block holds one image and one caption at least.

    Returns:
        The ``(n_img, n_cap)`` scores in the promoted dtype of the inputs, float32 at least
        (half inputs give float32, float64 stays float64); differentiable.

    Raises:
        ValueError: An unknown option, a non-positive ``lambda_*`` or ``max_elements``, or
            malformed tokens (:func:`~vlret.models.attention.check_tokens`).
    """
    choice(direction, "direction", SCAN_DIRECTIONS)
    choice(aggregation, "aggregation", SCAN_AGGREGATIONS)
    lambda_softmax = positive_float(lambda_softmax, "lambda_softmax")
    lambda_lse = positive_float(lambda_lse, "lambda_lse")
    budget = _check_max_elements(max_elements)
    lengths = check_tokens(regions, words, word_lengths)

    def score_block(block: _Block) -> torch.Tensor:
        raw, cap = block.raw(direction), block.cap
        if direction == "t2i":
            cos = _attended_cosines(
                raw, block.region_gram, cap.norm, lambda_softmax,
                work=block.work, pair=block.pairs.get("t2i"),
            )  # fmt: skip
            return _pool(cos, aggregation, lambda_lse, cap.mask, cap.lengths)
        assert cap.gram is not None  # word_gram for "i2t"
        cos = _attended_cosines(
            raw, cap.gram, block.region_norm, lambda_softmax, context_bias=cap.bias,
            work=block.work, pair=block.pairs.get("i2t"),
        )  # fmt: skip
        return _pool(cos, aggregation, lambda_lse, None, None).T

    return _blockwise(regions, words, lengths, budget, score_block, word_gram=direction == "i2t")


def bfan_scores(
    regions: torch.Tensor,
    words: torch.Tensor,
    word_lengths: torch.Tensor | Sequence[int],
    *,
    focal: str = "equal",
    lambda_softmax: float = 20.0,
    max_elements: int | None = None,
) -> torch.Tensor:
    """BFAN's score of every (image, caption) pair (Liu et al., ACM MM 2019, Sec. 3).

    In each direction the query items attend over the context with the
    :func:`attention_weights` step, then the focal step re-assigns the attention: within
    each query item's weights ``x_1..x_c`` over the real context items, item ``i`` is kept
    when ``sum_j (x_i - x_j) > 0`` (``focal="equal"``, ``x_i`` above the row mean) or
    ``sum_j (x_i - x_j) sqrt(x_j) > 0`` (``focal="prob"``), and the kept weights are divided
    by their sum (no epsilon, as in CrossmodalGroup/BFAN). The pair score is the mean over
    the caption's real words of ``cos(e_k, a_k)`` (text-to-image) plus the mean over the
    regions of ``cos(v_j, a_j)`` (image-to-text).

    As in the reference ``xattn_score``, both directions use the same ``lambda_softmax`` and
    the same focal rule; the L2 norm of the attention adds :data:`NORM_EPS`, the cosine
    divides by ``(|q| |a|).clamp(min=COSINE_EPS)``. The one deviation: where no item passes
    the focal test (all weights of a row equal, e.g. the image-to-text row of a one-word
    caption, where the reference divides 0 by 0 and returns NaN), the items of largest
    weight are kept, which is all of them when the weights are equal.

    Args:
        regions: ``(n_img, R, D)`` region features, projected and L2-normalised.
        words: ``(n_cap, L, D)`` word features, projected and L2-normalised.
        word_lengths: ``(n_cap,)`` real words per caption, in ``1..L``.
        focal: ``"equal"`` or ``"prob"``.
        lambda_softmax: Inverse temperature of the attention softmax.
        max_elements: As in :func:`scan_scores`.

    Returns:
        The ``(n_img, n_cap)`` scores in the promoted dtype, float32 at least; differentiable
        (the keep/drop decision is piecewise constant, as in the reference).

    Raises:
        ValueError: An unknown ``focal``, a non-positive ``lambda_softmax`` or
            ``max_elements``, or malformed tokens.
    """
    choice(focal, "focal", BFAN_FOCALS)
    lambda_softmax = positive_float(lambda_softmax, "lambda_softmax")
    budget = _check_max_elements(max_elements)
    lengths = check_tokens(regions, words, word_lengths)

    def score_block(block: _Block) -> torch.Tensor:
        cap, raw = block.cap, block.raw("t2i")
        # the transposed copy first: the text-to-image pass may overwrite its raw scores
        raw_i2t = block.raw("i2t", raw)
        cos = _attended_cosines(
            raw, block.region_gram, cap.norm, lambda_softmax, focal=focal,
            context_count=block.n_regions, work=block.work, pair=block.pairs.get("t2i"),
        )  # fmt: skip
        t2i = _pool(cos, "mean", 1.0, cap.mask, cap.lengths)
        assert cap.gram is not None  # word_gram
        cos = _attended_cosines(
            raw_i2t, cap.gram, block.region_norm, lambda_softmax, context_bias=cap.bias,
            focal=focal, context_count=cap.count, work=block.work, pair=block.pairs.get("i2t"),
        )  # fmt: skip
        return t2i + cos.mean(dim=-1).T

    return _blockwise(regions, words, lengths, budget, score_block, word_gram=True)


# ----------------------------------------------------------------------------- engine


def _attended_cosines(
    raw: torch.Tensor,
    gram: torch.Tensor,
    query_norm: torch.Tensor,
    lambda_softmax: float,
    *,
    context_bias: torch.Tensor | None = None,
    focal: str | None = None,
    context_count: torch.Tensor | float = 1.0,
    work: _Workspace | None = None,
    pair: torch.Tensor | None = None,
) -> torch.Tensor:
    """``cos(q, a)`` of every query item with its attended context, from the raw scores.

    ``raw (n_x, c, n_q, q)``: context item ``j`` of context set ``x`` against query item
    ``k`` of query set ``m`` (padded query items have raw scores 0, so they add nothing to
    the attention's norm over the queries); ``gram (n_x, c, c)`` the context sets' Gram
    matrices; ``query_norm (n_q, q)``; ``context_bias (n_x, c, 1, 1)`` 0 for real context
    items and the dtype's minimum for padding. Returns ``(n_x, n_q, q)``.

    This is :func:`attention_weights` laid out with the context on dimension 1 (so the Gram
    products are one batched GEMM), with two shortcuts that change rounding only: the
    softmax is left unnormalised (``exp`` of the logits; its sum divides the two small
    results instead, the cosine being scale-invariant apart from its clamp, which is applied
    to the normalised values), and its usual max shift is skipped where ``lambda_softmax <=``
    :data:`_UNSHIFTED_LAMBDA`, the logits lying in ``[-lambda, lambda]`` because each score
    is at most its norm over the queries. With ``work`` (no gradient needed) the large
    intermediates live in reused buffers: the same numbers, without a fresh allocation per
    block; ``raw`` must then be ``pair[0]`` of a ``(2, n_x, c, n_q,
    q)`` buffer whose second half is scratch (it is overwritten, and so is ``raw``).
    """
    n_x, c, n_q, q = raw.shape
    inplace = work is not None  # then the same operations in place, in reused buffers
    if inplace:
        assert work is not None
        weights = work.get("weights", raw.shape, raw.dtype)
        weights = torch.ops.aten.leaky_relu.out(raw, 0.1, out=weights)
    else:
        weights = F.leaky_relu(raw, negative_slope=0.1)
    scale = lambda_softmax / (torch.linalg.vector_norm(weights, dim=-1, keepdim=True) + NORM_EPS)
    weights = weights.mul_(scale) if inplace else weights * scale
    if context_bias is not None:
        weights = weights.add_(context_bias) if inplace else weights + context_bias
    if lambda_softmax > _UNSHIFTED_LAMBDA:
        top = weights.amax(dim=1, keepdim=True).detach()
        weights = weights.sub_(top) if inplace else weights - top
    weights = weights.exp_() if inplace else weights.exp()
    if focal is not None:
        scratch = None
        if inplace:
            assert pair is not None  # work comes with pair
            scratch = pair[1]
        threshold = _focal_threshold(weights, focal, context_count, scratch)
        # 0/1 in the weights' dtype (into a float buffer: no bool-to-float conversion pass)
        keep = torch.gt(weights, threshold, out=scratch)
        weights = weights.mul_(keep) if inplace else weights * keep
    if inplace:
        # the raw scores and the Gram products side by side: multiplied and summed at once
        assert pair is not None
        torch.bmm(gram, weights.view(n_x, c, n_q * q), out=pair[1].view(n_x, c, n_q * q))
        dot, quad = pair.mul_(weights).sum(dim=2)
    else:
        spread = torch.bmm(gram, weights.reshape(n_x, c, n_q * q)).view(n_x, c, n_q, q)
        dot, quad = (weights * raw).sum(dim=1), (spread * weights).sum(dim=1)
    total = weights.sum(dim=1)
    attended_norm = quad.clamp_min(0.0).sqrt()
    return (dot / total) / (query_norm * (attended_norm / total)).clamp_min(COSINE_EPS)


def _focal_threshold(
    weights: torch.Tensor,
    focal: str,
    context_count: torch.Tensor | float,
    scratch: torch.Tensor | None = None,
) -> torch.Tensor:
    """BFAN's focal step as a threshold: context items (dimension 1) above it are kept.

    ``sum_j (x_i - x_j) > 0`` is ``x_i > sum_j x_j / c`` and ``sum_j (x_i - x_j) sqrt(x_j) >
    0`` is ``x_i > sum_j x_j^1.5 / sum_j sqrt(x_j)``; both thresholds scale with the weights,
    so unnormalised softmax weights give the same decision. Padded items have weight 0 and
    add nothing to either sum. Where no item would pass (all weights equal) the threshold
    drops just below the largest weight, which keeps the largest. The decision carries no
    gradient (the reference's indicator is a ``torch.where`` of constants).
    """
    with torch.no_grad():
        if focal == "equal":
            threshold = weights.sum(dim=1, keepdim=True) / context_count
        else:
            root = torch.sqrt(weights, out=scratch)
            root_sum = root.sum(dim=1, keepdim=True)
            threshold = root.mul_(weights).sum(dim=1, keepdim=True) / root_sum
        top = weights.amax(dim=1, keepdim=True)
        return torch.where(threshold < top, threshold, torch.nextafter(top, top.new_zeros(())))


class _Workspace:
    """Flat buffers reused by every block of one call (inference only)."""

    def __init__(self, device: torch.device) -> None:
        self.buffers: dict[str, torch.Tensor] = {}
        self.device = device

    def get(self, name: str, shape: torch.Size, dtype: torch.dtype) -> torch.Tensor:
        size = math.prod(shape)
        buf = self.buffers.get(name)
        if buf is None or buf.numel() < size or buf.dtype != dtype:
            buf = self.buffers[name] = torch.empty(size, dtype=dtype, device=self.device)
        return buf[:size].view(shape)


def _pool(
    cos: torch.Tensor,
    aggregation: str,
    lambda_lse: float,
    mask: torch.Tensor | None,
    lengths: torch.Tensor | None,
) -> torch.Tensor:
    """Pool ``cos (n_x, n_q, q)`` over its last dimension; ``mask (n_q, q)`` marks real items."""
    if aggregation in ("lse", "max"):
        if mask is not None:
            cos = cos.masked_fill(~mask, torch.finfo(cos.dtype).min / max(lambda_lse, 1.0))
        if aggregation == "max":
            return cos.amax(dim=-1)
        return torch.logsumexp(cos * lambda_lse, dim=-1) / lambda_lse
    if mask is not None:
        cos = cos.masked_fill(~mask, 0.0)
    total = cos.sum(dim=-1)
    if aggregation == "sum":
        return total
    return total / (lengths if lengths is not None else cos.shape[-1])


class _Block:
    """One block of images x captions: its raw scores and the statistics they need."""

    def __init__(
        self,
        regions: torch.Tensor,
        gram: torch.Tensor,
        norm: torch.Tensor,
        captions: _CaptionBlock,
        work: _Workspace | None,
    ) -> None:
        self.regions, self.region_gram, self.region_norm = regions, gram, norm
        self.cap, self.work = captions, work
        self.n_regions = float(regions.shape[1])
        #: without autograd: the ``(2, ...)`` buffers whose first halves hold the raw scores
        self.pairs: dict[str, torch.Tensor] = {}

    def raw(self, direction: str, t2i: torch.Tensor | None = None) -> torch.Tensor:
        """``<v_j, e_k>`` as ``(n_i, R, n_c, L)`` (``"t2i"``, one GEMM) or ``(n_c, L, n_i,
        R)`` (``"i2t"``: one GEMM, or the transposed copy of the ``t2i`` scores)."""
        (n_i, n_r, dim), (n_c, n_w, _) = self.regions.shape, self.cap.words.shape
        left = self.regions.reshape(n_i * n_r, dim)
        right = self.cap.words.reshape(n_c * n_w, dim)
        shape = (n_i, n_r, n_c, n_w) if direction == "t2i" else (n_c, n_w, n_i, n_r)
        out = None
        if self.work is not None:
            pair = self.work.get(direction, torch.Size((2, *shape)), self.regions.dtype)
            self.pairs[direction], out = pair, pair[0]
        if direction == "i2t":
            if t2i is not None:
                moved = t2i.permute(2, 3, 0, 1)
                return moved.contiguous() if out is None else out.copy_(moved)
            left, right = right, left
        flat = None if out is None else out.view(left.shape[0], right.shape[0])
        return torch.matmul(left, right.T, out=flat).view(shape)


class _CaptionBlock:
    """Captions of similar length, trimmed to the longest, padding words zeroed."""

    def __init__(
        self, words: torch.Tensor, lengths: torch.Tensor, dtype: torch.dtype, *, gram: bool
    ) -> None:
        self.lengths = lengths.to(dtype)
        self.mask = _length_mask(lengths, words.shape[1])
        # zeroed padding gives raw scores of exactly 0: no norm or mask needed on the query side
        self.words = torch.where(self.mask.unsqueeze(-1), words.to(dtype), 0.0)
        self.norm = torch.linalg.vector_norm(self.words, dim=-1)
        self.gram = torch.bmm(self.words, self.words.transpose(1, 2)) if gram else None
        bias = torch.zeros(self.mask.shape, dtype=dtype, device=words.device)
        self.bias = bias.masked_fill_(~self.mask, torch.finfo(dtype).min)[..., None, None]
        self.count = self.lengths.view(-1, 1, 1, 1)


def block_plan(
    n_img: int,
    n_regions: int,
    dim: int,
    lengths: torch.Tensor,
    *,
    max_elements: int | None = None,
    device: torch.device | str = "cpu",
    autograd: bool = False,
) -> tuple[int, torch.Tensor, list[tuple[int, int, int]]]:
    """How :func:`scan_scores` and :func:`bfan_scores` split the pairs into blocks.

    A block's raw scores, ``image_step x R x (stop - start) x longest`` numbers, never exceed
    ``max_elements``, nor do its regions or words (``x D``); a block holds one image and one
    caption at least. On CPU without ``autograd`` blocks are also kept under
    :data:`CPU_BLOCK_ELEMENTS`, so that the passes over them stay in the CPU caches; with
    autograd every block's intermediates are kept for the backward pass anyway, and fewer,
    larger blocks cost less. Exposed for benchmarks and for callers that size their own
    batches.

    Args:
        n_img: Number of images.
        n_regions: Regions per image ``R``.
        dim: Feature size ``D``.
        lengths: ``(n_cap,)`` real words per caption.
        max_elements: Bound on a block's largest intermediate (default
            :data:`DEFAULT_MAX_ELEMENTS`).
        device: Device the scores are computed on.
        autograd: Whether the scores need a gradient.

    Returns:
        ``(image_step, order, caption_blocks)``: images go in consecutive runs of
        ``image_step``; captions are taken in ``order`` (by length, stable) and each
        ``(start, stop, longest)`` block covers ``order[start:stop]``, trimmed to its
        ``longest`` caption.

    Raises:
        ValueError: ``max_elements`` is not a positive integer or None.
    """
    budget = _check_max_elements(max_elements)
    device = torch.device(device)
    capped = device.type == "cpu" and not autograd
    target = min(budget, CPU_BLOCK_ELEMENTS) if capped else budget
    order = torch.argsort(lengths, stable=True)
    sorted_lengths = lengths[order].tolist()
    longest = max(sorted_lengths, default=1)
    side = min(math.isqrt(target) // n_regions, target // (n_regions * longest))
    image_step = max(1, min(n_img, side, budget // (n_regions * dim)))
    image_step = -(-n_img // -(-n_img // image_step)) if n_img else 1  # equal image blocks
    n_cap = len(sorted_lengths)
    blocks = []
    start = 0
    while start < n_cap:
        stop = start + 1
        # grow the block while its longest caption's padded size stays within the bounds
        while stop < n_cap:
            longest, count = sorted_lengths[stop], stop + 1 - start
            if (
                count * longest * image_step * n_regions > target
                or count * longest * max(dim, longest) > budget
            ):
                break
            stop += 1
        blocks.append((start, stop, sorted_lengths[stop - 1]))
        start = stop
    return image_step, order, blocks


def _blockwise(
    regions: torch.Tensor,
    words: torch.Tensor,
    lengths: torch.Tensor,
    budget: int,
    score_block,
    *,
    word_gram: bool,
) -> torch.Tensor:
    """Run ``score_block`` over the blocks of :func:`block_plan`; ``(n_img, n_cap)``."""
    dtype = torch.promote_types(torch.promote_types(regions.dtype, words.dtype), torch.float32)
    n_img, n_regions, dim = regions.shape
    n_cap = words.shape[0]
    if n_img == 0 or n_cap == 0:
        return regions.new_zeros((n_img, n_cap), dtype=dtype)
    needs_grad = torch.is_grad_enabled() and (regions.requires_grad or words.requires_grad)
    image_step, order, caption_blocks = block_plan(
        n_img,
        n_regions,
        dim,
        lengths,
        max_elements=budget,
        device=regions.device,
        autograd=needs_grad,
    )
    # without autograd, the large intermediates of every block live in the same buffers
    work = None if needs_grad else _Workspace(regions.device)
    # split (backward: one concatenation) rather than slice or gather per block (backward: a
    # zero-filled gradient of the whole input per block)
    image_blocks = []
    for block in regions.split(image_step):
        block = block.to(dtype)
        gram = torch.bmm(block, block.transpose(1, 2))
        image_blocks.append((block, gram, torch.linalg.vector_norm(block, dim=-1)))
    sizes = [stop - start for start, stop, _ in caption_blocks]
    sorted_words = words.index_select(0, order).split(sizes)
    sorted_lengths = lengths[order].split(sizes)
    columns = []
    for block_words, block_lengths, (_, _, longest) in zip(
        sorted_words, sorted_lengths, caption_blocks, strict=True
    ):
        captions = _CaptionBlock(block_words[:, :longest], block_lengths, dtype, gram=word_gram)
        rows = [
            score_block(_Block(block, gram, norm, captions, work))
            for block, gram, norm in image_blocks
        ]
        columns.append(torch.cat(rows, dim=0))
    scores = torch.cat(columns, dim=1)
    return scores.index_select(1, torch.argsort(order))


__all__ = [
    "BFAN_FOCALS",
    "CPU_BLOCK_ELEMENTS",
    "SGRAFScorer",
    "COSINE_EPS",
    "DEFAULT_MAX_ELEMENTS",
    "NORM_EPS",
    "SCAN_AGGREGATIONS",
    "SCAN_DIRECTIONS",
    "attention_weights",
    "bfan_scores",
    "block_plan",
    "check_tokens",
    "scan_scores",
]
