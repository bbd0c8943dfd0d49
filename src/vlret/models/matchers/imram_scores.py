"""IMRAM's block scorer: every (image, caption) pair of a block scored at once.

The authors' release (HuiChen24/IMRAM ``model.py``, ``xattn_score_Text_IMRAM`` /
``xattn_score_Image_IMRAM``) loops over captions, repeats each caption over the images of a
128 x 128 shard, and runs ``K`` steps of SCAN's attention, each followed by the gated memory
update ``x <- g * x + (1 - g) * o`` with ``o = tanh(W_o [x; c] + b_o)``,
``g = sigmoid(W_g [x; c] + b_g)`` (``c`` the attended context), the last update included
though nothing reads it. :func:`imram_scores` computes the same scores with less work:

* ``W [x; c] = W_x x + W_c c`` and ``W_c c = A (C W_c^T)``: the context ``C`` is projected
  once per image (text-to-image) or caption (image-to-text), never once per pair, and the
  two layers ``o`` and ``g`` run as one product of ``2D`` outputs;
* ``W_x x_0`` of the first step is once per caption (or image): only the later memories,
  which differ per pair, need a per-pair ``(q, D) x (D, 2D)`` product;
* the step's score needs ``cos(x_0, c)`` only, and ``<x_0, c> = sum_j A_j <x_0, C_j>`` reads
  the first step's raw scores while ``|c|^2 = A G A^T`` reads the context's Gram matrix ``G``,
  so the attended vectors ``c`` are never formed;
* the update after the last step is skipped.

Captions go in blocks of similar length (sorted, each block trimmed to its longest caption);
padded words are zeroed and masked exactly as the reference's slicing leaves them out: in
text-to-image they are not queries (neither in the attention's L2 norm over the words nor in
the mean over words), in image-to-text they are not context (weight 0 in the softmax).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ..attention import (
    NORM_EPS,
    _length_mask,
    check_tokens,
    choice,
    positive_float,
    positive_int,
)
from ..cross_attention import COSINE_EPS, _check_max_elements, _Workspace
from ..cross_model import l2norm

#: ``mode``: words attend over regions (Text-IMRAM), regions over words (Image-IMRAM), or the
#: sum of both (Full-IMRAM).
IMRAM_MODES = ("text", "image", "full")
#: The memory's layer pairs ``(linear, gate)`` per direction, keyed as in the release.
DIRECTIONS = {"text": ("t2i",), "image": ("i2t",), "full": ("t2i", "i2t")}


def _split_layers(
    layers: tuple[nn.Linear, nn.Linear], dim: int, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(W_x, W_c, b)``: the ``linear`` and ``gate`` rows stacked (``linear``'s doubled, so
    that one sigmoid gives both: ``tanh(a) = 2 sigmoid(2 a) - 1``), split by input half."""
    linear, gate = layers
    weight = torch.cat([2 * linear.weight, gate.weight], dim=0).to(dtype)  # (2D, 2D)
    bias = torch.cat([2 * linear.bias, gate.bias], dim=0).to(dtype)
    return weight[:, :dim].contiguous(), weight[:, dim:].contiguous(), bias


def _attention(
    raw: torch.Tensor,
    query_mask: torch.Tensor | None,
    context_mask: torch.Tensor | None,
    lambda_softmax: float,
) -> torch.Tensor:
    """:func:`~vlret.models.attention.attention_weights` (same numbers), its norm over the
    queries taken by ``torch.linalg.vector_norm``, whose gradient is 0, not NaN, at a padded
    context item's all-zero column (image-to-text: a padded word scores 0 with every region)."""
    scores = F.leaky_relu(raw, negative_slope=0.1)
    if query_mask is not None:
        scores = scores.masked_fill(~query_mask.unsqueeze(-1), 0.0)
    norm = torch.linalg.vector_norm(scores, dim=-2, keepdim=True) + NORM_EPS
    logits = scores * (lambda_softmax / norm)
    if context_mask is not None:
        logits = logits.masked_fill(~context_mask.unsqueeze(-2), torch.finfo(logits.dtype).min)
    return torch.softmax(logits, dim=-1)


def _direction_scores(
    context: torch.Tensor,
    context_mask: torch.Tensor | None,
    queries: torch.Tensor,
    query_mask: torch.Tensor | None,
    query_lengths: torch.Tensor | None,
    layers: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None,
    *,
    steps: int,
    lambda_softmax: float,
    renorm_memory: bool,
    work: _Workspace | None = None,
) -> torch.Tensor:
    """The summed per-step scores ``(n_x, n_q)`` of queries ``(n_q, q, D)`` attending over
    context sets ``(n_x, c, D)``; masks are True at real items (padding zeroed already).
    With ``work`` (no gradient needed) the memory update's ``(n_x, n_q q, 2D)`` and
    ``(n_x, n_q q, D)`` intermediates live in buffers reused by every block (the same
    numbers, without fresh pages for each block)."""
    n_x, c, dim = context.shape
    n_q, q, _ = queries.shape
    rows = n_q * q
    # raw0[x, m, k, j] = <C_xj, Q_mk>, laid out (n_x, n_q q, c): one GEMM and one transpose
    raw0 = (context.reshape(n_x * c, dim) @ queries.reshape(rows, dim).T).view(n_x, c, rows)
    raw0 = raw0.transpose(1, 2).contiguous()
    gram = torch.bmm(context, context.transpose(1, 2))
    query_norm = torch.linalg.vector_norm(queries, dim=-1)  # (n_q, q)
    attn_context_mask = None if context_mask is None else context_mask[:, None, :]
    projected = None
    if steps > 1:
        assert layers is not None
        w_x, w_c, bias = layers
        projected = context @ w_c.T  # (n_x, c, 2D)
        first = F.linear(queries.reshape(rows, dim), w_x, bias)  # (n_q q, 2D)
    raw = raw0
    memory: torch.Tensor | None = None
    total: torch.Tensor | None = None
    for step in range(steps):
        attn = _attention(
            raw.view(n_x, n_q, q, c), query_mask, attn_context_mask, lambda_softmax
        ).view(n_x, rows, c)
        dot = (attn * raw0).sum(dim=-1)
        quad = (torch.bmm(attn, gram) * attn).sum(dim=-1).clamp_min(0.0)
        cos = dot.view(n_x, n_q, q) / (query_norm * quad.sqrt().view(n_x, n_q, q)).clamp_min(
            COSINE_EPS
        )
        if query_mask is None:
            score = cos.mean(dim=-1)
        else:
            assert query_lengths is not None
            score = cos.masked_fill(~query_mask, 0.0).sum(dim=-1) / query_lengths
        total = score if total is None else total + score
        if step == steps - 1:
            break
        assert projected is not None and layers is not None
        wide, narrow = torch.Size((n_x, rows, 2 * dim)), torch.Size((n_x, rows, dim))
        buf = {}
        if work is not None:
            dtype = context.dtype
            buf = {k: work.get(k, wide if k == "pre" else narrow, dtype) for k in ("pre", "out")}
            buf["diff"] = work.get("diff", narrow, dtype)
            buf["memory"] = work.get(f"memory{step % 2}", narrow, dtype)  # not the last one's
        if memory is None:
            base = queries.reshape(1, rows, dim)
            pre = torch.bmm(attn, projected, out=buf.get("pre")).add_(first)
        else:
            base = memory
            flat = buf["pre"].view(n_x * rows, 2 * dim) if buf else None
            pre = torch.addmm(layers[2], memory.reshape(n_x * rows, dim), layers[0].T, out=flat)
            pre = pre.view(wide).baddbmm_(attn, projected)
        # one sigmoid over both halves (in place: its backward reads its output only)
        # (split, not two slices: its backward is one concatenation, no zero-filled copies)
        half, gate = pre.sigmoid_().split(dim, dim=-1)
        out = torch.mul(half, 2.0, out=buf.get("out")).sub_(1.0)  # tanh of the linear layer
        diff = torch.sub(base, out, out=buf.get("diff"))
        memory = torch.addcmul(out, gate, diff, out=buf.get("memory"))  # g x + (1 - g) o
        if renorm_memory:
            memory = l2norm(memory)
        raw = torch.bmm(memory, context.transpose(1, 2))  # (n_x, n_q q, c)
    assert total is not None
    return total


def imram_plan(
    n_img: int,
    n_regions: int,
    dim: int,
    lengths: torch.Tensor,
    *,
    mode: str = "full",
    steps: int = 3,
    max_elements: int | None = None,
) -> tuple[int, torch.Tensor, list[tuple[int, int, int]]]:
    """How :func:`imram_scores` splits the pairs into blocks.

    A block's largest intermediate, ``images x captions x q x w`` numbers (``q`` the query
    items of a pair: its words for ``"text"``, its regions for ``"image"``, the larger for
    ``"full"``; ``w`` the memory layers' ``2D`` outputs when ``steps > 1``, else the context
    size), stays within ``max_elements``; a block holds one image and one caption at least.
    Exposed for benchmarks.

    Args:
        n_img: Number of images.
        n_regions: Regions per image ``R``.
        dim: Feature size ``D``.
        lengths: ``(n_cap,)`` real words per caption.
        mode: ``"text"``, ``"image"`` or ``"full"``.
        steps: Matching steps ``K``.
        max_elements: Bound on a block's largest intermediate (default
            :data:`~vlret.models.attention.DEFAULT_MAX_ELEMENTS`).

    Returns:
        ``(image_step, order, caption_blocks)``: images in consecutive runs of
        ``image_step``; captions taken in ``order`` (by length, stable), each ``(start, stop,
        longest)`` block covering ``order[start:stop]`` trimmed to ``longest`` words.

    Raises:
        ValueError: ``max_elements`` is not a positive integer or None.
    """
    budget = _check_max_elements(max_elements)

    def per_pair(longest: int) -> int:
        queries = {"text": longest, "image": n_regions, "full": max(longest, n_regions)}[mode]
        width = max(2 * dim if steps > 1 else 0, n_regions, longest)
        return queries * width

    order = torch.argsort(lengths, stable=True)
    sorted_lengths = lengths[order].tolist()
    widest = per_pair(max(sorted_lengths, default=1))
    image_step = max(1, min(n_img, math.isqrt(max(1, budget // widest))))
    image_step = -(-n_img // -(-n_img // image_step)) if n_img else 1  # equal image blocks
    blocks = []
    start, n_cap = 0, len(sorted_lengths)
    while start < n_cap:
        stop = start + 1
        while (
            stop < n_cap
            and image_step * (stop + 1 - start) * per_pair(sorted_lengths[stop]) <= budget
        ):
            stop += 1
        blocks.append((start, stop, sorted_lengths[stop - 1]))
        start = stop
    return image_step, order, blocks


def imram_scores(
    regions: torch.Tensor,
    words: torch.Tensor,
    word_lengths: torch.Tensor | Sequence[int],
    *,
    memory: Mapping[str, tuple[nn.Linear, nn.Linear]] | None = None,
    mode: str = "full",
    steps: int = 3,
    lambda_softmax: float = 9.0,
    renorm_memory: bool = False,
    max_elements: int | None = None,
) -> torch.Tensor:
    """IMRAM's score of every (image, caption) pair (Chen et al., CVPR 2020).

    Step ``k`` of ``"text"`` (Text-IMRAM): every real word's memory ``x_{k-1}`` (the word
    itself at ``k = 1``) attends over the image's regions with SCAN's clipped-L2-norm
    attention (:func:`~vlret.models.attention.attention_weights`, the norm over the caption's
    real words), giving ``c_k``; the step's score ``F_k`` is the mean over the real words of
    ``cos(w, c_k)`` with the ORIGINAL word ``w`` (as the release's ``cosine_similarity(
    cap_i_expand, attn_feat)``); then ``x_k = g * x_{k-1} + (1 - g) * o`` with
    ``o = tanh(linear_t2i([x_{k-1}; c_k]))``, ``g = sigmoid(gate_t2i([x_{k-1}; c_k]))``,
    L2-normalised only with ``renorm_memory``. ``"image"`` (Image-IMRAM) swaps the roles
    (regions attend over the real words, ``linear_i2t`` / ``gate_i2t``, mean over regions);
    the score is ``sum_k F_k``, and ``"full"`` adds both directions' sums.

    Args:
        regions: ``(n_img, R, D)`` region features, projected and L2-normalised.
        words: ``(n_cap, L, D)`` word features, projected and L2-normalised.
        word_lengths: ``(n_cap,)`` real words per caption, in ``1..L``.
        memory: ``{"t2i": (linear, gate), "i2t": (linear, gate)}``, each an
            ``nn.Linear(2D, D)``; the directions of ``mode`` are needed when ``steps > 1``.
        mode: ``"text"``, ``"image"`` or ``"full"``.
        steps: Matching steps ``K``.
        lambda_softmax: Inverse temperature of the attention softmax.
        renorm_memory: L2-normalise each updated memory (the release's default, turned off by
            its scripts' ``--no_IMRAM_norm``).
        max_elements: Bound on a block's largest intermediate (:func:`imram_plan`).

    Returns:
        The ``(n_img, n_cap)`` scores in the promoted dtype of the inputs, float32 at least;
        differentiable.

    Raises:
        ValueError: An invalid setting or malformed tokens (the message names it).
    """
    choice(mode, "mode", IMRAM_MODES)
    positive_int(steps, "steps")
    lambda_softmax = positive_float(lambda_softmax, "lambda_softmax")
    if not isinstance(renorm_memory, bool):
        raise ValueError(f"renorm_memory: must be true or false, got {renorm_memory!r}")
    budget = _check_max_elements(max_elements)
    lengths = check_tokens(regions, words, word_lengths)
    dtype = torch.promote_types(torch.promote_types(regions.dtype, words.dtype), torch.float32)
    n_img, n_regions, dim = regions.shape
    layers: dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None] = {}
    for direction in DIRECTIONS[mode]:
        layers[direction] = None
        if steps > 1:
            if memory is None or direction not in memory:
                raise ValueError(f"memory: needs the {direction!r} layers for steps > 1")
            layers[direction] = _split_layers(memory[direction], dim, dtype)
    n_cap = words.shape[0]
    if n_img == 0 or n_cap == 0:
        return regions.new_zeros((n_img, n_cap), dtype=dtype)
    image_step, order, caption_blocks = imram_plan(
        n_img, n_regions, dim, lengths, mode=mode, steps=steps, max_elements=budget
    )
    weights = [t for pair in layers.values() if pair is not None for t in pair]
    needs_grad = torch.is_grad_enabled() and any(
        t.requires_grad for t in (regions, words, *weights)
    )
    direction_scores = functools.partial(
        _direction_scores,
        steps=steps,
        lambda_softmax=lambda_softmax,
        renorm_memory=renorm_memory,
        work=None if needs_grad else _Workspace(regions.device),
    )
    image_blocks = [block.to(dtype) for block in regions.split(image_step)]
    sizes = [stop - start for start, stop, _ in caption_blocks]
    columns = []
    for block_words, block_lengths, (_, _, longest) in zip(
        words.index_select(0, order).split(sizes), lengths[order].split(sizes), caption_blocks,
        strict=True,
    ):  # fmt: skip
        mask = _length_mask(block_lengths, longest)
        caps = torch.where(mask.unsqueeze(-1), block_words[:, :longest].to(dtype), 0.0)
        count = block_lengths.to(dtype)
        rows = []
        for images in image_blocks:
            score = images.new_zeros((images.shape[0], caps.shape[0]))
            if "t2i" in layers:
                score = score + direction_scores(images, None, caps, mask, count, layers["t2i"])
            if "i2t" in layers:
                score = score + direction_scores(caps, mask, images, None, None, layers["i2t"]).T
            rows.append(score)
        columns.append(torch.cat(rows, dim=0))
    scores = torch.cat(columns, dim=1)
    return scores.index_select(1, torch.argsort(order))


__all__ = ["DIRECTIONS", "IMRAM_MODES", "imram_plan", "imram_scores"]
