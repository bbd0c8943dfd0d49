"""CHAN's reference scoring (ppanzx/CHAN), rewritten step for step from its released code, and
the bare products vlret's block scorer must do (both imported by ``bench_matchers.py`` and the
tests).

:func:`reference_scores` is the release's evaluation: ``lib/evaluation.py`` ``compute_sims``
scores shards of ``SHARD`` images x ``SHARD`` captions, every caption zero-padded to the
longest of the whole set (``encode_data``), each shard through ``SimsEncoder``:
``VHACoding`` (``get_fgsims``: one product of the shard's regions with every padded word,
permuted to ``(images, captions, regions, words)`` and cut to the shard's longest image and
caption; ``get_fgmask``: the region and word masks multiplied into a pair mask; masked entries
set to ``-1``; the max over regions) then ``LSEPooling`` (every aligned score equal to ``-1``
set to ``-inf``, then ``logsumexp(sims / beta)`` over the words). Every image has ``R`` real
regions here, as in the release's evaluation. vlret's ``lse_scale = "cosine"`` (not the
release's) is applied on top: ``beta (S - log m_c)``.

:func:`gemm_bound` runs only the matrix products of vlret's scorer, over its own blocks
(``vlret.models.matchers.chan_score.plan_blocks`` at the default ``max_elements``), into
preallocated outputs: the floor any implementation of these scores pays.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from vlret.models.attention import DEFAULT_MAX_ELEMENTS
from vlret.models.matchers.chan_score import plan_blocks

SHARD = 128
MASK = -1.0


def _get_fgsims(imgs: torch.Tensor, caps: torch.Tensor) -> torch.Tensor:
    bi, n_r, emb = imgs.shape
    bc, n_w, _ = caps.shape
    sims = torch.matmul(imgs.reshape(bi * n_r, emb), caps.reshape(bc * n_w, emb).t())
    return sims.reshape(bi, n_r, bc, n_w).permute(0, 2, 1, 3)


def _get_fgmask(img_lens: torch.Tensor, cap_lens: torch.Tensor) -> torch.Tensor:
    bi, bc = img_lens.shape[0], cap_lens.shape[0]
    max_r, max_w = int(img_lens.max()), int(cap_lens.max())
    mask_i = torch.arange(max_r, device=img_lens.device).expand(bi, max_r)
    mask_i = (mask_i < img_lens.long().unsqueeze(1)).float().unsqueeze(-1).reshape(bi * max_r, 1)
    mask_c = torch.arange(max_w, device=cap_lens.device).expand(bc, max_w)
    mask_c = (mask_c < cap_lens.long().unsqueeze(1)).float().unsqueeze(-1)
    mask_c = mask_c.reshape(bc * max_w, 1).t()
    return torch.matmul(mask_i, mask_c).reshape(bi, max_r, bc, max_w).permute(0, 2, 1, 3)


def forward_sim(imgs, caps, img_lens, cap_lens, beta: float) -> torch.Tensor:
    """``SimsEncoder.forward`` with ``VHACoding`` and ``LSEPooling(beta)`` on one shard."""
    max_r, max_w = int(img_lens.max()), int(cap_lens.max())
    sims = _get_fgsims(imgs, caps)[:, :, :max_r, :max_w]
    mask = _get_fgmask(img_lens, cap_lens).to(sims.dtype)
    sims = sims.masked_fill(mask == 0, MASK)
    sims = sims.max(dim=-2)[0]
    sims[sims == MASK] = -torch.inf
    return torch.logsumexp(sims / beta, dim=-1)


def reference_scores(model, regions, words, word_lengths) -> torch.Tensor:
    """The release's ``compute_sims`` over ``(n_img, R, D)`` regions and ``(n_cap, L, D)``
    words (padding zeroed, as ``encode_data`` stores it), in ``model.beta``'s pooling; with
    ``model.lse_scale == "cosine"`` mapped to vlret's scale. Differentiable."""
    lengths = torch.as_tensor(word_lengths, device=words.device).long()
    real = torch.arange(words.shape[1], device=words.device) < lengths[:, None]
    words = words.masked_fill(~real[..., None], 0.0)
    img_lens = torch.full((regions.shape[0],), regions.shape[1], device=regions.device)
    rows = []
    for i0 in range(0, regions.shape[0], SHARD):
        row = []
        for j0 in range(0, words.shape[0], SHARD):
            row.append(
                forward_sim(
                    regions[i0 : i0 + SHARD],
                    words[j0 : j0 + SHARD],
                    img_lens[i0 : i0 + SHARD],
                    lengths[j0 : j0 + SHARD],
                    model.beta,
                )
            )
        rows.append(torch.cat(row, dim=1))
    scores = torch.cat(rows, dim=0)
    if model.lse_scale == "cosine":
        scores = (scores - torch.log(lengths.to(scores.dtype))) * model.beta
    return scores


def gemm_bound(model, regions, words, word_lengths) -> Callable[[], None]:
    """A closure running the products ``(ib R, D) @ (D, cb top)`` of every block of the
    scorer's plan (no autograd), on preallocated operands, into a preallocated output; in
    bfloat16 where ``model.matmul_precision`` puts the scorer's products there."""
    n_img, n_regions, dim = regions.shape
    lengths = torch.as_tensor(word_lengths).long().sort(descending=True).values.tolist()
    blocks = plan_blocks(n_img, n_regions, lengths, DEFAULT_MAX_ELEMENTS)
    low = model.matmul_precision == "bfloat16" and regions.dtype == torch.float32
    dtype = torch.bfloat16 if low else regions.dtype
    flat = regions.reshape(n_img * n_regions, dim).to(dtype)
    operands = [flat.new_zeros((dim, (c1 - c0) * top)) for c0, c1, top, _ in blocks]
    size = max(min(n_img, ib) * n_regions * (c1 - c0) * top for c0, c1, top, ib in blocks)
    out = flat.new_empty(size)

    def run() -> None:
        for (_, _, _, img_block), cap_t in zip(blocks, operands, strict=True):
            for i0 in range(0, n_img, img_block):
                rows = flat[i0 * n_regions : min(n_img, i0 + img_block) * n_regions]
                torch.mm(
                    rows,
                    cap_t,
                    out=out[: rows.shape[0] * cap_t.shape[1]].view(rows.shape[0], cap_t.shape[1]),
                )

    return run
