"""IMRAM: iterative matching with recurrent attention memory (Chen et al., CVPR 2020).

The model is SCAN's (:class:`~vlret.models.cross_model.RegionEncoder`: one fully connected
layer and an L2 norm on each of the 36 bottom-up-attention regions;
:class:`~vlret.models.cross_model.WordEncoder`: a bi-GRU with its directions averaged and an
L2 norm on each word) plus the memory distillation unit of the authors' release
(HuiChen24/IMRAM ``model.py``): four ``nn.Linear(2D, D)`` layers, ``linear_t2i`` /
``gate_t2i`` for the words' memories and ``linear_i2t`` / ``gate_i2t`` for the regions'. A pair
is matched in ``steps`` (``K``) rounds of SCAN's clipped-L2-norm attention, each round's query
being the previous round's gated memory; the score sums the rounds' mean cosines between the
original fragments and the attended context
(:func:`~vlret.models.matchers.imram_scores.imram_scores`, which scores a block of pairs at
once).

Choices where the release and the paper leave room (the other reading is a setting):

* ``mode`` defaults to ``"full"`` (Full-IMRAM, both directions summed): AdaCL's Table 1 row
  "IMRAM" quotes the Full-IMRAM numbers of the IMRAM paper, while the release's scripts
  (``script/tune_f30k.sh``, ``tune_coco.sh``) train ``--model_mode text_IMRAM``
  (``mode = "text"``).
* ``renorm_memory`` defaults to False: the scripts pass ``--no_IMRAM_norm``, so the memory is
  not L2-normalised after each update and the later rounds' attention logits are dot
  products, not cosines (the release's ``opts.py`` default renormalises).
* ``lambda_softmax`` defaults to 9 (``tune_f30k.sh``; ``tune_coco.sh`` passes 11).
* All four memory layers are always built, whatever ``mode``, as in the release, so the
  parameters of a checkpoint map one to one.

The authors published no trained IMRAM weights (the repository's README links none), so vlret
has no ``import-checkpoint`` for them. The release's ``train_gpus.py`` saves
``{"epoch", "model", "best_rsum", "opt"}`` with ``"model"`` a single state dict of an
``nn.DataParallel`` model, every key prefixed ``module.``; after stripping ``module.`` the
names are this model's but for the encoders' prefixes (``img_enc.fc_local`` for
``image_encoder.fc``, ``txt_enc.embed`` / ``txt_enc.rnn`` for ``text_encoder.embed`` /
``text_encoder.rnn``); the memory layers keep their names. :meth:`IMRAM.reference_names` gives
that mapping, so such a state dict loads by renaming its keys.

Config schema (``vlret.models.build_model``; every key optional, defaults shown)::

    {"kind": "imram", "embed_dim": 1024, "mode": "full",   # text | image | full
     "steps": 3, "lambda_softmax": 9.0, "renorm_memory": False,
     "score_scale": "sum",                                   # sum | mean
     "image": {"in_dim": 2048},
     "text": {"vocab_size": <from build_model(vocab_size=...)>, "word_dim": 300,
              "num_layers": 1, "bidirectional": True, "dropout": 0.0}}
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from ..attention import choice, positive_float, positive_int
from ..cross_model import (
    CROSS_MODEL_DEFAULTS,
    CrossAttentionModel,
    RegionEncoder,
    WordEncoder,
    build_cross_model,
)
from ..pair_scorer import PairScoringModel
from .imram_scores import IMRAM_MODES, imram_scores

#: The valid top-level keys of a ``kind = "imram"`` model config and their defaults.
IMRAM_DEFAULTS: dict[str, Any] = {
    "kind": "imram",
    "embed_dim": 1024,
    "mode": "full",
    "steps": 3,
    "lambda_softmax": 9.0,
    "renorm_memory": False,
    "score_scale": "sum",
    "image": {},
    "text": {},
}
#: ``score_scale``: the release's sum over the steps (and directions), or its mean.
SCORE_SCALES = ("sum", "mean")
#: The memory layers, in the release's names (``SCAN.__init__`` of HuiChen24/IMRAM).
MEMORY_LAYERS = ("linear_t2i", "gate_t2i", "linear_i2t", "gate_i2t")


class IMRAM(CrossAttentionModel):
    """SCAN's encoders and IMRAM's recurrent attention memory; a pair scorer.

    ``forward(batch)`` gives the ``(B, B)`` scores of a batch (rows images, columns captions);
    :meth:`score` the scores of any two sets, block by block and exactly.

    Args:
        image_encoder: The region encoder.
        text_encoder: The word encoder.
        mode: ``"text"``, ``"image"`` or ``"full"`` (Text-, Image- or Full-IMRAM).
        steps: Matching steps ``K``.
        lambda_softmax: Inverse temperature of the attention softmax.
        renorm_memory: L2-normalise the memory after each update.
        score_scale: ``"sum"`` (the release: the steps' and directions' mean cosines summed,
            in ``[-K, K]``, ``[-2K, 2K]`` for Full-IMRAM) or ``"mean"`` (divided by their
            number, in ``[-1, 1]``; the same ranking). A loss whose margins assume cosine
            scores below 1 needs ``"mean"``: AdaCL's margin update refuses every batch whose
            anchor score is at least 1, so on the summed scale it never updates and its loss
            is 0.
        config: The resolved config the model was built from.

    Raises:
        ValueError: An invalid setting (the message names it).
    """

    def __init__(
        self,
        image_encoder: RegionEncoder,
        text_encoder: WordEncoder,
        *,
        mode: str = "full",
        steps: int = 3,
        lambda_softmax: float = 9.0,
        renorm_memory: bool = False,
        score_scale: str = "sum",
        config: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(image_encoder, text_encoder, config=config)
        self.score_scale = choice(score_scale, "score_scale", SCORE_SCALES)
        self.mode = choice(mode, "mode", IMRAM_MODES)
        self.steps = positive_int(steps, "steps")
        self.lambda_softmax = positive_float(lambda_softmax, "lambda_softmax")
        if not isinstance(renorm_memory, bool):
            raise ValueError(f"renorm_memory: must be true or false, got {renorm_memory!r}")
        self.renorm_memory = renorm_memory
        dim = self.embed_dim
        # PyTorch's default Linear initialisation, as the release (no init_weights for these)
        self.linear_t2i = nn.Linear(2 * dim, dim)
        self.gate_t2i = nn.Linear(2 * dim, dim)
        self.linear_i2t = nn.Linear(2 * dim, dim)
        self.gate_i2t = nn.Linear(2 * dim, dim)

    def memory_layers(self) -> dict[str, tuple[nn.Linear, nn.Linear]]:
        """The ``(linear, gate)`` layers per direction, as
        :func:`~vlret.models.matchers.imram_scores.imram_scores` takes them."""
        return {
            "t2i": (self.linear_t2i, self.gate_t2i),
            "i2t": (self.linear_i2t, self.gate_i2t),
        }

    def score(
        self,
        regions: torch.Tensor,
        words: torch.Tensor,
        word_lengths: torch.Tensor,
        *,
        max_elements: int | None = None,
    ) -> torch.Tensor:
        """The ``(n_img, n_cap)`` scores of the pairs (the
        :class:`~vlret.models.pair_scorer.PairScorer` interface), by
        :func:`~vlret.models.matchers.imram_scores.imram_scores` (divided by the number of
        summed terms for ``score_scale = "mean"``)."""
        scores = imram_scores(
            regions,
            words,
            word_lengths,
            memory=self.memory_layers(),
            mode=self.mode,
            steps=self.steps,
            lambda_softmax=self.lambda_softmax,
            renorm_memory=self.renorm_memory,
            max_elements=max_elements,
        )
        if self.score_scale == "mean":
            scores = scores / (self.steps * (2 if self.mode == "full" else 1))
        return scores

    def reference_names(self) -> dict[str, str]:
        """Map the release's checkpoint keys to this model's state-dict names.

        The release saves one ``nn.DataParallel`` state dict (keys prefixed ``module.``):
        ``module.img_enc.fc_local.*`` is ``image_encoder.fc.*``, ``module.txt_enc.*`` is
        ``text_encoder.*`` (``embed``, ``rnn``), and ``module.linear_t2i.*`` (likewise the
        other three memory layers) keeps its name. Covers every entry of
        :meth:`state_dict` exactly once.

        Returns:
            ``{reference key: this model's key}``.
        """
        mapping = {}
        for name in self.state_dict():
            if name.startswith("image_encoder.fc."):
                ref = "img_enc.fc_local." + name.removeprefix("image_encoder.fc.")
            elif name.startswith("text_encoder."):
                ref = "txt_enc." + name.removeprefix("text_encoder.")
            else:
                ref = name
            mapping["module." + ref] = name
        return mapping


def build_imram_model(top: Mapping[str, Any], *, vocab_size: int | None = None) -> PairScoringModel:
    """Build the model of an ``imram`` config (top level merged over :data:`IMRAM_DEFAULTS`).

    The ``image`` and ``text`` sections and ``embed_dim`` are SCAN's and are resolved and
    checked by :func:`~vlret.models.cross_model.build_cross_model`; the resolved config is kept
    as ``model.config``, which ``build_model`` accepts back.

    Args:
        top: The config, its top level already merged over :data:`IMRAM_DEFAULTS`.
        vocab_size: ``len(vocabulary)``; may instead be given as ``text.vocab_size``.

    Returns:
        The :class:`IMRAM` model.

    Raises:
        ValueError: An unknown key, an invalid value (the message names the key), or no
            vocabulary size.
    """
    cfg = copy.deepcopy(dict(top))
    unknown = sorted(set(cfg) - set(IMRAM_DEFAULTS))
    if unknown:
        raise ValueError(
            f"{unknown[0]}: unknown key for an imram model; valid keys: {sorted(IMRAM_DEFAULTS)}"
        )
    cfg = {**copy.deepcopy(IMRAM_DEFAULTS), **cfg}
    # SCAN's encoders, resolved and checked by SCAN's builder (same keys, same messages)
    scan = build_cross_model(
        {**CROSS_MODEL_DEFAULTS["scan"], **{k: cfg[k] for k in ("embed_dim", "image", "text")}},
        vocab_size=vocab_size,
    )
    assert scan.config is not None and isinstance(scan.text_encoder, WordEncoder)
    image, text = scan.image_encoder, scan.text_encoder
    cfg["image"], cfg["text"] = scan.config["image"], scan.config["text"]
    return IMRAM(
        image,
        text,
        mode=cfg["mode"],
        steps=cfg["steps"],
        lambda_softmax=cfg["lambda_softmax"],
        renorm_memory=cfg["renorm_memory"],
        score_scale=cfg["score_scale"],
        config=cfg,
    )


__all__ = ["IMRAM", "IMRAM_DEFAULTS", "MEMORY_LAYERS", "build_imram_model"]
