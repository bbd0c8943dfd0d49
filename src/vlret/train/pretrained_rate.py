"""A start-of-run warning: pretrained CLIP towers trained at a rate meant for new layers.

Unified B.1.2 fine-tunes CLIP ViT-L/14 with Adam at 5e-4 and names no other rate; read
literally (``clip_{unified,vlc}_*_literal``) every pretrained weight trains at 5e-4, 50-100x
the rate CLIP is usually fine-tuned at (1e-5 to 5e-6). A run whose model is a pretrained CLIP
(``model.kind = "clip"`` with a ``model.path`` folder) and whose towers train, whole, at
:data:`PRETRAINED_TOWER_RATE` or more (``optim.lr`` times the tower's
``optim.lr_multipliers`` factor, its longest matching prefix) prints one warning line at its
start (:func:`vlret.train.run_log.run_summary`, so ``vlret train --check`` shows it too). A
tower that never trains (``train.lock``, or ``train.freeze`` for every epoch) is left out; a
shorter ``train.freeze`` phase does not change the rate the tower trains at afterwards. It is
a warning, not an error: the literal reading is a named config.
"""

from __future__ import annotations

from ..run.config import RunConfig

#: The rate at or above which a pretrained CLIP tower's training is warned about.
PRETRAINED_TOWER_RATE = 1e-4
#: The pretrained towers of a CLIP retrieval model, by parameter-name prefix.
CLIP_TOWERS = ("image_encoder.vision_model", "text_encoder.text_model")


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def tower_rate(config: RunConfig, tower: str) -> float:
    """The base learning rate of the parameters under ``tower``: ``optim.lr`` times the factor
    of the longest ``optim.lr_multipliers`` prefix that holds the whole tower (1 without one)."""
    multipliers = config.optim.lr_multipliers or {}
    covering = [p for p in multipliers if _under(tower, p)]
    factor = multipliers[max(covering, key=len)] if covering else 1.0
    return config.optim.lr * factor


def pretrained_rate_warning(config: RunConfig) -> str | None:
    """The warning line (without its ``warning:`` label) for a run that trains pretrained CLIP
    towers at :data:`PRETRAINED_TOWER_RATE` or more, else ``None`` (module doc)."""
    model = config.model
    if model.get("kind") != "clip" or not model.get("path"):
        return None
    tc = config.train
    locked = list(tc.lock or []) + (list(tc.freeze or []) if tc.freeze_epochs >= tc.epochs else [])
    fast = [
        (tower, rate)
        for tower in CLIP_TOWERS
        if not any(_under(tower, m) for m in locked)
        and (rate := tower_rate(config, tower)) >= PRETRAINED_TOWER_RATE
    ]
    if not fast:
        return None
    towers = ", ".join(f"{t} at lr {r:g}" for t, r in fast)
    return (
        f"the pretrained CLIP towers train whole at a rate meant for new layers ({towers}); "
        "CLIP is usually fine-tuned at 1e-5 or below: lower them with optim.lr_multipliers "
        "(the clip_unified_* / clip_vlc_* configs: 0.02), unless this is meant (*_literal)"
    )


__all__ = ["CLIP_TOWERS", "PRETRAINED_TOWER_RATE", "pretrained_rate_warning", "tower_rate"]
