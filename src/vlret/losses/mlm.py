"""IRRA's masked language modelling loss (the ``mlm`` of ``--loss_names sdm+mlm+id``; Jiang &
Ye, CVPR 2023, Sec. 3.2, Eq. 3): the cross-entropy of a cross-modal encoder's predictions of the
masked caption tokens.

For the masked positions ``M`` of a batch (every caption's chosen tokens together), the scores
``z_m`` over the vocabulary and the original ids ``y_m``,

    L_mlm = (1 / |M|) sum_{m in M} CE(z_m, y_m),

IRRA's ``CrossEntropyLoss(ignore_index=0)`` over the flattened ``(B * L, V)`` scores: a mean
over the masked tokens of the whole batch (not over the captions). IRRA multiplies it by
``mlm_loss_weight`` (1.0); here the weight is the combination's (``[loss] name =
"sdm+mlm+id"``, ``weights = {sdm = 1.0, mlm = 1.0, id = 1.0}``). The scores come from the
model's IRR encoder (``model.irr``, :mod:`vlret.models.irr`), not from the two embeddings,
which the loss does not read: a training step of the ``"irr"`` procedure passes
``mlm_logits`` and ``mlm_labels`` (positions that are not predicted hold ``-100``).

``reduction="none"`` gives each caption's share of that mean times ``B`` (its masked tokens'
summed cross-entropy times ``B / |M|``), so ``"mean"`` of the ``(B,)`` terms is ``L_mlm`` and
``"sum"`` is ``B L_mlm``. A batch without a masked token gives a zero attached to the scores.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from .._checks import check_embeddings, check_reduction, compute_dtype
from ..similarity import Ids
from ._base import LossCapabilities, PairLoss
from .params import LossParams, normalize_param
from .registry import register_loss

#: The label of a position that is not predicted.
IGNORE_INDEX = -100
#: The step inputs the loss reads (:meth:`MLMLoss.step_inputs`).
MLM_INPUTS = frozenset({"mlm_logits", "mlm_labels"})


@dataclass(frozen=True, kw_only=True)
class MLMParams(LossParams):
    """Parameters of the MLM loss (none besides the reduction; the embeddings are not read)."""

    normalize: bool = normalize_param(False)


def mlm_loss(
    logits: torch.Tensor, labels: torch.Tensor, *, reduction: str = "mean"
) -> torch.Tensor:
    """The cross-entropy over the masked positions (module docstring).

    Args:
        logits: ``(B, L, V)`` scores of every position.
        labels: ``(B, L)`` long, the original id at each masked position, ``-100`` elsewhere.
        reduction: ``"mean"`` (IRRA's value), ``"sum"`` or ``"none"`` (the ``(B,)`` terms).

    Returns:
        The reduced loss, or the per-caption terms.

    Raises:
        ValueError: Shapes that disagree, labels outside ``[0, V)`` (besides ``-100``).
    """
    check_reduction(reduction)
    if logits.dim() != 3 or labels.shape != logits.shape[:2]:
        raise ValueError(
            f"mlm_logits must be (B, L, V) and mlm_labels (B, L), got {tuple(logits.shape)} and "
            f"{tuple(labels.shape)}"
        )
    if labels.is_floating_point():
        raise ValueError(f"mlm_labels must hold integer ids, got dtype {labels.dtype}")
    vocab = logits.shape[2]
    kept = labels != IGNORE_INDEX
    if bool(((labels[kept] < 0) | (labels[kept] >= vocab)).any()):
        raise ValueError(f"mlm_labels must be ids in [0, {vocab}) or -100")
    batch = logits.shape[0]
    scores = logits.to(compute_dtype(logits.dtype))
    ce = F.cross_entropy(
        scores.reshape(-1, vocab), labels.reshape(-1).long(), reduction="none"
    ).reshape(labels.shape)
    count = int(kept.sum())
    per_caption = (ce * kept).sum(dim=1) * (batch / max(count, 1))
    if count == 0:
        per_caption = per_caption + 0.0 * scores.sum()  # attached to the graph, zero
    if reduction == "none":
        return per_caption
    total = per_caption.sum()
    return total if reduction == "sum" else total / batch


@register_loss("mlm")
class MLMLoss(PairLoss):
    """IRRA's MLM loss (module docstring): ``loss(img_emb, txt_emb, ids, mlm_logits=...,
    mlm_labels=...)``. The embeddings are checked for their batch only; the value is that of
    :func:`mlm_loss`."""

    declared = LossCapabilities(masked_language=True)
    paper = "MLM / IRRA (Jiang & Ye 2023)"
    equation = "IRRA Sec. 3.2 (L_mlm)"
    Params = MLMParams
    config: MLMParams

    def step_inputs(self) -> frozenset[str]:
        """``mlm_logits`` and ``mlm_labels``: the IRR encoder's scores and the masked ids."""
        return MLM_INPUTS

    def forward(
        self,
        img_emb: torch.Tensor,
        txt_emb: torch.Tensor,
        img_ids: Ids | None = None,
        txt_ids: Ids | None = None,
        *,
        shard: tuple[int, int] | None = None,
        mlm_logits: torch.Tensor | None = None,
        mlm_labels: torch.Tensor | None = None,
        **inputs: Any,
    ) -> torch.Tensor:
        """The MLM loss of a batch (the embeddings fix only the batch size).

        Raises:
            ValueError: ``mlm_logits`` or ``mlm_labels`` missing, of another batch, a
                ``shard`` (the mean runs over the whole batch's masked tokens) or an input the
                loss does not take.
        """
        if inputs:
            raise ValueError(f"loss 'mlm' takes no further inputs, got {sorted(inputs)}")
        check_embeddings(img_emb, txt_emb)
        if shard is not None:
            raise ValueError("loss 'mlm' takes no shard: its mean runs over the batch's tokens")
        if mlm_logits is None or mlm_labels is None:
            raise ValueError(
                "loss 'mlm' needs mlm_logits and mlm_labels: the predictions of IRRA's "
                "cross-modal encoder of the masked captions (model.irr = true, trained by the "
                '"irr" procedure)'
            )
        if mlm_logits.shape[0] != img_emb.shape[0]:
            raise ValueError(
                f"mlm_logits must have one row per pair ({img_emb.shape[0]}), got "
                f"{mlm_logits.shape[0]}"
            )
        return mlm_loss(mlm_logits, mlm_labels, reduction=self.reduction)

    def from_similarity(
        self, sim: torch.Tensor, pos_mask: torch.Tensor | None = None, **inputs: Any
    ) -> torch.Tensor:
        """Not available: the MLM loss scores masked tokens, which a pair scorer has not.

        Raises:
            ValueError: Always.
        """
        raise ValueError(
            "loss 'mlm' scores IRRA's masked caption tokens; a model that scores pairs (SCAN, "
            "SGRAF) has none"
        )


__all__ = ["IGNORE_INDEX", "MLMLoss", "MLMParams", "mlm_loss"]
