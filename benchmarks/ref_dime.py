"""DIME's reference scoring loop and the GEMM bound of vlret's DIME block scorer.

:func:`reference_scores` rewrites, step for step, what LgQu/DIME's evaluation runs
(``evaluation.py`` ``calItr``: shards of ``SHARD`` images x ``SHARD`` captions through
``InteractionModule.forward``), with the cells' own loops: GLGC and CMRC loop over the
captions of the shard (``Cells.py`` ``forward_i2t`` / ``forward_t2i``, ``Refinement.py``
``func_attention`` with its bmm / view / transpose), IMRC runs on every (image, caption) slice,
the routers on the local means, the layers aggregate as ``DynamicInteraction.py``, and
``calSim_i2t`` / ``calSim_t2i`` pool and score. The weights are the vlret model's own
(``model.interaction``), read through ``F.linear`` so gradients reach them.

In training mode the release's BatchNorm normalises over the whole batch: the reference then
runs the call as ONE shard with batch statistics (running statistics untouched).

:func:`gemm_bound` is a closure running only the matrix products the block scorer must do,
into preallocated outputs, at the block sizes of ``DIMEInteraction.plan_blocks``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

SHARD = 64  # calItr: 2 x batch_size 32
CELLS = ("ric", "glgc", "imrc", "cmrc")


def _lin(layer: Any, x: torch.Tensor) -> torch.Tensor:
    return F.linear(x, layer.weight, layer.bias)


def _router(cell: Any, x: torch.Tensor) -> torch.Tensor:
    mlp = cell.router.mlp
    return F.relu(torch.tanh(_lin(mlp[2], F.relu(_lin(mlp[0], x.mean(-2))))))


def _self_attention(sa: Any, inp: torch.Tensor) -> torch.Tensor:
    """SelfAttention.forward on (n, L, d) (AttentionLayer: view, transpose, matmul)."""
    n, d, h = inp.size(0), inp.size(-1), sa.heads
    dk = d // h
    q, k, v = (_lin(lin, inp).view(n, -1, h, dk).transpose(1, 2) for lin in sa.att_layer.linears)
    scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(dk)
    x = torch.matmul(F.softmax(scores, dim=-1), v).transpose(1, 2).contiguous().view(n, -1, d)
    y = inp + x
    ff = sa.feed_forward_layer
    return y + _lin(ff.fc2, F.relu(_lin(ff.fc1, y)))


def _imrc(cell: Any, inp: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    p = _router(cell, inp)
    if inp.dim() == 4:
        a, b, n, d = inp.size()
        return _self_attention(cell.sa, inp.view(-1, n, d)).view(a, b, n, -1), p
    return _self_attention(cell.sa, inp), p


def _regulate(cell: Any, l_emb: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    x = F.normalize(_lin(cell.fc_1, l_emb) * g, dim=-2)
    return (1 + x) * l_emb


def _glgc(cell, direction, rgn, img, wrd, stc):
    if direction == "i2t":
        p = _router(cell, rgn)
        n_img, n_rgn = rgn.size(0), rgn.size(-2)
        out = []
        for i in range(stc.size(0)):
            query = rgn[:, i] if rgn.dim() == 4 else rgn
            g = stc[i].unsqueeze(0).unsqueeze(1).expand(n_img, n_rgn, -1)
            out.append(_regulate(cell, query, g).unsqueeze(1))
        return torch.cat(out, dim=1), p
    p = _router(cell, wrd)
    n_img, n_wrd = rgn.size(0), wrd.size(-2)
    out = []
    for i in range(stc.size(0)):
        w = wrd[:, i] if wrd.dim() == 4 else wrd[i].unsqueeze(0).expand(n_img, -1, -1)
        out.append(_regulate(cell, w, img.unsqueeze(1).expand(-1, n_wrd, -1)).unsqueeze(1))
    return torch.cat(out, dim=1), p


def _func_attention(query, context, smooth):
    """Refinement.func_attention with clipped_l2norm: query (n, qL, d), context (n, cL, d)."""
    n, q_len, c_len = query.size(0), query.size(1), context.size(1)
    attn = torch.bmm(context, torch.transpose(query, 1, 2))  # (n, cL, qL)
    attn = F.normalize(F.leaky_relu(attn, 0.1), dim=2)
    attn = torch.transpose(attn, 1, 2).contiguous().view(n * q_len, c_len)
    attn = F.softmax(attn * smooth, dim=-1).view(n, q_len, c_len)
    attn_t = torch.transpose(attn, 1, 2).contiguous()
    weighted = torch.bmm(torch.transpose(context, 1, 2), attn_t)  # (n, d, qL)
    return torch.transpose(weighted, 1, 2)


def _refine(ref: Any, query, context):
    scaling = torch.tanh(_lin(ref.fc_scale, context))
    shifting = _lin(ref.fc_shift, context)
    return _lin(ref.fc_2, F.relu(_lin(ref.fc_1, query * scaling + shifting))) + query


def _cmrc(cell, direction, lam, rgn, wrd, lens):
    ref = cell.refine
    out = []
    if direction == "i2t":
        p = _router(cell, rgn)
        n_img = rgn.size(0)
        for i in range(wrd.size(0)):
            query = rgn[:, i] if rgn.dim() == 4 else rgn
            cap = wrd[i, : int(lens[i])].unsqueeze(0).contiguous().repeat(n_img, 1, 1)
            out.append(_refine(ref, query, _func_attention(query, cap, lam)).unsqueeze(1))
        return torch.cat(out, dim=1), p
    p = _router(cell, wrd)
    n_img = rgn.size(0)
    for i in range(len(lens)):
        cap = wrd[:, i] if wrd.dim() == 4 else wrd[i].unsqueeze(0).repeat(n_img, 1, 1)
        out.append(_refine(ref, cap, _func_attention(cap, rgn, lam)).unsqueeze(1))
    return torch.cat(out, dim=1), p


def _layer0(layer, direction, lam, rgn, img, wrd, stc, lens):
    local = rgn if direction == "i2t" else wrd
    embs, probs = [F.relu(local), None, None, None], [_router(layer.ric, local), None, None, None]
    embs[1], probs[1] = _glgc(layer.glgc, direction, rgn, img, wrd, stc)
    embs[2], probs[2] = _imrc(layer.imrc, local)
    embs[3], probs[3] = _cmrc(layer.cmrc, direction, lam, rgn, wrd, lens)
    gate = (sum(probs) < 1e-4).to(local.dtype)
    allp = torch.stack(probs, dim=2)
    allp = allp / (allp.sum(dim=-1, keepdim=True) + 1e-8)
    out = []
    for i in range(4):
        res = 0
        for j in range(4):
            e = embs[j]
            if direction == "i2t":
                e = e.unsqueeze(1) if e.dim() == 3 else e
                res = res + allp[:, i, j][:, None, None, None] * e
            else:
                e = e.unsqueeze(0) if e.dim() == 3 else e
                res = res + allp[:, i, j][None, :, None, None] * e
        skip = gate[:, i][:, None, None] * embs[0]
        out.append(res + (skip.unsqueeze(1) if direction == "i2t" else skip.unsqueeze(0)))
    return out, allp


def _layer(layer, direction, lam, ref, rgn, img, wrd, stc, lens):
    embs, probs = [F.relu(ref[0]), None, None, None], [_router(layer.ric, ref[0]), None, None, None]
    if direction == "i2t":
        embs[1], probs[1] = _glgc(layer.glgc, direction, ref[1], img, wrd, stc)
        embs[3], probs[3] = _cmrc(layer.cmrc, direction, lam, ref[3], wrd, lens)
    else:
        embs[1], probs[1] = _glgc(layer.glgc, direction, rgn, img, ref[1], stc)
        embs[3], probs[3] = _cmrc(layer.cmrc, direction, lam, rgn, ref[3], lens)
    embs[2], probs[2] = _imrc(layer.imrc, ref[2])
    if layer.paths == 1:
        res, gates = 0, []
        for j in range(4):
            gate = (probs[j] < 1e-4 / 4).to(ref[j].dtype)
            gates.append(gate)
            res = res + probs[j].unsqueeze(-1) * embs[j] + gate.unsqueeze(-1) * ref[j]
        return [res / (sum(gates) + sum(probs)).unsqueeze(-1)], torch.stack(probs, dim=3)
    gate = (sum(probs) < 1e-4).to(ref[0].dtype)
    allp = torch.stack(probs, dim=3)
    allp = allp / (allp.sum(dim=-1, keepdim=True) + 1e-8)
    out = []
    for i in range(4):
        res = 0
        for j in range(4):
            res = res + allp[:, :, i, j][..., None, None] * embs[j]
        out.append(res + gate[:, :, i][..., None, None] * embs[0])
    return out, allp


def _shard_scores(itr, rgn, img, wrd, stc, lens, batch_stats, paths=None):
    """InteractionModule.forward on one shard: the scores (and, into ``paths``, the
    ``(n_img, n_stc, 36)`` path probabilities before the regulariser's mean)."""
    direction, lam = itr.direction, itr.lambda_softmax
    z, p0 = _layer0(itr.dynamic_itr_l0, direction, lam, rgn, img, wrd, stc, lens)
    z, p1 = _layer(itr.dynamic_itr_l1, direction, lam, z, rgn, img, wrd, stc, lens)
    z, p2 = _layer(itr.dynamic_itr_l2, direction, lam, z, rgn, img, wrd, stc, lens)
    z = z[0]
    n_img, n_stc, n_loc, d = z.size()
    if paths is not None:
        if direction == "i2t":
            l0 = p0.contiguous().view(n_img, -1).unsqueeze(1).expand(-1, n_stc, -1)
        else:
            l0 = p0.contiguous().view(n_stc, -1).unsqueeze(0).expand(n_img, -1, -1)
        l1, l2 = p1.view(n_img, n_stc, -1), p2.view(n_img, n_stc, -1)
        paths.append(torch.cat([l0, l1, l2], dim=-1))
    bn = itr.bn
    if batch_stats:
        flat = F.batch_norm(z.view(-1, d), None, None, bn.weight, bn.bias, True, 0.0, bn.eps)
    else:
        flat = F.batch_norm(
            z.view(-1, d), bn.running_mean, bn.running_var, bn.weight, bn.bias, False, 0.0, bn.eps
        )
    z = flat.view(n_img, n_stc, n_loc, d)
    z = F.normalize(z.mean(2) + z.max(2)[0], dim=-1)
    if direction == "i2t":
        return (stc.unsqueeze(0) * z).sum(-1)
    return (img.unsqueeze(1) * z).sum(-1)


def reference_paths(model, regions, words, word_lengths) -> torch.Tensor:
    """The release's ``(n_img, n_cap, 36)`` path probabilities of one training call (one
    shard), in its order: layer 0 (output x cell), layer 1, layer 2."""
    itr = model.interaction
    img, rgn, stc, wrd = regions[:, 0], regions[:, 1:], words[:, 0], words[:, 1:]
    lens = [n - 1 for n in torch.as_tensor(word_lengths).tolist()]
    out: list[torch.Tensor] = []
    _shard_scores(itr, rgn, img, wrd, stc, lens, True, out)
    return out[0]


def reference_scores(model, regions, words, word_lengths, *, shard: int = SHARD) -> torch.Tensor:
    """The release's scores of every encoded image with every encoded caption.

    Args:
        model: A vlret DIME (its ``interaction`` weights and mode are used).
        regions: ``(n_img, 1 + R, D)`` from ``model.encode_images``.
        words: ``(n_cap, 1 + L, D)`` from ``model.encode_texts``.
        word_lengths: ``model.token_lengths`` of the captions.
        shard: Images and captions a shard (evaluation mode).

    Returns:
        The ``(n_img, n_cap)`` scores.
    """
    itr = model.interaction
    img, rgn, stc, wrd = regions[:, 0], regions[:, 1:], words[:, 0], words[:, 1:]
    lens = torch.as_tensor(word_lengths).tolist()
    lens = [n - 1 for n in lens]
    if itr.training:
        return _shard_scores(itr, rgn, img, wrd, stc, lens, True)
    n_img, n_cap = rgn.shape[0], wrd.shape[0]
    rows = []
    for i in range(0, n_img, shard):
        row = []
        for c in range(0, n_cap, shard):
            args = (rgn[i : i + shard], img[i : i + shard], wrd[c : c + shard], stc[c : c + shard])
            row.append(_shard_scores(itr, *args, lens[c : c + shard], False))
        rows.append(torch.cat(row, dim=1))
    return torch.cat(rows, dim=0)


def gemm_bound(model, regions, words, word_lengths) -> Callable[[], None]:
    """A closure running only the matrix products DIME's block scorer must do (evaluation), at
    its block sizes, into preallocated outputs.

    Per call: the CMRC context projections (``fc_scale``, ``fc_shift``; 3 layers) and layer
    0's per-side IMRC (Q, K, V, FFN) and GLGC ``fc_1``. Per block of ``ib`` images x ``cb``
    captions (``P = ib cb`` pairs, ``N`` locals, ``W`` context items): layer 0's CMRC logits,
    its two weighted context sums, ``fc_1`` and ``fc_2``; layers 1 and 2 each GLGC ``fc_1``,
    IMRC's Q, K, V, attention logits and weighted values and FFN, and CMRC's logits, weighted
    sums, ``fc_1`` and ``fc_2`` over the ``P N`` rows. The routers (means of the locals through
    two small layers) are left out: a few thousandths of the work.
    """
    itr = model.interaction
    dtype, dev = regions.dtype, regions.device
    d, hid, heads = itr.dim, itr.imrc_hidden, itr.imrc_heads
    n_img, n_cap = regions.shape[0], words.shape[0]
    r, w = regions.shape[1] - 1, words.shape[1] - 1
    i2t = itr.direction == "i2t"
    bi, bc = itr.plan_blocks(n_img, n_cap, r, w, None)
    n, ctx = (r, w) if i2t else (w, r)
    n_side, n_ctx_side = (n_img, n_cap) if i2t else (n_cap, n_img)
    mat = torch.randn(d, d, dtype=dtype, device=dev)
    up, down = (
        torch.randn(d, hid, dtype=dtype, device=dev),
        torch.randn(hid, d, dtype=dtype, device=dev),
    )
    side = torch.randn(n_side * n, d, dtype=dtype, device=dev)
    ctx_items = torch.randn(n_ctx_side * ctx, d, dtype=dtype, device=dev)
    out_ctx = torch.empty(n_ctx_side * ctx, d, dtype=dtype, device=dev)
    out_side = torch.empty(n_side * n, d, dtype=dtype, device=dev)
    out_side_h = torch.empty(n_side * n, hid, dtype=dtype, device=dev)
    blocks = [
        (min(bi, n_img - i0), min(bc, n_cap - c0))
        for i0 in range(0, n_img, bi)
        for c0 in range(0, n_cap, bc)
    ]
    p_max = bi * bc
    rows = torch.randn(p_max * n, d, dtype=dtype, device=dev)
    out_rows = torch.empty(p_max * n, d, dtype=dtype, device=dev)
    out_hid = torch.empty(p_max * n, hid, dtype=dtype, device=dev)
    hid_rows = torch.randn(p_max * n, hid, dtype=dtype, device=dev)
    dk = d // heads
    q = torch.randn(p_max * heads, n, dk, dtype=dtype, device=dev)
    logits = torch.empty(p_max * heads, n, n, dtype=dtype, device=dev)
    vals = torch.empty(p_max * heads, n, dk, dtype=dtype, device=dev)
    grp = bc if i2t else bi  # the context side of a block: one bmm batch per caption / image
    rest = bi if i2t else bc
    qctx = torch.randn(grp, rest * n, d, dtype=dtype, device=dev)
    kctx = torch.randn(grp, d, ctx, dtype=dtype, device=dev)
    vctx = torch.randn(grp, ctx, d, dtype=dtype, device=dev)
    out_logit = torch.empty(grp, rest * n, ctx, dtype=dtype, device=dev)
    out_sum = torch.empty(grp, rest * n, d, dtype=dtype, device=dev)

    def run() -> None:
        for _ in range(6):  # fc_scale / fc_shift of the context, 3 layers
            torch.mm(ctx_items, mat, out=out_ctx)
        for _ in range(4):  # layer 0 per side: Q, K, V, GLGC fc_1
            torch.mm(side, mat, out=out_side)
        torch.mm(side, up, out=out_side_h)
        torch.mm(out_side_h, down, out=out_side)
        for ib, cb in blocks:
            m = ib * cb * n
            g, k = (cb, ib) if i2t else (ib, cb)
            for layer in range(3):
                torch.bmm(qctx[:g, : k * n], kctx[:g], out=out_logit[:g, : k * n])
                for _ in range(2):
                    torch.bmm(out_logit[:g, : k * n], vctx[:g], out=out_sum[:g, : k * n])
                for _ in range(2):  # CMRC fc_1, fc_2
                    torch.mm(rows[:m], mat, out=out_rows[:m])
                if layer == 0:
                    continue
                for _ in range(4):  # GLGC fc_1, IMRC Q, K, V
                    torch.mm(rows[:m], mat, out=out_rows[:m])
                h = ib * cb * heads
                torch.bmm(q[:h], q[:h].transpose(1, 2), out=logits[:h])
                torch.bmm(logits[:h], q[:h], out=vals[:h])
                torch.mm(rows[:m], up, out=out_hid[:m])
                torch.mm(hid_rows[:m], down, out=out_rows[:m])

    return run


__all__ = ["SHARD", "gemm_bound", "reference_paths", "reference_scores"]
