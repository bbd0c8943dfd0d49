"""The reference per-caption scoring loops ``bench_cross_attention.py`` times vlret against.

Rewritten here from the algorithms of kuanghuei/SCAN ``xattn_score_t2i``/``xattn_score_i2t``,
CrossmodalGroup/BFAN ``xattn_score`` and Paranioar/SGRAF ``EncoderSimilarity.forward``, step for
step, and run as their evaluations run them (shards of ``SHARD`` images x ``SHARD`` captions).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

SHARD = 128


def _l2norm(x: torch.Tensor, dim: int) -> torch.Tensor:
    return torch.div(x, torch.pow(x, 2).sum(dim=dim, keepdim=True).sqrt() + 1e-8)


def _cosine(x1: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:
    w12 = torch.sum(x1 * x2, 2)
    w1, w2 = torch.norm(x1, 2, 2), torch.norm(x2, 2, 2)
    return (w12 / (w1 * w2).clamp(min=1e-8)).squeeze()


def ref_attention(query, context, lam, focal=None):
    """func_attention, step for step: query (n, q, d), context (n, c, d) -> the attended
    context (n, q, d) as the transposed view the reference returns."""
    n, q, c = query.shape[0], query.shape[1], context.shape[1]
    attn = torch.bmm(context, torch.transpose(query, 1, 2))  # (n, c, q)
    attn = _l2norm(F.leaky_relu(attn, 0.1), 2)  # each context item over the queries
    attn = torch.transpose(attn, 1, 2).contiguous().view(n * q, c)
    attn = torch.softmax(attn * lam, dim=1).view(n, q, c)
    if focal == "equal":  # BFAN: focal_equal, then the kept weights renormalised
        keep = torch.where(attn * c - attn.sum(dim=-1, keepdim=True) > 0, 1.0, 0.0)
        attn = keep * attn
        attn = attn / attn.sum(dim=-1, keepdim=True)
    attn_t = torch.transpose(attn, 1, 2).contiguous()
    weighted = torch.bmm(torch.transpose(context, 1, 2), attn_t)  # (n, d, q)
    return torch.transpose(weighted, 1, 2)


def ref_scan_shard(images, captions, lengths, direction, lam, aggregation, lambda_lse):
    """xattn_score_t2i / xattn_score_i2t on one shard."""
    columns = []
    for i in range(captions.shape[0]):
        cap = captions[i, : lengths[i], :].unsqueeze(0).contiguous()
        cap = cap.repeat(images.shape[0], 1, 1)
        if direction == "t2i":
            rel = _cosine(cap, ref_attention(cap, images, lam).contiguous())
        else:
            rel = _cosine(images, ref_attention(images, cap, lam))
        rel = rel.view(images.shape[0], -1)
        if aggregation == "lse":
            col = torch.log(torch.exp(rel * lambda_lse).sum(dim=1, keepdim=True)) / lambda_lse
        else:
            col = rel.mean(dim=1, keepdim=True)
        columns.append(col)
    return torch.cat(columns, 1)


def ref_bfan_shard(images, captions, lengths, lam):
    """BFAN xattn_score (focal_equal) on one shard: both directions summed."""
    columns = []
    for i in range(captions.shape[0]):
        cap = captions[i, : lengths[i], :].unsqueeze(0).contiguous()
        cap = cap.repeat(images.shape[0], 1, 1)
        t2i = _cosine(cap, ref_attention(cap, images, lam, "equal")).view(images.shape[0], -1)
        i2t = _cosine(images, ref_attention(images, cap, lam, "equal"))
        columns.append(t2i.mean(dim=1, keepdim=True) + i2t.mean(dim=1, keepdim=True))
    return torch.cat(columns, 1)


def sharded(fn: Callable, regions, words, lengths) -> torch.Tensor:
    """The reference evaluation's shard_xattn: 128 x 128 shards, each scored by ``fn``."""
    out = regions.new_zeros(regions.shape[0], words.shape[0])
    lens = lengths.tolist()
    for i0 in range(0, regions.shape[0], SHARD):
        for j0 in range(0, words.shape[0], SHARD):
            out[i0 : i0 + SHARD, j0 : j0 + SHARD] = fn(
                regions[i0 : i0 + SHARD], words[j0 : j0 + SHARD], lens[j0 : j0 + SHARD]
            )
    return out


def ref_sgraf(scorer, regions, words, lengths) -> torch.Tensor:
    """Paranioar/SGRAF EncoderSimilarity.forward (eval mode) with the scorer's weights, read
    through its reference parameter names."""
    ours = dict(scorer.state_dict())
    p = {ref: ours[name] for ref, name in scorer.reference_names("sgr", scorer.sgr_steps).items()}

    def lin(x, name):
        return F.linear(x, p[f"{name}.weight"], p[f"{name}.bias"])

    def bn(x, name):
        return F.batch_norm(
            x,
            p[f"{name}.running_mean"],
            p[f"{name}.running_var"],
            p[f"{name}.weight"],
            p[f"{name}.bias"],
            False,
            0.0,
            1e-5,
        )

    def global_sa(local, side, norm):
        l_emb = lin(local, f"{side}.embedding_local.0")
        g_emb = lin(local.mean(1), f"{side}.embedding_global.0")
        if norm:
            l_emb, g_emb = (
                bn(l_emb, f"{side}.embedding_local.1"),
                bn(g_emb, f"{side}.embedding_global.1"),
            )
        common = torch.tanh(l_emb) * torch.tanh(g_emb).unsqueeze(1)
        weights = torch.softmax(lin(common, f"{side}.embedding_common.0").squeeze(2), dim=1)
        return _l2norm((weights.unsqueeze(2) * local).sum(dim=1), -1)

    n_img = regions.shape[0]
    img_glo = global_sa(regions, "v_global_w", True)
    columns = []
    for i in range(words.shape[0]):
        cap = words[i, : lengths[i]].unsqueeze(0)
        cap_expand = cap.repeat(n_img, 1, 1)
        cap_glo = global_sa(cap, "t_global_w", False)
        context = _l2norm(ref_attention(cap_expand, regions, 9.0), -1)
        sim_loc = _l2norm(lin((context - cap_expand).pow(2), "sim_tranloc_w"), -1)
        sim_glo = _l2norm(lin((img_glo - cap_glo).pow(2), "sim_tranglo_w"), -1)
        nodes = torch.cat([sim_glo.unsqueeze(1), sim_loc], 1)
        for step in range(scorer.sgr_steps):
            query = lin(nodes, f"SGR_module.{step}.graph_query_w")
            key = lin(nodes, f"SGR_module.{step}.graph_key_w")
            edge = torch.softmax(torch.bmm(query, key.transpose(1, 2)), dim=-1)
            nodes = torch.relu(lin(torch.bmm(edge, nodes), f"SGR_module.{step}.sim_graph_w"))
        columns.append(torch.sigmoid(lin(nodes[:, 0, :], "sim_eval_w")))
    return torch.cat(columns, 1)
