"""VSE-infinity's all-negatives warm-up (``train.all_negatives_epochs``).

VSE-infinity (Chen et al. 2021, Sec. 4; ``vse_mean_warmup_epochs`` in its code) sums the triplet
hinge over all negatives (VSE0) for the first epoch(s), then mines the hardest negative. Its
reason is the collapse the Unified-loss paper describes (Sec. 3.3, Fig. 4): trained
hardest-negative from the start, every cosine sits near the same value and the hardest
negative's gradient vanishes.

A loss takes part when it declares ``LossCapabilities.all_negatives_warmup``: the trainer calls
its :meth:`~vlret.losses.PairLoss.set_all_negatives` at the start of every epoch, and the loss
decides what the two phases mean (the triplet loss sums or mines; GOAL trains on the triplet
sum of hinges with its own margin during the warm-up, as VSE-infinity's code does in the epochs
GOAL's objectives replace; VSL switches its base and keeps ``L_vs``). A loss configured with all
negatives (``hardest = false``) stays so. :mod:`vlret.run.config` refuses the option for any
other loss (:func:`warmup_refusal`); this module imports no config.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..losses import available_losses, loss_capabilities


def warmup_refusal(name: str, params: Mapping[str, Any]) -> str | None:
    """Why the registered loss ``name`` built with ``params`` cannot take the warm-up.

    Args:
        name: A registered loss name.
        params: Its configured constructor parameters (already checked).

    Returns:
        ``None`` when the loss declares ``all_negatives_warmup`` with these parameters, else the
        reason, listing the losses that take a warm-up with their defaults.
    """
    if loss_capabilities(name, params).all_negatives_warmup:
        return None
    given = ", ".join(f"{k}={v!r}" for k, v in params.items())
    which = f"loss {name!r}" + (f" with {given}" if given else "")
    takers = [n for n in available_losses() if loss_capabilities(n).all_negatives_warmup]
    return (
        f"{which} has no hardest-negative phase to warm up; the all-negatives-then-hardest "
        f"schedule applies to {', '.join(takers)} (with their defaults)"
    )


__all__ = ["warmup_refusal"]
