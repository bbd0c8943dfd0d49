"""The score statistics logged while training and validating: the mean score of the matching
(image, text) pairs and the mean hardest non-matching score (Unified Fig. 4)."""

from __future__ import annotations

import math
from typing import Any

import torch

from .ranks import check_not_empty


def similarity_stats(
    sim: torch.Tensor, *, txt_to_img: Any, pos_mask: torch.Tensor | None = None
) -> dict[str, float]:
    """``pos_sim``, the mean over texts ``j`` of ``sim[txt_to_img[j], j]``, and
    ``hardest_neg_sim``, the mean over every image (row) and text (column) query of its
    highest non-matching score, both in float32 or wider, in the units of ``sim``.

    ``pos_mask (N_img, N_txt)`` marks every pair that is not a negative (a training batch:
    equal image ids); by default the pairs ``(txt_to_img[j], j)``. A query without negatives
    has no hardest one; ``hardest_neg_sim`` is NaN when no query has any.
    """
    if not isinstance(sim, torch.Tensor) or sim.dim() != 2 or not sim.dtype.is_floating_point:
        raise ValueError("sim must be a 2-D floating-point tensor (N_img, N_txt)")
    check_not_empty(sim, "sim", "image (row)", 0)
    check_not_empty(sim, "sim", "text (column)", 1)
    with torch.no_grad():
        sim = sim.float()
        t2i = torch.as_tensor(txt_to_img, dtype=torch.long, device=sim.device)
        if t2i.shape != (sim.shape[1],):
            raise ValueError(f"txt_to_img must have one entry per text ({sim.shape[1]})")
        if pos_mask is None:
            pos_mask = t2i[None, :] == torch.arange(sim.shape[0], device=sim.device)[:, None]
        elif pos_mask.shape != sim.shape:
            raise ValueError(f"pos_mask must have the shape of sim {tuple(sim.shape)}")
        neg = sim.masked_fill(pos_mask, -math.inf)
        hardest = torch.cat([neg.amax(dim=1), neg.amax(dim=0)])
        hardest = hardest[torch.isfinite(hardest)]  # a query without negatives has none
        square = sim.shape[0] == sim.shape[1]
        if square and torch.equal(t2i, torch.arange(sim.shape[1], device=sim.device)):
            # a batch's pairs (j, j): the diagonal view, averaged as the step log always did
            # (a strided view and a gathered copy sum in different orders, the last bit differs)
            positives = sim.diagonal()
        else:
            positives = sim.gather(0, t2i[None, :])
        return {
            "pos_sim": float(positives.mean()),
            "hardest_neg_sim": float(hardest.mean()) if hardest.numel() else float("nan"),
        }


__all__ = ["similarity_stats"]
