"""Pair scorers of the cross-attention systems: SCAN, BFAN and SGRAF.

Each scores every (image, caption) pair of two sets from region features and word features
together. The inputs are already projected and L2-normalised: ``regions (n_img, R, D)``,
``words (n_cap, L, D)`` and ``word_lengths (n_cap,)``; words at or past a caption's length
never take part.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

#: The reference code's ``l2norm`` adds this to the norm before dividing.
NORM_EPS = 1e-8


def attention_weights(
    raw: torch.Tensor,
    *,
    query_mask: torch.Tensor | None,
    context_mask: torch.Tensor | None,
    lambda_softmax: float,
) -> torch.Tensor:
    """The "clipped l2norm" attention step shared by SCAN, BFAN and SGRAF (SCAN Eq. 1-2).

    ``raw (..., q, c)`` holds the raw scores ``<c_j, q_k>`` of every query item ``k`` with every
    context item ``j``. They go through LeakyReLU (slope 0.1), each context item's scores are
    L2-normalised over the queries (the norm plus :data:`NORM_EPS`, as in the reference
    ``l2norm``), and a softmax over the context with inverse temperature ``lambda_softmax``
    gives the weights ``(..., q, c)``, each row summing to 1.

    ``query_mask (..., q)`` and ``context_mask (..., c)`` (boolean, broadcastable to ``raw``
    without their last dimension, ``True`` = real item) exclude padding: a padded query
    contributes nothing to the norm and a padded context item gets weight 0. A padded query's
    own row is meaningless and must be ignored by the caller.
    """
    scores = F.leaky_relu(raw, negative_slope=0.1)
    if query_mask is not None:
        scores = scores.masked_fill(~query_mask.unsqueeze(-1), 0.0)
    norm = scores.square().sum(dim=-2, keepdim=True).sqrt() + NORM_EPS
    logits = scores / norm * lambda_softmax
    if context_mask is not None:
        logits = logits.masked_fill(~context_mask.unsqueeze(-2), torch.finfo(logits.dtype).min)
    return torch.softmax(logits, dim=-1)


__all__ = ["NORM_EPS", "attention_weights"]
