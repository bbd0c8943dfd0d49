"""The numerical kernels of :class:`~vlret.models.sgraf.SGRAFScorer`: its BatchNorm helpers,
the per-word local projection with a hand-written backward, and the SGR reasoning steps.

Every (image, caption, word) triple costs one ``D -> sim_dim`` projection of its squared
difference vector, the irreducible work of SGRAF scoring; SGR's reasoning adds two
``sim_dim x sim_dim`` products per node and step. These kernels keep the rest (attention,
norms, softmaxes) small beside them. ``low`` (the scorer's ``matmul_precision="bfloat16"``)
runs the per-pair GEMMs with bfloat16 operands and results and float32 accumulation; every
element-wise step but SGR's (exact) ReLU stays in the working dtype, and none mixes dtypes
(ATen runs a mixed-dtype pass element by element, slower than the GEMM it feeds). Calls
without autograd reuse their blocks' buffers (:class:`Scratch`): fresh memory each block is
paid for in page faults.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import once_differentiable

from .attention import CPU_BLOCK_ELEMENTS, NORM_EPS, attention_weights

#: ``matmul_precision`` values of :class:`~vlret.models.sgraf.SGRAFScorer`.
PRECISIONS = ("float32", "bfloat16")


def l2norm(x: torch.Tensor) -> torch.Tensor:
    """The reference ``l2norm`` over the last dimension: ``x / (||x|| + 1e-8)``."""
    return x / (torch.linalg.vector_norm(x, dim=-1, keepdim=True) + NORM_EPS)


def linear(x: torch.Tensor, layer: nn.Linear) -> torch.Tensor:
    """``layer`` applied in ``x``'s dtype (float32 parameters serve float64 inputs too)."""
    return F.linear(x, layer.weight.to(x.dtype), layer.bias.to(x.dtype))


def gemm(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    low: bool,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """``F.linear(x, weight, bias)``; with ``low`` the product runs on bfloat16 operands
    (float32 accumulation; converted unless they are bfloat16 already) and its result is
    brought back to ``bias``'s dtype (``dtype`` without a bias) before the bias is added."""
    if not low:
        return F.linear(x, weight, bias)
    out = F.linear(x.to(torch.bfloat16), weight.to(torch.bfloat16))
    return out.to(dtype) if bias is None else out.to(bias.dtype).add_(bias)


def update_running(bn: nn.BatchNorm1d, means: torch.Tensor, variances: torch.Tensor) -> None:
    """Apply ``K`` successive BatchNorm updates of the running statistics at once.

    ``means`` and ``variances`` (unbiased) are ``(K, C)``, the statistics of ``K`` calls in
    order; the result equals ``K`` calls of :class:`torch.nn.BatchNorm1d` in training mode
    (momentum ``m``: ``r <- (1 - m) r + m x``; momentum ``None``: cumulative average).
    """
    if not bn.track_running_stats:
        return
    assert bn.running_mean is not None and bn.running_var is not None
    assert bn.num_batches_tracked is not None
    start = int(bn.num_batches_tracked)
    count = means.shape[0]
    factors = [
        bn.momentum if bn.momentum is not None else 1.0 / (start + k + 1) for k in range(count)
    ]
    coefs, keep = [], 1.0
    for f in reversed(factors):
        coefs.append(f * keep)
        keep *= 1.0 - f
    coef = torch.tensor(coefs[::-1], dtype=torch.float64, device=means.device)
    with torch.no_grad():
        for buf, stats in ((bn.running_mean, means), (bn.running_var, variances)):
            new = keep * buf.double() + coef @ stats.detach().double()
            buf.copy_(new.to(buf.dtype))
        bn.num_batches_tracked.add_(count)


def batch_norm(x: torch.Tensor, bn: nn.BatchNorm1d) -> torch.Tensor:
    """:class:`torch.nn.BatchNorm1d` on ``x (N, C, *)`` computed in ``x``'s dtype.

    Training mode normalises with the biased batch variance over every dimension but the
    channel dimension 1 and updates the running statistics with the unbiased one; evaluation
    mode uses the running statistics.
    """
    channels = x.shape[1]
    shape = [1, channels] + [1] * (x.dim() - 2)
    if bn.training:
        dims = [d for d in range(x.dim()) if d != 1]
        n = x.numel() // channels
        mean = x.mean(dim=dims)
        var = x.var(dim=dims, unbiased=False)
        update_running(bn, mean.unsqueeze(0), (var * n / (n - 1)).unsqueeze(0))
    else:
        assert bn.running_mean is not None and bn.running_var is not None  # tracked
        mean, var = bn.running_mean.to(x.dtype), bn.running_var.to(x.dtype)
    scale = bn.weight.to(x.dtype) / torch.sqrt(var + bn.eps)
    return (x - mean.view(shape)) * scale.view(shape) + bn.bias.to(x.dtype).view(shape)


class LocalProjection(torch.autograd.Function):
    """``W (e - l2norm(u))^2 + b`` (element-wise square) for attended vectors ``u (ib, M, D)``
    and words ``e (M, D)``: the pre-norm local similarity vectors ``(ib, M, S)``.

    The same numbers as the composition of the reference's steps, with a hand-written
    backward that keeps only ``u`` (autograd would keep ``u``, the difference and its square,
    three ``D``-sized tensors a word and pair) and recomputes the difference from it. (The
    bfloat16 evaluation path is :func:`low_local_projection`.)
    """

    @staticmethod
    def forward(ctx, u, e, weight, bias):
        norm = torch.linalg.vector_norm(u, dim=-1, keepdim=True)
        inv = 1.0 / (norm + NORM_EPS)
        diff = torch.addcmul(e, u, inv, value=-1.0)  # e - u / (|u| + eps); squared below
        ctx.save_for_backward(u, e, weight, inv)
        return F.linear(diff.square_(), weight, bias)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        u, e, weight, inv = ctx.saved_tensors
        need_u, need_e, need_w, need_b = ctx.needs_input_grad[:4]
        diff = torch.addcmul(e, u, inv, value=-1.0)
        flat = grad.reshape(-1, grad.shape[-1])
        g_w = flat.T @ diff.square().reshape(-1, diff.shape[-1]) if need_w else None
        g_b = flat.sum(dim=0) if need_b else None
        g_u = g_e = None
        if need_u or need_e:
            g_diff = (grad @ weight).mul_(diff).mul_(2.0)  # d loss / d (e - a)
            del diff
            if need_e:
                g_e = g_diff.sum(dim=0)
            if need_u:
                # a = u / n, n = |u| + eps: d loss/du = -g/n + u (u . g) / (n^2 |u|).
                norm = torch.linalg.vector_norm(u, dim=-1, keepdim=True)
                dot = torch.linalg.vecdot(u, g_diff).unsqueeze(-1)
                coef = dot * inv.square() / norm.clamp_min(torch.finfo(norm.dtype).tiny)
                g_u = g_diff.mul_(-inv).addcmul_(u, coef)
        return g_u, g_e, g_w, g_b


class Scratch:
    """Buffers the blocks of one call reuse (calls without autograd only): one flat tensor per
    dtype and slot, grown to the largest request. Each :meth:`take` hands out the start of
    its tensor, so a view is valid until the next :meth:`take` of the same dtype and slot."""

    def __init__(self) -> None:
        self._flat: dict[tuple[torch.dtype, int], torch.Tensor] = {}

    def take(
        self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, slot: int = 0
    ) -> torch.Tensor:
        """An uninitialised ``shape`` tensor of ``dtype`` on ``device`` from slot ``slot``."""
        size = math.prod(shape)
        flat = self._flat.get((dtype, slot))
        if flat is None or flat.numel() < size or flat.device != device:
            flat = self._flat[dtype, slot] = torch.empty(size, dtype=dtype, device=device)
        return flat[:size].view(shape)


def eval_local_projection(
    attn: torch.Tensor,
    regions: torch.Tensor,
    words: torch.Tensor,
    word_mask: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    scratch: Scratch,
    chunk: int,
    gram: torch.Tensor | None,
    out: torch.Tensor,
) -> None:
    """:class:`LocalProjection`'s forward and the local nodes' l2norm without autograd,
    ``chunk`` images at a time (their ``D``-sized intermediates in buffers every chunk
    reuses, in the caches): writes the ``(ib, cb, L, S)`` local nodes into ``out`` (padded
    words' nodes zeroed).

    ``attn (ib, cb L, R)``: the attention weights (working dtype) of the ``cb L`` words over
    each image's regions; ``regions (ib, R, D)``, ``weight (S, D)``, ``bias (S,)`` and
    ``out`` in the products' dtype; ``words (cb L, D)`` in the working dtype; ``word_mask
    (cb, L)`` the real words.

    ``gram`` None (the products in the working dtype): the steps of :class:`LocalProjection`
    and ``l2norm``. ``gram (ib, R, R)``, each image's ``regions regions^T`` in the working
    dtype (bfloat16 products): the attended vector's norm comes from the weights and the Gram
    matrix (``|u|^2 = w^T G w``, ``R^2`` numbers a word instead of ``D``) and scales the
    weights, so the product returns the unit attended vectors ``a`` directly; their
    difference with the word and its square, and the nodes' norms, are taken in the working
    dtype, converted once each way (no element-wise pass mixes dtypes: those run element by
    element).
    """
    ib, m, _ = attn.shape
    d, size = regions.shape[-1], weight.shape[0]
    if gram is not None:
        sq_norm = (torch.bmm(attn, gram) * attn).sum(dim=-1, keepdim=True)
        scale = 1.0 / (sq_norm.clamp_min_(0.0).sqrt_() + NORM_EPS)
        attn = (attn * scale).to(regions.dtype)
    keep = word_mask.reshape(1, m, 1).to(words.dtype)  # 0 at padding: scales its node to 0
    for i0 in range(0, ib, chunk):
        i1 = min(ib, i0 + chunk)
        shape = (i1 - i0, m, d)
        # bfloat16: one buffer holds the unit vectors, then (once converted) their squares
        attended = scratch.take(shape, regions.dtype, attn.device)
        torch.bmm(attn[i0:i1], regions[i0:i1], out=attended)
        if gram is not None:
            diff = scratch.take(shape, words.dtype, attn.device)
            torch.sub(diff.copy_(attended), words, out=diff).square_()  # (a - e)^2
            square = attended.copy_(diff)
        else:
            norm = torch.linalg.vector_norm(attended, dim=-1, keepdim=True)
            inv = 1.0 / (norm + NORM_EPS)
            square = torch.addcmul(words, attended, inv, value=-1.0, out=attended).square_()
        local = scratch.take(((i1 - i0) * m, size), weight.dtype, attn.device, slot=1)
        torch.addmm(bias, square.view(-1, d), weight.T, out=local)
        nodes = local.view(i1 - i0, m, size).to(words.dtype)
        norm = torch.linalg.vector_norm(nodes, dim=-1, keepdim=True)
        out[i0:i1].copy_(nodes.mul_(keep / (norm + NORM_EPS)).view(out[i0:i1].shape))  # l2norm


@dataclass(frozen=True)
class Operands:
    """The products' operands of one :class:`~vlret.models.sgraf.SGRAFScorer` call, prepared
    once per call: ``mm_dtype`` is bfloat16 with ``low`` (see :func:`block_nodes`), else the
    working dtype; the local projection's weights in ``mm_dtype``, the global projection's
    weight in ``mm_dtype`` and bias in the working dtype, SGR's steps (:func:`graph_steps`)."""

    low: bool
    mm_dtype: torch.dtype
    local_w: torch.Tensor
    local_b: torch.Tensor
    global_w: torch.Tensor
    global_b: torch.Tensor
    steps: list[GraphStep]
    scratch: Scratch | None  # the evaluation path's buffers (None with autograd)


def block_nodes(
    regions: torch.Tensor,
    img_glob: torch.Tensor,
    words: tuple[torch.Tensor, torch.Tensor],
    cap_glob: torch.Tensor,
    mask: torch.Tensor,
    ops: Operands,
    gram: torch.Tensor | None,
    lambda_softmax: float,
    keep: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``(ib, cb, L + 1, sim_dim)`` similarity nodes of a block of ``ib`` images x ``cb``
    captions (global node first, padded word nodes zeroed; in ``ops.mm_dtype``) and their
    ``(cb, L + 1)`` mask.

    ``regions (ib, R, D)`` in ``ops.mm_dtype``; ``img_glob (ib, D)`` and ``cap_glob (cb, D)``
    the global vectors in the working dtype; ``words``: the ``(cb, L, D)`` words in the
    working dtype and in ``ops.mm_dtype``; ``mask (cb, L)`` the real words; ``gram``: the
    images' ``regions regions^T`` (working dtype) for the bfloat16 path, else None; calls
    without autograd (``ops.scratch`` set) run :func:`eval_local_projection`, calls with
    it :class:`LocalProjection`; ``keep``: the nodes outlive the block (SAF's training
    statistics), else without autograd they are written into a buffer the next block reuses.
    """
    ib, r, d = regions.shape
    words_work, words_mm = words
    cb, width, _ = words_work.shape
    dtype = img_glob.dtype
    # Raw scores of every word with every region of the block: one GEMM.
    flat = words_mm.reshape(cb * width, d)
    raw = gemm(flat, regions.reshape(ib * r, d), None, ops.low, dtype)
    raw = raw.view(cb, width, ib, r).permute(2, 0, 1, 3)  # (ib, cb, L, R): words query
    attn = attention_weights(raw, query_mask=mask, context_mask=None, lambda_softmax=lambda_softmax)
    attn, words_work = attn.reshape(ib, cb * width, r), words_work.reshape(cb * width, d)
    glob_diff = (img_glob.unsqueeze(1) - cap_glob.unsqueeze(0)).square()
    glob = l2norm(gemm(glob_diff, ops.global_w, ops.global_b, ops.low))  # (ib, cb, S)
    node_mask = torch.cat([mask.new_ones(cb, 1), mask], dim=1)
    if ops.scratch is None:  # with autograd
        attended = attn @ regions  # (ib, cb * L, D)
        local = LocalProjection.apply(attended, words_work, ops.local_w, ops.local_b)
        del attended
        local = l2norm(local.view(ib, cb, width, -1)).masked_fill(~mask.unsqueeze(-1), 0.0)
        return torch.cat([glob.unsqueeze(2), local], dim=2), node_mask
    shape = (ib, cb, width + 1, glob.shape[-1])
    if keep:
        nodes = torch.empty(shape, dtype=ops.mm_dtype, device=glob.device)
    else:  # reused by the next block (fresh memory is paid for in page faults)
        nodes = ops.scratch.take(shape, ops.mm_dtype, glob.device, slot=2)
    nodes[:, :, 0] = glob
    # on CPU the attended vectors of CPU_BLOCK_ELEMENTS at a time (in the caches)
    chunk = max(1, CPU_BLOCK_ELEMENTS // (cb * width * d)) if regions.is_cpu else ib
    local_args = ops.local_w, ops.local_b, ops.scratch, chunk, gram, nodes[:, :, 1:]
    eval_local_projection(attn, regions, words_work, mask, *local_args)
    return nodes, node_mask


@dataclass(frozen=True)
class GraphStep:
    """One SGR step's matrices, prepared once per call.

    ``fused`` stacks ``A = W_k^T W_q``, with ``offset`` the row ``W_q^T b_k``, and ``W_r``
    (``(2 S + 1, S)`` or ``(2 S, S)``) and ``fused_bias`` stacks ``W_k^T b_q``, ``b_q . b_k``
    (with ``offset``) and ``b_r``: one product of the nodes gives each node's edge query ``A
    s_p + W_k^T b_q``, its logit offset ``t_p = (W_q^T b_k) . s_p + b_q . b_k`` and its update
    value ``W_r s_p + b_r``; the first ``S (+ 1)`` rows alone (query and offset) serve the last
    step's global node. ``t_p`` is constant over the keys and cancels in the softmax: calls
    without autograd leave it out (the scores are the same up to rounding), calls with
    autograd keep it so that the logits and the gradients of ``b_k`` are the reference's.
    """

    fused: torch.Tensor
    fused_bias: torch.Tensor

    @property
    def offset(self) -> bool:
        """Whether the logit offset's row is stacked (``2 S + 1`` rows)."""
        return self.fused.shape[0] % 2 == 1


def _weights(step: nn.Module, name: str, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    layer = getattr(step, name)
    assert isinstance(layer, nn.Linear)
    return layer.weight.to(dtype), layer.bias.to(dtype)


def graph_steps(
    steps: Iterable[nn.Module], dtype: torch.dtype, low: bool, offset: bool = True
) -> list[GraphStep]:
    """The :class:`GraphStep` of each SGR step module (``query``, ``key``, ``update``),
    computed in ``dtype``; with ``low`` both matrices are stored in bfloat16; ``offset``: stack
    the logit offset's row (see :class:`GraphStep`)."""
    out = []
    for step in steps:
        (w_q, b_q), (w_k, b_k) = _weights(step, "query", dtype), _weights(step, "key", dtype)
        w_r, b_r = _weights(step, "update", dtype)
        rows, biases = [w_k.T @ w_q], [w_k.T @ b_q]
        if offset:
            rows.append((w_q.T @ b_k).unsqueeze(0))
            biases.append((b_q @ b_k).unsqueeze(0))
        fused, bias = torch.cat([*rows, w_r]), torch.cat([*biases, b_r])
        if low:
            fused, bias = fused.to(torch.bfloat16), bias.to(torch.bfloat16)
        out.append(GraphStep(fused, bias))
    return out


def graph_reasoning(
    nodes: torch.Tensor,
    node_mask: torch.Tensor,
    steps: Sequence[GraphStep],
    dtype: torch.dtype | None = None,
    scratch: Scratch | None = None,
) -> torch.Tensor:
    """SGR (Sec. 3.3, reference ``GraphReasoning``) on ``nodes (ib, cb, K, S)`` with the
    ``(cb, K)`` mask of real nodes; returns the global node (index 0) after the last step, in
    ``dtype`` (default the nodes' dtype).

    Each step ``s_p <- ReLU(W_r sum_q softmax_q(e_pq) s_q + b_r)`` with edge logits ``e_pq =
    (W_q s_p + b_q) . (W_k s_q + b_k)``. Two identities make it one ``S x (2S + 1)`` product
    per node and step: ``e_pq = (A s_p + W_k^T b_q) . s_q + t_p`` with ``t_p = (W_q^T b_k) .
    s_p + b_q . b_k``; and, as each softmax row sums to 1, ``W_r (sum_q P_pq s_q) + b_r =
    sum_q P_pq (W_r s_q + b_r)``. ``t_p`` is constant over the keys ``q`` and cancels in the
    softmax (see :class:`GraphStep` for when it is kept). The same numbers as the reference up
    to rounding. The last step updates the global node alone (the others are not read after
    it).

    With bfloat16 steps (``graph_steps(..., low=True)``) every product runs on bfloat16
    operands with a bfloat16 result: the nodes are converted once (they may come in
    bfloat16), the edge logits come out of their product in bfloat16 and only the softmax runs
    in float32 (``dtype``, float32 at least).

    ``scratch`` (calls without autograd, steps without the offset row): the products go into
    its buffers, the key mask is added (``-inf``) and the softmax is written out (ATen's runs
    element by element over ``K`` of about 15); the same numbers up to rounding.
    """
    if not steps:
        raise ValueError("graph_reasoning needs at least one step")
    mm = steps[0].fused.dtype
    dtype = dtype or nodes.dtype
    nodes = nodes.to(mm)
    key_mask = ~node_mask.unsqueeze(-2)  # (cb, 1, K)
    size = nodes.shape[-1]
    soft = torch.promote_types(dtype, torch.float32)
    low_value = torch.finfo(soft).min
    if scratch is not None:
        # additive key mask, own softmax: ATen's runs element by element at K of about 15
        key_bias = torch.zeros(key_mask.shape, dtype=soft, device=nodes.device)
        key_bias.masked_fill_(key_mask, float("-inf"))

    def weights(query: torch.Tensor, offset: torch.Tensor | None, keys: torch.Tensor):
        logits = (query @ keys.transpose(-1, -2)).to(soft)
        if offset is not None:
            logits = logits.add_(offset.to(soft))
        if scratch is None:
            return torch.softmax(logits.masked_fill_(key_mask, low_value), dim=-1).to(mm)
        logits = logits.add_(key_bias)
        logits = logits.sub_(logits.amax(dim=-1, keepdim=True)).exp_()
        return logits.div_(logits.sum(dim=-1, keepdim=True)).to(mm)

    if scratch is not None:
        return _eval_graph_reasoning(nodes, steps, weights, scratch).to(dtype)
    for k, step in enumerate(steps):
        head = size + 1 if step.offset else size  # the query's (and offset's) rows
        if k == len(steps) - 1:  # the global node's query, offset and update only
            glob = nodes[:, :, :1].contiguous()  # a strided F.linear input batches the weight
            both = F.linear(glob, step.fused[:head], step.fused_bias[:head])
            offset = both[..., size:] if step.offset else None
            mixed = weights(both[..., :size], offset, nodes) @ nodes
            mixed = F.linear(mixed, step.fused[head:], step.fused_bias[head:])
            return F.relu(mixed[:, :, 0]).to(dtype)
        both = F.linear(nodes, step.fused, step.fused_bias)  # (ib, cb, K, 2 S (+ 1))
        offset = both[..., size:head] if step.offset else None
        nodes = F.relu(weights(both[..., :size], offset, nodes) @ both[..., head:])
    raise AssertionError("unreachable")


def _eval_graph_reasoning(
    nodes: torch.Tensor,
    steps: Sequence[GraphStep],
    weights: Callable[[torch.Tensor, torch.Tensor | None, torch.Tensor], torch.Tensor],
    scratch: Scratch,
) -> torch.Tensor:
    """:func:`graph_reasoning`'s steps without autograd (no offset rows), each product
    written into a buffer the next block reuses (fresh memory is paid for in page faults),
    the ReLU in place. ``weights(query, None, keys)``: the edge weights of ``query``'s nodes
    over the ``keys``."""
    ib, cb, k, size = nodes.shape
    for step in steps[:-1]:
        both = scratch.take((ib, cb, k, 2 * size), nodes.dtype, nodes.device, slot=3)
        rows = both.view(-1, 2 * size)
        torch.addmm(step.fused_bias, nodes.view(-1, size), step.fused.T, out=rows)
        edge = weights(both[..., :size], None, nodes).view(-1, k, k)
        nodes = scratch.take(nodes.shape, nodes.dtype, nodes.device, slot=4)
        torch.bmm(edge, both[..., size:].reshape(-1, k, size), out=nodes.view(-1, k, size))
        nodes = nodes.relu_()
    step = steps[-1]  # the global node's query and update only
    query = F.linear(nodes[:, :, :1].contiguous(), step.fused[:size], step.fused_bias[:size])
    mixed = weights(query, None, nodes) @ nodes
    return F.relu_(F.linear(mixed[:, :, 0], step.fused[size:], step.fused_bias[size:]))


__all__ = [
    "PRECISIONS",
    "GraphStep",
    "LocalProjection",
    "Operands",
    "Scratch",
    "batch_norm",
    "block_nodes",
    "gemm",
    "graph_reasoning",
    "graph_steps",
    "l2norm",
    "eval_local_projection",
    "linear",
    "update_running",
]
