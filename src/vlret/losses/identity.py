"""Identity classification (the ID loss of IRRA, Jiang & Ye, CVPR 2023; CMPC's classification
term, Zhang & Lu, ECCV 2018): one linear classifier over the training identities, applied to
both modalities' embeddings.

For pair ``i`` with identity ``c_i`` (``0..num_classes-1``), image embedding ``x_i`` and text
embedding ``y_i``,

    L_id = (1/B) sum_i (CE(W x_i + b, c_i) + CE(W y_i + b, c_i)) / 2,

``CE`` the softmax cross-entropy. Readings (IRRA's ``classifier`` in ``model/build.py`` and its
``compute_id``):

* The classifier is ``nn.Linear(dim, num_classes)`` **with** a bias (``bias=True``), its weights
  drawn from ``N(0, 0.001^2)`` (``init_std``) and its bias zero, shared by the two modalities.
* It classifies the raw embeddings (IRRA's CLS / EOT features before any normalisation):
  ``normalize=False`` by default; ``True`` classifies the L2-normalised ones.
* The two sides' cross-entropies are averaged (IRRA's ``(ce_img + ce_txt) / 2``), so the
  per-index term of ``reduction="none"`` is that average and ``"mean"`` is IRRA's value.
  IRRA multiplies it by ``id_loss_weight`` (1.0); here the weight is the combination's
  (``[loss] name = "sdm+id"``, ``weights = {sdm = 1.0, id = 1.0}``).
* CMPC normalises the classifier's weights and classifies the image projected on the text;
  that variant is not implemented (``"cmpm+id"`` is CMPM plus IRRA's plain ID loss).

The loss owns its parameters (the classifier), so it trains with the model (the trainer's
optimiser takes the loss's parameters) and is saved and restored with the checkpoint's ``loss``
state. The ids are the training identities: the trainer passes ``RetrievalBatch.identity``
(person-search data, relabelled ``0..N-1``) or, without identities, the image index (each
training image its own class, as CMPC on Flickr30K). When the config gives neither
``num_classes`` nor ``dim``, the harness fills them from the training set and the model
(:func:`vlret.run.loss_builder.build_run_loss`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .._checks import FLAG, POSITIVE, Number, check_embeddings, compute_dtype
from ..similarity import Ids
from ._base import LossCapabilities, PairLoss, reduce_per_index
from ._tiling import check_shard
from .params import LossParams, normalize_param, param
from .registry import register_loss

_SIZE = Number(integer=True, ge=1, optional=True)


@dataclass(frozen=True, kw_only=True)
class IdentityParams(LossParams):
    """Parameters of the ID loss (defaults: IRRA's classifier)."""

    num_classes: int | None = param(
        None, _SIZE, "training identities (None: filled from the training set)", passed=False
    )
    dim: int | None = param(None, _SIZE, "embedding width (None: the model's)", passed=False)
    bias: bool = param(True, FLAG, "the classifier has a bias (IRRA's nn.Linear)", passed=False)
    init_std: float = param(0.001, POSITIVE, "std of the initial weights (IRRA)", passed=False)
    # IRRA classifies the raw features
    normalize: bool = normalize_param(False)


def identity_loss(
    img_logits: torch.Tensor,
    txt_logits: torch.Tensor,
    img_labels: torch.Tensor,
    txt_labels: torch.Tensor,
    *,
    reduction: str = "mean",
    batch: int | None = None,
) -> torch.Tensor:
    """The two sides' cross-entropies averaged per index, then reduced.

    Args:
        img_logits: ``(n, C)`` class scores of the images.
        txt_logits: ``(n, C)`` class scores of the texts.
        img_labels: ``(n,)`` long, the images' identities.
        txt_labels: ``(n,)`` long, the texts' identities.
        reduction: ``"mean"`` (IRRA's ``compute_id``), ``"sum"`` or ``"none"``.
        batch: What ``"mean"`` divides by (a shard's terms: the whole batch).

    Returns:
        The reduced loss, or the ``(n,)`` per-index terms.
    """
    img_ce = F.cross_entropy(img_logits, img_labels, reduction="none")
    txt_ce = F.cross_entropy(txt_logits, txt_labels, reduction="none")
    return reduce_per_index((img_ce + txt_ce) / 2, reduction, batch)


def _labels(ids: Ids, name: str, batch: int, classes: int, device: torch.device) -> torch.Tensor:
    """``ids`` as a ``(batch,)`` long tensor of identities in ``[0, classes)``.

    Raises:
        ValueError: Missing, of another length, not integers, or out of range, naming ``name``.
    """
    if isinstance(ids, torch.Tensor):
        if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
            raise ValueError(f"{name} must hold integer identities, got dtype {ids.dtype}")
        labels = ids.to(device=device, dtype=torch.long).reshape(-1)
    else:
        values = list(ids)
        bad = next((v for v in values if not isinstance(v, int) or isinstance(v, bool)), None)
        if bad is not None:
            raise ValueError(f"{name} must hold integer identities, got {bad!r}")
        labels = torch.tensor(values, dtype=torch.long, device=device)
    if labels.numel() != batch:
        raise ValueError(f"{name} must have one id per row ({batch}), got {labels.numel()}")
    if batch and (int(labels.min()) < 0 or int(labels.max()) >= classes):
        wrong = int(labels.min()) if int(labels.min()) < 0 else int(labels.max())
        raise ValueError(
            f"{name} must be training identities in [0, {classes}) (num_classes={classes}), "
            f"got {wrong}"
        )
    return labels


@register_loss("id")
class IdentityLoss(PairLoss):
    """Identity classification of both modalities' embeddings (see the module docstring).

    ``loss(img_emb, txt_emb, img_ids=identities, txt_ids=None)``: ``img_ids`` are the pairs'
    training identities (``txt_ids`` defaults to them). The module holds ``classifier``, an
    ``nn.Linear(dim, num_classes)``. ``shard=(start, stop)`` computes only those pairs' terms
    (``"mean"`` still divides by the whole batch), so the loss joins a combination whose other
    parts take local shards (alone it has no tiled form, hence no local shards).

    Built without ``num_classes`` or ``dim`` it has no classifier and its forward raises a
    ``ValueError`` saying which is missing (a training run fills both).
    """

    # no tiled form, so no local shards of its own; its terms are per pair, so it takes a
    # shard inside a combination whose other parts do (``pairwise_terms``)
    declared = LossCapabilities(train_identities=True)
    #: Each pair's term depends on that pair only: ``shard=`` works without tiles.
    pairwise_terms = True
    paper = "ID loss / IRRA (Jiang & Ye 2023), CMPC"
    equation = "IRRA Sec. 3.4 (L_id)"
    Params = IdentityParams
    config: IdentityParams

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        c = self.config
        #: ``nn.Linear(dim, num_classes)``; ``None`` until both sizes are given.
        self.classifier: nn.Linear | None = None
        if c.num_classes is not None and c.dim is not None:
            self.classifier = nn.Linear(c.dim, c.num_classes, bias=c.bias)
            nn.init.normal_(self.classifier.weight, std=c.init_std)
            if self.classifier.bias is not None:
                nn.init.zeros_(self.classifier.bias)

    def _classifier(self) -> nn.Linear:
        if self.classifier is None:
            c = self.config
            missing = " and ".join(n for n in ("num_classes", "dim") if getattr(c, n) is None)
            raise ValueError(
                f"loss 'id' was built without {missing} (the number of training identities, "
                "the embedding width): it has no classifier; a training run fills them from "
                "the training set and the model"
            )
        return self.classifier

    def check_shard(self, shard: tuple[int, int] | None) -> None:
        """Any ``(start, stop)`` inside the batch (the loss has no tiles: each pair's term is
        its own)."""

    def logits(self, emb: torch.Tensor) -> torch.Tensor:
        """The classifier's ``(n, num_classes)`` scores of ``(n, dim)`` embeddings, computed in
        the embeddings' compute dtype (float32 or wider)."""
        dtype = compute_dtype(emb.dtype)
        x = emb.to(dtype)
        if self.normalize:
            x = F.normalize(x, dim=1, eps=1e-8)
        classifier = self._classifier()
        bias = classifier.bias
        return F.linear(x, classifier.weight.to(dtype), None if bias is None else bias.to(dtype))

    def forward(
        self,
        img_emb: torch.Tensor,
        txt_emb: torch.Tensor,
        img_ids: Ids | None = None,
        txt_ids: Ids | None = None,
        *,
        shard: tuple[int, int] | None = None,
        **inputs: Any,
    ) -> torch.Tensor:
        """The ID loss of a batch (see :meth:`PairLoss.forward` for the arguments).

        Raises:
            ValueError: Bad shapes, a width other than ``dim``, ids missing or outside
                ``[0, num_classes)``, a bad ``shard`` or an input the loss does not take.
        """
        if inputs:
            raise ValueError(f"loss 'id' takes no further inputs, got {sorted(inputs)}")
        check_embeddings(img_emb, txt_emb)
        self._classifier()
        batch, width = img_emb.shape
        if width != self.config.dim:
            raise ValueError(f"img_emb must have dim={self.config.dim} columns, got {width}")
        if img_ids is None:
            raise ValueError(
                "loss 'id' needs img_ids: the pairs' training identities (0..num_classes-1)"
            )
        classes = int(self.config.num_classes or 0)
        img_labels = _labels(img_ids, "img_ids", batch, classes, img_emb.device)
        txt_labels = (
            img_labels
            if txt_ids is None
            else _labels(txt_ids, "txt_ids", batch, classes, img_emb.device)
        )
        start, stop = (0, batch) if shard is None else check_shard(shard, batch)
        return identity_loss(
            self.logits(img_emb[start:stop]),
            self.logits(txt_emb[start:stop]),
            img_labels[start:stop],
            txt_labels[start:stop],
            reduction=self.reduction,
            batch=batch,
        )

    def from_similarity(
        self, sim: torch.Tensor, pos_mask: torch.Tensor | None = None, **inputs: Any
    ) -> torch.Tensor:
        """Not available: the ID loss classifies embeddings, which a pair scorer has not.

        Raises:
            ValueError: Always.
        """
        raise ValueError(
            "loss 'id' classifies embeddings; a model that scores pairs (SCAN, SGRAF) has none"
        )


__all__ = ["IdentityLoss", "IdentityParams", "identity_loss"]
