"""The matchers of AdaCL Table 1 beyond SCAN, BFAN and SGRAF: IMRAM, CVSE, CHAN and DIME.

Each is a :class:`~vlret.models.pair_scorer.PairScoringModel` (encode the images' and the
captions' tokens once, then score pairs block by block), so the trainer hands its batch score
matrix to a loss's ``from_similarity``, evaluation scores every protocol exactly, and AdaCL's
momentum memory bank (the ``pair_bank`` procedure) applies to it as to SCAN.

* :mod:`~vlret.models.matchers.imram`: IMRAM (Chen et al., CVPR 2020), iterative matching with
  recurrent attention memory.
* :mod:`~vlret.models.matchers.cvse`: CVSE (Wang et al., ECCV 2020), consensus-aware
  visual-semantic embedding; a two-tower model whose scores are one GEMM.
* :mod:`~vlret.models.matchers.chan`: CHAN (Pan et al., CVPR 2023), cross-modal hard aligning,
  with a bi-GRU or a BERT text side (``model.text.kind``).
* :mod:`~vlret.models.matchers.dime`: DIME (Qu et al., SIGIR 2021), dynamic modality
  interaction with routed cells over a frozen BERT text side.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ..pair_scorer import PairScoringModel
from .chan import CHAN_DEFAULTS, build_chan_model
from .cvse import CVSE_DEFAULTS, build_cvse_model
from .dime import DIME_DEFAULTS, build_dime_model
from .imram import IMRAM_DEFAULTS, build_imram_model

#: The ``[model] kind`` values this package builds.
MATCHER_KINDS = ("imram", "cvse", "chan", "dime")

#: Per kind: the valid top-level keys and their defaults (read by ``build_model``).
MATCHER_MODEL_DEFAULTS: dict[str, dict[str, Any]] = {
    "imram": IMRAM_DEFAULTS,
    "cvse": CVSE_DEFAULTS,
    "chan": CHAN_DEFAULTS,
    "dime": DIME_DEFAULTS,
}

_BUILDERS: dict[str, Callable[..., PairScoringModel]] = {
    "imram": build_imram_model,
    "cvse": build_cvse_model,
    "chan": build_chan_model,
    "dime": build_dime_model,
}


def build_matcher_model(
    top: Mapping[str, Any], *, vocab_size: int | None = None
) -> PairScoringModel:
    """Build the model of an ``imram`` / ``cvse`` / ``chan`` / ``dime`` config.

    Args:
        top: The config, its top level already merged over :data:`MATCHER_MODEL_DEFAULTS`
            (``build_model`` does that).
        vocab_size: ``len(vocabulary)`` for a word-embedding text side; may instead be given
            as ``text.vocab_size``.

    Returns:
        The model; ``model.config`` holds the resolved config.

    Raises:
        ValueError: An unknown key or an invalid value (the message names the key).
    """
    return _BUILDERS[top["kind"]](top, vocab_size=vocab_size)


__all__ = ["MATCHER_KINDS", "MATCHER_MODEL_DEFAULTS", "build_matcher_model"]
