"""The numerical kernels of :class:`~vlret.models.sgraf.SGRAFScorer`: its BatchNorm helpers,
the per-word local projection with a hand-written backward, and the SGR reasoning steps.

Every (image, caption, word) triple costs one ``D -> sim_dim`` projection of its squared
difference vector, the irreducible work of SGRAF scoring; SGR's reasoning adds two
``sim_dim x sim_dim`` products per node and step. These kernels keep the rest (attention,
norms, softmaxes) small beside them. ``low`` (the scorer's ``matmul_precision="bfloat16"``)
runs the per-pair GEMMs with bfloat16 operands and results and float32 accumulation; every
element-wise step stays in the working dtype.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import once_differentiable

from .attention import NORM_EPS

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


def bmm(a: torch.Tensor, b: torch.Tensor, low: bool) -> torch.Tensor:
    """``a @ b`` (batched); with ``low`` on bfloat16 operands, the result left in bfloat16."""
    if not low:
        return a @ b
    return a.to(torch.bfloat16) @ b.to(torch.bfloat16)


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
    three ``D``-sized tensors a word and pair) and recomputes the difference from it.
    ``weight_low``, a bfloat16 copy of ``weight`` (for calls without autograd only), makes
    the product run on bfloat16 operands: ``u`` may then be bfloat16, the norm and the
    difference are taken in ``e``'s dtype and the square is written straight into a
    bfloat16 buffer.
    """

    @staticmethod
    def forward(ctx, u, e, weight, bias, weight_low=None):
        norm = torch.linalg.vector_norm(u, dim=-1, keepdim=True, dtype=e.dtype)
        inv = 1.0 / (norm + NORM_EPS)
        diff = torch.addcmul(e, u, inv, value=-1.0)  # e - u / (|u| + eps); squared below
        ctx.save_for_backward(u, e, weight, inv)
        if weight_low is None:
            return F.linear(diff.square_(), weight, bias)
        sq = torch.square(diff, out=torch.empty_like(diff, dtype=torch.bfloat16))
        del diff
        return F.linear(sq, weight_low).to(e.dtype).add_(bias)

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
        return g_u, g_e, g_w, g_b, None


@dataclass(frozen=True)
class GraphStep:
    """One SGR step's matrices in the working dtype, prepared once per call.

    ``fused`` stacks ``A = W_k^T W_q``, the row ``W_q^T b_k`` and ``W_r`` (``(2 S + 1, S)``)
    and ``fused_bias`` stacks ``W_k^T b_q``, ``b_q . b_k`` and ``b_r``: one product of the
    nodes gives each node's edge query ``A s_p + W_k^T b_q``, its logit offset ``t_p =
    (W_q^T b_k) . s_p + b_q . b_k`` and its update value ``W_r s_p + b_r``; the first
    ``S + 1`` rows alone (query and offset) serve the last step's global node.
    """

    fused: torch.Tensor
    fused_bias: torch.Tensor


def _weights(step: nn.Module, name: str, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    layer = getattr(step, name)
    assert isinstance(layer, nn.Linear)
    return layer.weight.to(dtype), layer.bias.to(dtype)


def graph_steps(steps: Iterable[nn.Module], dtype: torch.dtype, low: bool) -> list[GraphStep]:
    """The :class:`GraphStep` of each SGR step module (``query``, ``key``, ``update``); with
    ``low`` the product matrix is stored in bfloat16."""
    out = []
    for step in steps:
        (w_q, b_q), (w_k, b_k) = _weights(step, "query", dtype), _weights(step, "key", dtype)
        w_r, b_r = _weights(step, "update", dtype)
        fused = torch.cat([w_k.T @ w_q, (w_q.T @ b_k).unsqueeze(0), w_r])
        fused = fused.to(torch.bfloat16) if low else fused
        out.append(GraphStep(fused, torch.cat([w_k.T @ b_q, (b_q @ b_k).unsqueeze(0), b_r])))
    return out


def graph_reasoning(
    nodes: torch.Tensor, node_mask: torch.Tensor, steps: Sequence[GraphStep], low: bool
) -> torch.Tensor:
    """SGR (Sec. 3.3, reference ``GraphReasoning``) on ``nodes (ib, cb, K, S)`` with the
    ``(cb, K)`` mask of real nodes; returns the global node (index 0) after the last step.

    Each step ``s_p <- ReLU(W_r sum_q softmax_q(e_pq) s_q + b_r)`` with edge logits ``e_pq =
    (W_q s_p + b_q) . (W_k s_q + b_k)``. Two identities make it one ``S x (2S + 1)`` product
    per node and step: ``e_pq = (A s_p + W_k^T b_q) . s_q + t_p`` with ``t_p = (W_q^T b_k) .
    s_p + b_q . b_k``; and, as each softmax row sums to 1, ``W_r (sum_q P_pq s_q) + b_r =
    sum_q P_pq (W_r s_q + b_r)``. ``t_p`` is constant over the keys ``q`` and cancels in the
    softmax; it is kept (one column of the product) so that the logits and the gradients of
    ``b_k`` (zero up to rounding) are the reference's. The same numbers as the reference up
    to rounding. The last step updates the global node alone (the others are not read after
    it).
    """
    key_mask = ~node_mask.unsqueeze(-2)  # (cb, 1, K)
    size = nodes.shape[-1]
    low_value = torch.finfo(nodes.dtype).min
    for k, step in enumerate(steps):
        if k == len(steps) - 1:  # the global node's query, offset and update only
            head = size + 1
            both = gemm(nodes[:, :, :1], step.fused[:head], step.fused_bias[:head], low)
            logits = (both[..., :size] @ nodes.transpose(-1, -2)).add_(both[..., size:])
            mixed = torch.softmax(logits.masked_fill_(key_mask, low_value), dim=-1) @ nodes
            mixed = gemm(mixed, step.fused[head:], step.fused_bias[head:], low)
            return F.relu(mixed)[:, :, 0]
        both = gemm(nodes, step.fused, step.fused_bias, low)  # (ib, cb, K, 2 S + 1)
        query, offset, value = both[..., :size], both[..., size : size + 1], both[..., size + 1 :]
        logits = (query @ nodes.transpose(-1, -2)).add_(offset)
        nodes = F.relu(torch.softmax(logits.masked_fill_(key_mask, low_value), dim=-1) @ value)
    raise ValueError("graph_reasoning needs at least one step")


__all__ = [
    "PRECISIONS",
    "GraphStep",
    "LocalProjection",
    "batch_norm",
    "bmm",
    "gemm",
    "graph_reasoning",
    "graph_steps",
    "l2norm",
    "linear",
    "update_running",
]
