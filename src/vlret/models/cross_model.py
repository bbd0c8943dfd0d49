"""Cross-attention retrieval models: SCAN, BFAN and SGRAF with their reference encoders.

A :class:`CrossAttentionModel` does not embed an image and a caption separately into one
vector each: it keeps the regions and the words, projected and L2-normalised, and scores every
(image, caption) pair from both sets together (:mod:`vlret.models.cross_attention`,
:mod:`vlret.models.sgraf`). A batch therefore yields a ``(B_images, B_texts)`` score matrix,
which the trainer hands to a loss's ``from_similarity``; the model satisfies
:class:`~vlret.models.PairScorer`, which tells the harness so (a two-tower
:class:`~vlret.models.RetrievalModel` does not: it has no ``score``).

The encoders, :class:`RegionEncoder` and :class:`WordEncoder`, are those of the three
reference implementations (kuanghuei/SCAN, CrossmodalGroup/BFAN, Paranioar/SGRAF
``model.py``).

Parameter names follow the references where they can (``image_encoder.fc`` for ``img_enc.fc``,
``text_encoder.embed`` / ``text_encoder.rnn`` for ``txt_enc.embed`` / ``txt_enc.rnn``,
SGRAF's ``txt_enc.cap_rnn``); SGRAF's similarity encoder (``sim_enc``) is ``scorer``, an
:class:`~vlret.models.sgraf.SGRAFScorer` whose own names map through its
``reference_names()``.

Config schema (``vlret.models.build_model``; every key optional, defaults shown):

    {"kind": "scan", "embed_dim": 1024, "direction": "t2i",   # t2i | i2t
     "lambda_softmax": 9.0, "aggregation": "lse",              # lse | mean | max | sum
     "lambda_lse": 6.0, "image": {...}, "text": {...}}
    {"kind": "bfan", "embed_dim": 1024, "focal": "equal",      # equal | prob
     "lambda_softmax": 20.0, "image": {...}, "text": {...}}
    {"kind": "sgraf", "embed_dim": 1024, "module": "sgr",      # sgr | saf
     "sim_dim": 256, "sgr_steps": 3, "lambda_softmax": 9.0, "dropout": 0.4,
     "num_regions": 36,                                   # regions per image (its BatchNorm)
     "matmul_precision": "float32",                       # float32 | bfloat16 (evaluation)
     "image": {...}, "text": {...}}
    image: {"in_dim": 2048}
    text:  {"vocab_size": <from build_model(vocab_size=...)>, "word_dim": 300,
            "num_layers": 1, "bidirectional": True, "dropout": 0.0 (sgraf: 0.4)}
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from . import cross_attention
from .attention import NORM_EPS, choice, positive_float, positive_int
from .image import lengths_to_mask
from .pair_scorer import PairScoringModel
from .sgraf import SGRAFScorer
from .sgraf_ops import PRECISIONS
from .text import check_captions, resolve_vocab_size

#: The ``[model] kind`` values this module builds.
CROSS_KINDS = ("scan", "bfan", "sgraf")
SCAN_DIRECTIONS = ("t2i", "i2t")
SCAN_AGGREGATIONS = ("lse", "mean", "max", "sum")
BFAN_FOCALS = ("equal", "prob")
SGRAF_MODULES = ("sgr", "saf")

#: Per kind: the valid top-level keys and their defaults (read by ``build_model``).
CROSS_MODEL_DEFAULTS: dict[str, dict[str, Any]] = {
    "scan": {
        "kind": "scan",
        "embed_dim": 1024,
        "direction": "t2i",
        "lambda_softmax": 9.0,
        "aggregation": "lse",
        "lambda_lse": 6.0,
        "image": {},
        "text": {},
    },
    "bfan": {
        "kind": "bfan",
        "embed_dim": 1024,
        "focal": "equal",
        "lambda_softmax": 20.0,
        "image": {},
        "text": {},
    },
    "sgraf": {
        "kind": "sgraf",
        "embed_dim": 1024,
        "module": "sgr",
        "sim_dim": 256,
        "sgr_steps": 3,
        "lambda_softmax": 9.0,
        "dropout": 0.4,
        "num_regions": 36,
        "matmul_precision": "float32",
        "image": {},
        "text": {},
    },
}
REGION_DEFAULTS: dict[str, Any] = {"in_dim": 2048}
WORD_DEFAULTS: dict[str, Any] = {
    "vocab_size": None,
    "word_dim": 300,
    "num_layers": 1,
    "bidirectional": True,
    "dropout": 0.0,
}
#: SGRAF's reference text encoder drops 40% of the word-embedding entries in training.
_KIND_WORD_DEFAULTS = {"sgraf": {"dropout": 0.4}}


def l2norm(x: torch.Tensor) -> torch.Tensor:
    """The references' ``l2norm``: ``x / (||x|| + 1e-8)`` over the last dimension.

    Args:
        x: Any tensor.

    Returns:
        ``x`` normalised along its last dimension (a zero vector stays zero).
    """
    return x / (x.square().sum(dim=-1, keepdim=True).sqrt() + NORM_EPS)


def _rate(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
        raise ValueError(f"{name}: must be a dropout rate in [0, 1), got {value!r}")
    return float(value)


class RegionEncoder(nn.Module):
    """Precomputed regions ``(N, R, in_dim)`` -> ``(N, R, embed_dim)``, L2-normalised per region.

    Each region is projected by one fully connected layer ``fc`` (Xavier-uniform weights, zero
    bias, as the references' ``init_weights``) and L2-normalised with :func:`l2norm` (SCAN
    Sec. 3.3; every reference's ``EncoderImagePrecomp``).

    Args:
        in_dim: Feature size of a region.
        embed_dim: Size ``D`` of the projected regions.

    Raises:
        ValueError: A size is not a positive int.
    """

    def __init__(self, in_dim: int = 2048, embed_dim: int = 1024) -> None:
        super().__init__()
        self.in_dim = positive_int(in_dim, "in_dim")
        self.embed_dim = positive_int(embed_dim, "embed_dim")
        self.fc = nn.Linear(in_dim, embed_dim)
        r = math.sqrt(6.0) / math.sqrt(in_dim + embed_dim)  # Xavier-uniform, as the references
        nn.init.uniform_(self.fc.weight, -r, r)
        nn.init.zeros_(self.fc.bias)

    def forward(self, features: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        """Project and normalise every region.

        Args:
            features: ``(N, R, in_dim)`` region features.
            lengths: Regions per image; accepted only when all equal ``R``.

        Returns:
            The ``(N, R, embed_dim)`` region features.

        Raises:
            ValueError: ``features`` is not ``(N, R, in_dim)``, or ``lengths`` varies.
        """
        if not isinstance(features, torch.Tensor) or features.dim() != 3:
            got = tuple(features.shape) if isinstance(features, torch.Tensor) else type(features)
            raise ValueError(
                f"features must be region features (N, R, {self.in_dim}), got {got}; the "
                "cross-attention models need regions, not one vector per image"
            )
        if features.size(-1) != self.in_dim:
            raise ValueError(
                f"features have last dimension {features.size(-1)}; expected in_dim="
                f"{self.in_dim} (shape {tuple(features.shape)})"
            )
        if lengths is not None and bool((torch.as_tensor(lengths) != features.size(1)).any()):
            raise ValueError(
                "lengths: the cross-attention scorers take a fixed number of regions per image "
                f"({features.size(1)} here); variable region counts are not supported"
            )
        return l2norm(self.fc(features.to(self.fc.weight.dtype)))


class WordEncoder(nn.Module):
    """Caption ids ``(N, L)`` with ``lengths`` -> word features ``(N, max(lengths), embed_dim)``.

    Word embeddings (``embed``, uniform in ``[-0.1, 0.1]``, no padding row, as the references),
    a GRU (``rnn``, batch first) over the packed sequence, a bi-GRU's two directions averaged
    (SCAN Sec. 3.4), then each word L2-normalised. Positions at or past a caption's length are
    zero vectors and never depend on the padding ids. SGRAF's text encoder also applies
    dropout 0.4 to the word embeddings in training (``text.dropout``; 0 for SCAN and BFAN,
    whose references have none).

    Args:
        vocab_size: Number of word ids.
        word_dim: Size of the word embeddings.
        embed_dim: Size ``D`` of the word features (the GRU's hidden size).
        num_layers: GRU layers.
        bidirectional: A bi-GRU, its directions averaged.
        dropout: Dropout on the word embeddings in training, in ``[0, 1)``.

    Raises:
        ValueError: A size is not a positive int, ``bidirectional`` is not a bool or
            ``dropout`` lies outside ``[0, 1)``.
    """

    def __init__(
        self,
        vocab_size: int,
        *,
        word_dim: int = 300,
        embed_dim: int = 1024,
        num_layers: int = 1,
        bidirectional: bool = True,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        self.vocab_size = positive_int(vocab_size, "vocab_size")
        self.embed_dim = positive_int(embed_dim, "embed_dim")
        positive_int(word_dim, "word_dim")
        positive_int(num_layers, "num_layers")
        if not isinstance(bidirectional, bool):
            raise ValueError(f"bidirectional: must be true or false, got {bidirectional!r}")
        self.bidirectional = bidirectional
        self.embed = nn.Embedding(vocab_size, word_dim)
        self.dropout = nn.Dropout(_rate(dropout, "dropout"))
        self.rnn = nn.GRU(
            word_dim, embed_dim, num_layers, batch_first=True, bidirectional=bidirectional
        )
        nn.init.uniform_(self.embed.weight, -0.1, 0.1)  # the references' init_weights

    def forward(self, captions: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        """Encode a padded caption batch word by word.

        Args:
            captions: ``(N, L)`` word ids.
            lengths: ``(N,)`` words per caption; None means all ``L``.

        Returns:
            The ``(N, max(lengths), embed_dim)`` word features, zero at padding.

        Raises:
            ValueError: The batch is malformed or an id lies outside the vocabulary.
        """
        captions, lengths = check_captions(captions, lengths)
        if int(captions.max()) >= self.vocab_size or int(captions.min()) < 0:
            raise ValueError(
                f"captions hold ids in {int(captions.min())}..{int(captions.max())}; "
                f"expected 0..{self.vocab_size - 1} (vocab_size {self.vocab_size})"
            )
        width = int(lengths.max())
        words = self.dropout(self.embed(captions[:, :width]))
        packed = pack_padded_sequence(words, lengths.cpu(), batch_first=True, enforce_sorted=False)
        out, _ = self.rnn(packed)
        out, _ = pad_packed_sequence(out, batch_first=True, total_length=width)
        if self.bidirectional:
            out = (out[..., : self.embed_dim] + out[..., self.embed_dim :]) / 2
        mask = lengths_to_mask(lengths.to(out.device), width).unsqueeze(-1)
        return l2norm(out).masked_fill(~mask, 0.0)


class CrossAttentionModel(PairScoringModel):
    """Region and word encoders plus a pair scorer; base of SCAN, BFAN, SGRAF, IMRAM and CHAN.

    ``forward(batch)`` returns the ``(B, B)`` scores of every image of a
    :class:`vlret.data.RetrievalBatch` with every caption (row ``i``, column ``i``: item ``i``'s
    pair); see :class:`~vlret.models.pair_scorer.PairScoringModel`. ``gather_texts`` (the
    trainer's, under torchrun) turns the local words and lengths into those of the whole
    distributed batch, so the result is ``(B_local, B_global)``.

    Args:
        image_encoder: The region encoder.
        text_encoder: The word encoder: a :class:`WordEncoder`, or any module with an
            ``embed_dim`` that maps ``(captions, lengths)`` to zero-padded per-token rows
            (CHAN's BERT side).
        config: The resolved config the model was built from (kept as ``model.config``).

    Raises:
        ValueError: The encoders disagree on ``embed_dim``.
    """

    image_encoder: RegionEncoder
    text_encoder: nn.Module

    def __init__(
        self,
        image_encoder: RegionEncoder,
        text_encoder: nn.Module,
        *,
        config: Mapping[str, Any] | None = None,
    ) -> None:
        if image_encoder.embed_dim != text_encoder.embed_dim:
            raise ValueError(
                "image and text encoders disagree on embed_dim: "
                f"{image_encoder.embed_dim} vs {text_encoder.embed_dim}"
            )
        super().__init__(image_encoder, text_encoder, config=config)

    @property
    def embed_dim(self) -> int:
        """Size ``D`` of the region and word features."""
        return self.image_encoder.embed_dim

    def encode_images(
        self, features: torch.Tensor, lengths: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Encode regions: ``(N, R, in_dim)`` -> ``(N, R, D)``, L2-normalised per region."""
        return self.image_encoder(features, lengths)

    def encode_texts(self, captions: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """Encode captions: ``(N, L)`` ids -> ``(N, max(lengths), D)``, zero at padding."""
        return self.text_encoder(captions, lengths)

    def token_lengths(self, lengths: torch.Tensor) -> torch.Tensor:
        """The rows :meth:`encode_texts` gives per caption: one per word (:class:`PairScorer`)."""
        return torch.as_tensor(lengths)


class SCAN(CrossAttentionModel):
    """Stacked cross attention (Lee et al., ECCV 2018, Sec. 3.1-3.2).

    t2i (words attend over regions, pooled over words) or i2t (regions attend over words,
    pooled over regions); the scores are :func:`~vlret.models.cross_attention.scan_scores`'.

    Args:
        image_encoder: The region encoder.
        text_encoder: The word encoder.
        direction: ``"t2i"`` or ``"i2t"``.
        lambda_softmax: Inverse temperature of the attention softmax.
        aggregation: ``"lse"``, ``"mean"``, ``"max"`` or ``"sum"``.
        lambda_lse: The ``"lse"`` pooling's sharpness.
        config: The resolved config the model was built from.

    Raises:
        ValueError: An unknown option or a non-positive ``lambda_*``.
    """

    def __init__(
        self,
        image_encoder: RegionEncoder,
        text_encoder: WordEncoder,
        *,
        direction: str = "t2i",
        lambda_softmax: float = 9.0,
        aggregation: str = "lse",
        lambda_lse: float = 6.0,
        config: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(image_encoder, text_encoder, config=config)
        self.direction = choice(direction, "direction", SCAN_DIRECTIONS)
        self.aggregation = choice(aggregation, "aggregation", SCAN_AGGREGATIONS)
        self.lambda_softmax = positive_float(lambda_softmax, "lambda_softmax")
        self.lambda_lse = positive_float(lambda_lse, "lambda_lse")

    def score(self, regions, words, word_lengths, *, max_elements=None) -> torch.Tensor:
        return cross_attention.scan_scores(
            regions,
            words,
            word_lengths,
            direction=self.direction,
            lambda_softmax=self.lambda_softmax,
            aggregation=self.aggregation,
            lambda_lse=self.lambda_lse,
            max_elements=max_elements,
        )


class BFAN(CrossAttentionModel):
    """Bidirectional focal attention (Liu et al., ACM MM 2019, Sec. 3).

    The sum of the t2i and i2t focal-attention scores,
    :func:`~vlret.models.cross_attention.bfan_scores`.

    Args:
        image_encoder: The region encoder.
        text_encoder: The word encoder.
        focal: ``"equal"`` or ``"prob"``.
        lambda_softmax: Inverse temperature of the attention softmax.
        config: The resolved config the model was built from.

    Raises:
        ValueError: An unknown ``focal`` or a non-positive ``lambda_softmax``.
    """

    def __init__(
        self,
        image_encoder: RegionEncoder,
        text_encoder: WordEncoder,
        *,
        focal: str = "equal",
        lambda_softmax: float = 20.0,
        config: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(image_encoder, text_encoder, config=config)
        self.focal = choice(focal, "focal", BFAN_FOCALS)
        self.lambda_softmax = positive_float(lambda_softmax, "lambda_softmax")

    def score(self, regions, words, word_lengths, *, max_elements=None) -> torch.Tensor:
        return cross_attention.bfan_scores(
            regions,
            words,
            word_lengths,
            focal=self.focal,
            lambda_softmax=self.lambda_softmax,
            max_elements=max_elements,
        )


class SGRAF(CrossAttentionModel):
    """Similarity graph reasoning or attention filtration (Diao et al., AAAI 2021).

    The learned similarity encoder ``scorer`` (:class:`~vlret.models.sgraf.SGRAFScorer`)
    gives scores in (0, 1). The paper's SGRAF is the average of a trained SGR and a trained
    SAF model (``vlret eval`` ensembles). In training mode the scorer's BatchNorms normalise
    over the images (and pairs) of the call.

    Args:
        image_encoder: The region encoder.
        text_encoder: The word encoder.
        module: ``"sgr"`` or ``"saf"``.
        sim_dim: Size of the similarity nodes.
        sgr_steps: SGR reasoning steps.
        lambda_softmax: Inverse temperature of the word-to-region attention.
        dropout: Dropout of the global attentions in training, in ``[0, 1)``.
        num_regions: The fixed region count of the image BatchNorm (36 BUTD regions in the
            reference).
        matmul_precision: ``"float32"`` or ``"bfloat16"``: the scorer's products in
            evaluation (see :class:`~vlret.models.sgraf.SGRAFScorer`; training computes in
            float32 either way).
        config: The resolved config the model was built from.

    Raises:
        ValueError: An invalid setting (the message names it).
    """

    def __init__(
        self,
        image_encoder: RegionEncoder,
        text_encoder: WordEncoder,
        *,
        module: str = "sgr",
        sim_dim: int = 256,
        sgr_steps: int = 3,
        lambda_softmax: float = 9.0,
        dropout: float = 0.4,
        num_regions: int = 36,
        matmul_precision: str = "float32",
        config: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(image_encoder, text_encoder, config=config)
        self.scorer = SGRAFScorer(
            image_encoder.embed_dim,
            positive_int(sim_dim, "sim_dim"),
            choice(module, "module", SGRAF_MODULES),
            positive_int(sgr_steps, "sgr_steps"),
            lambda_softmax=positive_float(lambda_softmax, "lambda_softmax"),
            dropout=_rate(dropout, "dropout"),
            num_regions=positive_int(num_regions, "num_regions"),
            matmul_precision=choice(matmul_precision, "matmul_precision", PRECISIONS),
        )

    def score(self, regions, words, word_lengths, *, max_elements=None) -> torch.Tensor:
        return self.scorer(regions, words, word_lengths, max_elements=max_elements)


_CLASSES: dict[str, type[CrossAttentionModel]] = {"scan": SCAN, "bfan": BFAN, "sgraf": SGRAF}


def _section(name: str, given: Any, defaults: dict[str, Any]) -> dict[str, Any]:
    if not isinstance(given, Mapping):
        raise ValueError(f"{name}: must be a dict, got {type(given).__name__}")
    unknown = sorted(set(given) - set(defaults))
    if unknown:
        raise ValueError(
            f"{name}.{unknown[0]}: unknown key for a cross-attention model; valid keys: "
            f"{sorted(defaults)}"
        )
    return {**copy.deepcopy(defaults), **copy.deepcopy(dict(given))}


def build_cross_model(
    top: Mapping[str, Any], *, vocab_size: int | None = None
) -> CrossAttentionModel:
    """Build the model of a ``scan`` / ``bfan`` / ``sgraf`` config.

    Resolves the ``image`` and ``text`` sections, checks every value and stores the resolved
    config on the model, which ``build_model`` accepts back.

    Args:
        top: The config, its top level already merged over :data:`CROSS_MODEL_DEFAULTS`
            (``build_model`` does that).
        vocab_size: ``len(vocabulary)``; may instead be given as ``text.vocab_size``.

    Returns:
        The :class:`SCAN`, :class:`BFAN` or :class:`SGRAF` model.

    Raises:
        ValueError: An unknown key, an invalid value (the message names the key), or no
            vocabulary size.
    """
    cfg = copy.deepcopy(dict(top))
    kind = cfg["kind"]
    image_cfg = _section("image", cfg["image"], REGION_DEFAULTS)
    text_cfg = _section("text", cfg["text"], {**WORD_DEFAULTS, **_KIND_WORD_DEFAULTS.get(kind, {})})
    text_cfg["vocab_size"] = resolve_vocab_size(
        text_cfg["vocab_size"], vocab_size, "the word encoder"
    )
    embed_dim = positive_int(cfg["embed_dim"], "embed_dim")
    image = RegionEncoder(positive_int(image_cfg["in_dim"], "image.in_dim"), embed_dim)
    for key in ("word_dim", "num_layers"):
        positive_int(text_cfg[key], f"text.{key}")
    if not isinstance(text_cfg["bidirectional"], bool):
        raise ValueError(
            f"text.bidirectional: must be true or false, got {text_cfg['bidirectional']!r}"
        )
    text = WordEncoder(
        text_cfg["vocab_size"],
        word_dim=text_cfg["word_dim"],
        embed_dim=embed_dim,
        num_layers=text_cfg["num_layers"],
        bidirectional=text_cfg["bidirectional"],
        dropout=_rate(text_cfg["dropout"], "text.dropout"),
    )
    cfg["image"], cfg["text"] = image_cfg, text_cfg
    options = {k: v for k, v in cfg.items() if k not in ("kind", "embed_dim", "image", "text")}
    return _CLASSES[kind](image, text, config=cfg, **options)


__all__ = [
    "BFAN",
    "BFAN_FOCALS",
    "CROSS_KINDS",
    "CROSS_MODEL_DEFAULTS",
    "REGION_DEFAULTS",
    "SCAN",
    "SCAN_AGGREGATIONS",
    "SCAN_DIRECTIONS",
    "SGRAF",
    "SGRAF_MODULES",
    "WORD_DEFAULTS",
    "CrossAttentionModel",
    "RegionEncoder",
    "WordEncoder",
    "build_cross_model",
    "l2norm",
]
