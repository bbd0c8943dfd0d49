"""VSE-infinity's all-negatives warm-up (``train.all_negatives_epochs``) for the losses built on
the hardest-negative triplet: triplet-HN itself, GOAL and VSL (triplet-HN base).

VSE-infinity (Chen et al. 2021, Sec. 4; ``vse_mean_warmup_epochs`` in its code) sums the triplet
hinge over all negatives (VSE0) for the first epoch(s), then mines the hardest negative. Its
reason is the collapse the Unified-loss paper describes (Sec. 3.3, Fig. 4): trained
hardest-negative from the start, every cosine sits near the same value and the hardest
negative's gradient vanishes. For the two papers built on the hardest-negative triplet:

* **GOAL** re-implements VSE++ and VSE-infinity and "only replace[s] the triplet loss function
  used in the training with gradient objectives" (GOAL 4.3). Its objectives are defined on the
  hardest-negative triplet only (Eq. 3-13), and in VSE-infinity's code the warm-up epoch runs
  the all-negatives hinge, not the hardest-negative loss GOAL replaces. So during the warm-up a
  GOAL run trains on the triplet sum of hinges with GOAL's margin and reduction
  (:class:`AllNegativesWarmup`), and switches to the gradient objective afterwards.
* **VSL** adds ``beta * L_vs`` to a triplet-HN base (Eq. 6). The paper (on SGRAF) mentions no
  warm-up, but where one is asked for, its base switches from all negatives to the hardest
  exactly like the triplet loss; ``L_vs`` (a ranking over all the batch's texts) is the same in
  both phases. A VSL base other than the triplet loss has no hardest-negative switch, so the
  option is refused for it.

With ``hardest = false`` configured (triplet, or VSL's ``base_params``) the loss already uses
all negatives and stays so throughout.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..losses import TripletLoss
from .config import ConfigError, LossConfig

#: The losses that accept ``train.all_negatives_epochs``.
WARMUP_LOSSES: tuple[str, ...] = ("triplet", "goal", "vsl")


def check_all_negatives_warmup(loss: LossConfig, source: str) -> None:
    """Raise a :class:`ConfigError` naming ``train.all_negatives_epochs`` when ``loss`` has no
    hardest-negative phase to warm up."""
    key = "train.all_negatives_epochs"
    if loss.name not in WARMUP_LOSSES:
        raise ConfigError(
            source,
            key,
            "the all-negatives-then-hardest schedule applies to the losses built on the "
            f"hardest-negative triplet ({', '.join(WARMUP_LOSSES)}), not {loss.name!r}",
        )
    if loss.name == "vsl" and loss.params.get("base", "triplet") != "triplet":
        raise ConfigError(
            source,
            key,
            "with loss vsl the schedule switches the triplet base from all negatives to the "
            f"hardest; base {loss.params['base']!r} has no such switch",
        )


def configured_hardest(loss: LossConfig) -> bool:
    """Whether the configured loss mines the hardest negative after the warm-up."""
    if loss.name == "vsl":
        base_params = loss.params.get("base_params") or {}
        return bool(base_params.get("hardest", True))
    if loss.name == "goal":
        return True
    return bool(loss.params.get("hardest", True))  # the triplet default


class AllNegativesWarmup(nn.Module):
    """A GOAL objective preceded by VSE-infinity's warm-up loss.

    While ``hardest`` is False the module returns the triplet sum of hinges over all negatives
    (:func:`vlret.losses.triplet_loss` with ``hardest=False``) with the objective's margin,
    reduction, normalisation and ``chunk_size``; once ``hardest`` is True it is the wrapped
    objective, unchanged. Neither holds state, so checkpoints are those of the bare objective.
    """

    def __init__(self, loss: nn.Module) -> None:
        super().__init__()
        config = getattr(loss, "config", None)
        if config is None or not hasattr(config, "margin"):
            raise ValueError(
                f"loss must be a GoalObjective (with a config margin), got {type(loss).__name__}"
            )
        self.loss = loss
        self.warmup = TripletLoss(
            margin=config.margin,
            hardest=False,
            reduction=config.reduction,
            normalize=loss.normalize,
            chunk_size=loss.chunk_size,
        )
        self.hardest = True
        # The trainer's multi-process switches (local anchors of a tiled loss) read these.
        self.chunk_size = loss.chunk_size
        self.supports_anchors = bool(
            getattr(loss, "supports_anchors", False)
            and getattr(self.warmup, "supports_anchors", False)
        )

    @property
    def active(self) -> nn.Module:
        """The loss in use: the warm-up triplet or the wrapped objective."""
        return self.loss if self.hardest else self.warmup

    def forward(
        self,
        img_emb: torch.Tensor,
        txt_emb: torch.Tensor,
        img_ids: Any = None,
        txt_ids: Any = None,
        **kwargs: Any,
    ) -> torch.Tensor:
        """The active loss on the embeddings; keyword arguments (``anchors=``) pass through."""
        return self.active(img_emb, txt_emb, img_ids, txt_ids, **kwargs)

    def from_similarity(
        self, sim: torch.Tensor, pos_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        return self.active.from_similarity(sim, pos_mask=pos_mask)

    def extra_repr(self) -> str:
        return f"hardest={self.hardest}"


def wrap_for_warmup(loss_fn: nn.Module, loss: LossConfig, all_negatives_epochs: int) -> nn.Module:
    """``loss_fn`` ready for the schedule: a GOAL objective is wrapped in
    :class:`AllNegativesWarmup` when there is a warm-up; anything else is returned as is."""
    if all_negatives_epochs and loss.name == "goal":
        return AllNegativesWarmup(loss_fn)
    return loss_fn


def set_all_negatives(loss_fn: nn.Module, loss: LossConfig, *, all_negatives: bool) -> None:
    """Switch ``loss_fn`` (built from ``loss``, wrapped by :func:`wrap_for_warmup`) to all
    negatives or, when the configured loss mines it, to the hardest negative."""
    if not configured_hardest(loss):
        return
    target = loss_fn.base if loss.name == "vsl" else loss_fn
    if not hasattr(target, "hardest"):
        raise ValueError(
            f"{type(target).__name__} has no hardest-negative switch for train.all_negatives_epochs"
        )
    target.hardest = not all_negatives


__all__ = [
    "WARMUP_LOSSES",
    "AllNegativesWarmup",
    "check_all_negatives_warmup",
    "configured_hardest",
    "set_all_negatives",
    "wrap_for_warmup",
]
