"""The two-tower retrieval model and its construction from a plain config dict.

:class:`RetrievalModel` pairs an image (or video) encoder with a text encoder and maps a
:class:`vlret.data.RetrievalBatch` to ``(img_emb, txt_emb)``, both ``(B, embed_dim)`` and not
normalised unless ``normalize=True`` (the losses normalise). It never imports a loss.

:func:`build_model` config schema (every key optional unless marked; defaults shown):

    # VSE-style ("kind": "vse", the default): precomputed features + GRU or BERT text
    {"kind": "vse", "embed_dim": 1024, "normalize": False,
     "image": {"kind": "precomp", "in_dim": 2048, "pooling": "max",   # max | mean | gpo
               "region_dropout": 0.0,
               "gpo_pe_dim": 32, "gpo_hidden": 32, "gpo_temperature": 0.1},
           # or {"kind": "video", "in_dim": 2048, "pooling": "mean", "frame_dropout": 0.0, gpo_*}
           # or pixels through a backbone (vlret.models.backbones), exactly one of path / preset:
           # {"kind": "resnet", "path": DIR | "preset": "resnet-152", "config": {},
           #  "image_size": None}     # or "kind": "vit", "preset": "vit-b-16"
           # or VSE-infinity's WSL grid backbone (vlret.models.grid), a local state dict:
           # {"kind": "resnext-wsl", "path": FILE (required), "config": {}, "image_size": 512,
           #  "pooling": "gpo", "size_augment": True, gpo_*}
           # or USER's SGE-enhanced regions (vlret.models.user_image):
           # {"kind": "user", "in_dim": 2048, "num_regions": 36, "dropout": 0.4,
           #  "attention_lambda": 1.0, "mlp_hidden": None, "pooling": "gpo", gpo_*}
     "text": {"kind": "gru", "vocab_size": <from build_model(vocab_size=...)>,
              "word_dim": 300, "bidirectional": False, "num_layers": 1,
              "pooling": "last",                                      # last | mean | max | gpo
              gpo_*},
           # or {"kind": "bert", "path": DIR (required), "pooling": "cls", gpo_*}
    }
    # shorthand for BERT text: {"kind": "bert", "path": DIR, "image": {...}, "embed_dim": 1024}
    # CLIP fine-tuning (Unified paper B.1.2), or pre-training from random weights:
    {"kind": "clip", "path": DIR | "preset": "ViT-B-32", "config": {}, "tokenizer": None,
     "proj_dim": 768 (None with a preset), "normalize": False, "image_size": None,
     "default_preprocessing": None, "irr": False}
    # Cross-attention pair scorers ("scan", "bfan", "sgraf"): schema in
    # vlret.models.cross_model; they return a score matrix, not a RetrievalModel.
    # The other matchers of AdaCL Table 1 ("imram", "cvse", "chan", "dime"), pair scorers
    # too: schema in vlret.models.matchers.
    # Multi-expert video models ("ce", "mmt"; "experts" required): schema in
    # vlret.models.video_experts.build; also pair scorers.

Every kind also takes ``"scoring": "cosine"`` (or ``"dot"``): how evaluation compares a
two-tower model's embeddings (``model.scoring``; the trainer writes it from the loss's
``normalize``, so a checkpoint evaluates without its loss). Pair scorers score themselves.

A CLIP takes exactly one of ``path`` (a local ``CLIPModel``, :func:`vlret.models.clip.load_clip`)
or ``preset`` (random weights, :func:`vlret.models.clip.build_clip`; ``config``: ``CLIPConfig``
overrides, only with a preset). ``proj_dim`` defaults to 768 with a path (Unified B.1.2) and to
None with a preset (pre-training adds no layer); ``0`` also means None (TOML has no null).
``tokenizer = "bytes"`` (only with a preset) tokenises captions with
:class:`~vlret.models.clip.CLIPByteTokenizer`; otherwise a preset CLIP needs
``data.tokenizer``, a local CLIP tokenizer directory (:func:`vlret.run.builders.build_encoder`).
A local CLIP's images are preprocessed as its saved image processor says
(``processor_config.json`` or ``preprocessor_config.json``, :mod:`vlret.models.clip_folder`); a
folder with neither is refused unless ``default_preprocessing = "openai-clip"`` (OpenAI CLIP's).
``image_size = [height, width]`` (or an int) trains and evaluates the CLIP at that input (IRRA's
person-search ``[384, 128]``): the position embeddings are resampled once to the new patch grid
(random ones for a preset; :mod:`vlret.models.clip_size`); ``None`` keeps the model's square.
``irr = true`` (or a table, :class:`~vlret.models.irr.IRROptions`) adds IRRA's cross-modal
encoder and MLM head as ``model.irr`` (:mod:`vlret.models.irr`), trained by the loss part ``mlm``.
Parameter names: ``image_encoder.vision_model`` / ``.visual_projection`` / ``.embed_proj`` and
``text_encoder.text_model`` / ``.text_projection`` / ``.embed_proj``; a backbone's are
``image_encoder.backbone`` and ``image_encoder.fc`` (``train.freeze``,
``optim.lr_multipliers``).

Unknown keys and kinds raise ``ValueError`` naming the key and listing the valid ones.
``model.config`` holds the resolved config (defaults filled in, ``vocab_size`` included), which
``build_model`` accepts back, e.g. to rebuild a model from a checkpoint.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .backbones import BACKBONE_KINDS, build_backbone_encoder
from .cross_model import CROSS_KINDS, CROSS_MODEL_DEFAULTS, CrossAttentionModel, build_cross_model
from .grid import GRID_KIND, build_grid_encoder
from .image import POOLINGS, ImageEncoder
from .matchers import MATCHER_KINDS, MATCHER_MODEL_DEFAULTS, build_matcher_model
from .pair_scorer import PairScoringModel
from .text import (
    BERT_POOLINGS,
    GRU_POOLINGS,
    BertTextEncoder,
    GRUTextEncoder,
    check_batch,
    resolve_vocab_size,
)
from .user_image import USER_IMAGE_DEFAULTS, USER_IMAGE_KIND, build_user_image_encoder
from .video import VideoEncoder
from .video_experts import (
    VIDEO_EXPERT_KINDS,
    VIDEO_EXPERT_MODEL_DEFAULTS,
    MultiExpertModel,
    build_video_expert_model,
)

_GPO_DEFAULTS = {"gpo_pe_dim": 32, "gpo_hidden": 32, "gpo_temperature": 0.1}

#: Per model kind: the valid top-level keys and their defaults (``...`` marks required).
MODEL_DEFAULTS: dict[str, dict[str, Any]] = {
    "vse": {"kind": "vse", "embed_dim": 1024, "normalize": False, "image": {}, "text": {}},
    "bert": {
        "kind": "bert",
        "path": ...,
        "embed_dim": 1024,
        "normalize": False,
        "image": {},
        "text": {},
    },
    "clip": {
        "kind": "clip",
        "path": None,
        "preset": None,
        "config": {},
        "tokenizer": None,
        "proj_dim": 768,
        "normalize": False,
        "image_size": None,
        "default_preprocessing": None,
        "irr": False,
    },
    **CROSS_MODEL_DEFAULTS,
    **MATCHER_MODEL_DEFAULTS,
    **VIDEO_EXPERT_MODEL_DEFAULTS,
}
IMAGE_DEFAULTS: dict[str, dict[str, Any]] = {
    "precomp": {
        "kind": "precomp",
        "in_dim": 2048,
        "pooling": "max",
        "region_dropout": 0.0,
        **_GPO_DEFAULTS,
    },
    "video": {
        "kind": "video",
        "in_dim": 2048,
        "pooling": "mean",
        "frame_dropout": 0.0,
        **_GPO_DEFAULTS,
    },
    **{
        kind: {"kind": kind, "path": None, "preset": None, "config": {}, "image_size": None}
        for kind in BACKBONE_KINDS
    },
    GRID_KIND: {
        "kind": GRID_KIND,
        "path": ...,
        "config": {},
        "image_size": 512,
        "pooling": "gpo",
        "size_augment": True,
        **_GPO_DEFAULTS,
    },
    USER_IMAGE_KIND: USER_IMAGE_DEFAULTS,
}
TEXT_DEFAULTS: dict[str, dict[str, Any]] = {
    "gru": {
        "kind": "gru",
        "vocab_size": None,
        "word_dim": 300,
        "bidirectional": False,
        "num_layers": 1,
        "pooling": "last",
        **_GPO_DEFAULTS,
    },
    "bert": {"kind": "bert", "path": ..., "pooling": "cls", **_GPO_DEFAULTS},
}
_POOLING_CHOICES = {"image": POOLINGS, "gru": GRU_POOLINGS, "bert": BERT_POOLINGS}


class RetrievalModel(nn.Module):
    """Two encoders into one joint space.

    ``image_encoder(features[, lengths])`` and ``text_encoder(captions, lengths)`` each return
    ``(N, embed_dim)``. ``image_transform`` (CLIP) turns image files or PIL images into the
    encoder's input; ``tokenizer_path`` names the local Hugging Face tokenizer the text encoder
    expects (``None``: a :class:`vlret.data.Vocabulary`).

    Args:
        image_encoder: Image (or video) encoder returning ``(N, embed_dim)``.
        text_encoder: Text encoder returning ``(B, embed_dim)``.
        normalize: L2-normalise both embeddings (the losses normalise anyway).
        image_transform: Turns an image file or PIL image into the image encoder's input.
        tokenizer_path: Local Hugging Face tokenizer the text encoder expects.
        config: The resolved config the model was built from (kept as ``model.config``).

    Raises:
        ValueError: The encoders disagree on ``embed_dim``.
    """

    #: How evaluation scores the embeddings, ``cosine`` or ``dot`` (the spec's ``scoring``).
    scoring: str = "cosine"

    def __init__(
        self,
        image_encoder: nn.Module,
        text_encoder: nn.Module,
        *,
        normalize: bool = False,
        image_transform: Any = None,
        tokenizer_path: str | Path | None = None,
        config: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__()
        dims = (getattr(image_encoder, "embed_dim", None), getattr(text_encoder, "embed_dim", None))
        if None not in dims and dims[0] != dims[1]:
            raise ValueError(
                f"image and text encoders disagree on embed_dim: {dims[0]} vs {dims[1]}"
            )
        self.image_encoder = image_encoder
        self.text_encoder = text_encoder
        self.normalize = bool(normalize)
        self.image_transform = image_transform
        self.tokenizer_path = str(tokenizer_path) if tokenizer_path is not None else None
        self.config = copy.deepcopy(dict(config)) if config is not None else None

    @property
    def embed_dim(self) -> int | None:
        """Width of the joint space, or None when the image encoder does not say."""
        return getattr(self.image_encoder, "embed_dim", None)

    def _out(self, emb: torch.Tensor) -> torch.Tensor:
        return F.normalize(emb, dim=-1) if self.normalize else emb

    def encode_images(
        self, features: torch.Tensor | list[Any], lengths: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Embed images (or videos).

        Args:
            features: ``(N, R, D)`` regions, ``(N, T, D)`` frames, ``(N, D)`` vectors or
                ``(N, 3, H, W)`` pixels; or a list of image paths or PIL images, transformed
                first by the model's ``image_transform``.
            lengths: ``(N,)`` valid regions or frames per row.

        Returns:
            The ``(N, E)`` embeddings.

        Raises:
            ValueError: ``features`` is a list and the model has no ``image_transform``.
        """
        if isinstance(features, (list, tuple)):
            if self.image_transform is None:
                raise ValueError(
                    "features is a list (image paths?) but this model has no image_transform; "
                    "pass tensors, e.g. a dataset built with an image_transform"
                )
            device = next(self.parameters()).device
            features = torch.stack([self.image_transform(f) for f in features]).to(device)
        if lengths is None:
            return self._out(self.image_encoder(features))
        return self._out(self.image_encoder(features, lengths))

    def encode_texts(
        self, captions: torch.Tensor, lengths: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Embed captions.

        Args:
            captions: ``(B, L)`` padded token ids.
            lengths: ``(B,)`` valid tokens per caption.

        Returns:
            The ``(B, E)`` embeddings.
        """
        return self._out(self.text_encoder(captions, lengths))

    def forward(self, batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """Embed a batch's images and captions.

        Args:
            batch: A :class:`vlret.data.RetrievalBatch`.

        Returns:
            ``(img_emb, txt_emb)``, row ``i`` of both from item ``i`` (an image repeated in the
            batch is encoded once per caption).

        Raises:
            ValueError: ``batch`` lacks ``features``, ``captions`` or ``lengths``.
        """
        check_batch(batch)
        return self.encode_images(batch.features), self.encode_texts(batch.captions, batch.lengths)


def _resolve(section: str, given: Any, defaults_by_kind: dict, default_kind: str) -> dict:
    """``given`` merged over the defaults of its kind; unknown kinds or keys raise."""
    if not isinstance(given, Mapping):
        raise ValueError(f"{section} must be a dict, got {type(given).__name__}")
    kind = given.get("kind", default_kind)
    if kind not in defaults_by_kind:
        raise ValueError(
            f"{section}.kind: unknown kind {kind!r}; valid kinds: {sorted(defaults_by_kind)}"
        )
    defaults = defaults_by_kind[kind]
    unknown = sorted(set(given) - set(defaults))
    if unknown:
        raise ValueError(
            f"{section}: unknown key {unknown[0]!r} for kind {kind!r}"
            + (f" (also {unknown[1:]})" if len(unknown) > 1 else "")
            + f"; valid keys: {sorted(defaults)}"
        )
    out = {**copy.deepcopy(defaults), **copy.deepcopy(dict(given)), "kind": kind}
    missing = [k for k, v in out.items() if v is ...]
    if missing:
        raise ValueError(f"{section}: key {missing[0]!r} is required for kind {kind!r}")
    return out


def _check_types(section: str, cfg: dict, pooling_choices: tuple[str, ...] | None) -> None:
    for key, value in cfg.items():
        if key in ("normalize", "bidirectional", "size_augment") and not isinstance(value, bool):
            raise ValueError(f"{section}.{key} must be true or false, got {value!r}")
        if key == "path" and value is not None and not isinstance(value, (str, Path)):
            raise ValueError(f"{section}.path must be a directory path, got {value!r}")
    if pooling_choices is not None and cfg.get("pooling") not in pooling_choices:
        raise ValueError(
            f"{section}.pooling: unknown pooling {cfg.get('pooling')!r}; "
            f"valid: {list(pooling_choices)}"
        )


def _gpo(cfg: dict) -> dict:
    return {k: cfg[k] for k in _GPO_DEFAULTS}


def _build_image(cfg: dict, embed_dim: int) -> nn.Module:
    if cfg["kind"] in BACKBONE_KINDS:
        if cfg["path"] is not None:
            cfg["path"] = str(cfg["path"])
        return build_backbone_encoder(
            cfg["kind"],
            embed_dim=embed_dim,
            path=cfg["path"],
            preset=cfg["preset"],
            config=cfg["config"],
            image_size=cfg["image_size"],
        )
    if cfg["kind"] == GRID_KIND:
        cfg["path"] = str(cfg["path"])
        return build_grid_encoder(
            path=cfg["path"],
            embed_dim=embed_dim,
            config=cfg["config"],
            image_size=cfg["image_size"],
            pooling=cfg["pooling"],
            size_augment=cfg["size_augment"],
            **_gpo(cfg),
        )
    if cfg["kind"] == USER_IMAGE_KIND:
        return build_user_image_encoder(cfg, embed_dim=embed_dim)
    common = dict(in_dim=cfg["in_dim"], embed_dim=embed_dim, pooling=cfg["pooling"], **_gpo(cfg))
    if cfg["kind"] == "video":
        return VideoEncoder(frame_dropout=float(cfg["frame_dropout"]), **common)
    return ImageEncoder(region_dropout=float(cfg["region_dropout"]), **common)


#: How a two-tower model's embeddings are scored at evaluation (the spec's ``scoring``): the
#: cosine of the L2-normalised embeddings, or their raw dot product.
SCORINGS = ("cosine", "dot")


def build_model(
    config: Mapping[str, Any], *, vocab_size: int | None = None
) -> RetrievalModel | CrossAttentionModel | MultiExpertModel | PairScoringModel:
    """:func:`build_model_of` the spec without its ``scoring`` entry, which becomes the
    model's ``scoring`` attribute (``cosine`` by default, or ``dot``): how evaluation compares
    a two-tower model's embeddings (a pair scorer's scores are its own). A spec that names it
    stays in ``model.config``."""
    if not isinstance(config, Mapping):
        raise ValueError(f"config must be a dict, got {type(config).__name__}")
    scoring = config.get("scoring", "cosine")
    if scoring not in SCORINGS:
        raise ValueError(f"scoring: expected one of {', '.join(SCORINGS)}, got {scoring!r}")
    model = build_model_of(
        {k: v for k, v in config.items() if k != "scoring"}, vocab_size=vocab_size
    )
    if isinstance(model, RetrievalModel):
        model.scoring = scoring
        if "scoring" in config and model.config is not None:
            model.config["scoring"] = scoring
    return model


def build_model_of(
    config: Mapping[str, Any], *, vocab_size: int | None = None
) -> RetrievalModel | CrossAttentionModel | MultiExpertModel | PairScoringModel:
    """Build a model from a plain config dict (schema in the module docstring).

    Pretrained weights load from local directories only; ``transformers`` is imported only for
    the ``bert`` and ``clip`` kinds.

    Args:
        config: The ``model`` section of a run config.
        vocab_size: ``len(vocabulary)``, the size of the GRU's word embeddings; it may also be
            given as ``text.vocab_size`` (they must agree).

    Returns:
        A :class:`RetrievalModel`, or for the kinds ``scan``, ``bfan`` and ``sgraf`` a
        :class:`~vlret.models.cross_model.CrossAttentionModel`, for ``ce`` and ``mmt`` a
        :class:`~vlret.models.video_experts.MultiExpertModel`, for ``imram``, ``cvse``,
        ``chan`` and ``dime`` a :class:`~vlret.models.pair_scorer.PairScoringModel`
        (:mod:`vlret.models.matchers`). ``model.config`` holds the
        resolved config, which ``build_model`` accepts back.

    Raises:
        ValueError: An unknown kind or key, a missing required key, a wrongly typed value, or
            a GRU text encoder without a vocabulary size.
    """
    if not isinstance(config, Mapping):
        raise ValueError(f"config must be a dict, got {type(config).__name__}")
    if config.get("kind") in VIDEO_EXPERT_KINDS:  # its own key checks and messages
        return build_video_expert_model(config, vocab_size=vocab_size)
    top = _resolve("model", config, MODEL_DEFAULTS, "vse")
    kind = top["kind"]
    if kind in CROSS_KINDS:
        return build_cross_model(top, vocab_size=vocab_size)
    if kind in MATCHER_KINDS:
        return build_matcher_model(top, vocab_size=vocab_size)
    _check_types("model", top, None)

    image: nn.Module
    text: nn.Module
    if kind == "clip":
        return _build_clip(top, given_proj_dim="proj_dim" in config)

    embed_dim = top["embed_dim"]
    image_cfg = _resolve("image", top["image"], IMAGE_DEFAULTS, "precomp")
    _check_types("image", image_cfg, None if image_cfg["kind"] in BACKBONE_KINDS else POOLINGS)
    text_given = dict(top["text"]) if isinstance(top["text"], Mapping) else top["text"]
    if kind == "bert":
        if isinstance(text_given, dict):
            if text_given.get("kind", "bert") != "bert":
                raise ValueError(
                    f"text.kind is {text_given['kind']!r} but model kind 'bert' sets BERT text"
                )
            if "path" in text_given and str(text_given["path"]) != str(top["path"]):
                raise ValueError("text.path and model path disagree; give the path once")
            text_given = {**text_given, "kind": "bert", "path": top["path"]}
    text_cfg = _resolve("text", text_given, TEXT_DEFAULTS, "gru")
    _check_types("text", text_cfg, _POOLING_CHOICES[text_cfg["kind"]])

    image = _build_image(image_cfg, embed_dim)
    tokenizer_path = None
    if text_cfg["kind"] == "gru":
        size = resolve_vocab_size(text_cfg["vocab_size"], vocab_size, "the GRU text encoder")
        text_cfg["vocab_size"] = size
        text = GRUTextEncoder(
            size,
            word_dim=text_cfg["word_dim"],
            embed_dim=embed_dim,
            bidirectional=text_cfg["bidirectional"],
            num_layers=text_cfg["num_layers"],
            pooling=text_cfg["pooling"],
            **_gpo(text_cfg),
        )
    else:
        text_cfg["path"] = str(text_cfg["path"])
        text = BertTextEncoder(
            text_cfg["path"], embed_dim=embed_dim, pooling=text_cfg["pooling"], **_gpo(text_cfg)
        )
        tokenizer_path = text_cfg["path"]
    if kind == "bert":
        top["path"] = str(top["path"])
    top["image"], top["text"] = image_cfg, text_cfg
    return RetrievalModel(
        image,
        text,
        normalize=top["normalize"],
        image_transform=getattr(image, "transform", None),
        tokenizer_path=tokenizer_path,
        config=top,
    )


def _build_clip(top: dict, *, given_proj_dim: bool) -> RetrievalModel:
    """A CLIP from its local directory or its preset (module docstring)."""
    from .clip import build_clip, load_clip
    from .clip_size import image_size_pair
    from .irr import IRROptions, build_irr

    path, preset = top["path"], top["preset"]
    if (path is None) == (preset is None):
        raise ValueError(
            "model: a CLIP takes exactly one of 'path' (a local CLIP directory) or 'preset' "
            f"(random weights, e.g. 'ViT-B-32'), got {'both' if path is not None else 'neither'}"
        )
    if path is not None and top["config"]:
        raise ValueError(
            "config: CLIPConfig overrides apply to a preset; a local CLIP's config is its "
            "config.json"
        )
    if top["tokenizer"] not in (None, "bytes"):
        raise ValueError(f"tokenizer: expected 'bytes' or none, got {top['tokenizer']!r}")
    if preset is not None and top["default_preprocessing"] is not None:
        raise ValueError("default_preprocessing: is for a local CLIP (path), not a preset")
    if path is not None and top["tokenizer"] is not None:
        raise ValueError("tokenizer: 'bytes' is for a preset; a local CLIP uses its tokenizer")
    if preset is not None and not given_proj_dim:
        top["proj_dim"] = None  # pre-training from scratch adds no layer
    if top["proj_dim"] == 0 and not isinstance(top["proj_dim"], bool):
        top["proj_dim"] = None
    irr = IRROptions.parse(top["irr"])  # checked before any weights are read
    top["irr"] = False if irr is None else irr.as_config()
    size = top["image_size"]
    if size is not None:
        top["image_size"] = size = list(image_size_pair(size))
    if path is not None:
        image, text, transform = load_clip(
            path,
            proj_dim=top["proj_dim"],
            image_size=size,
            default_preprocessing=top["default_preprocessing"],
        )
        top["path"] = str(path)
    else:
        image, text, transform = build_clip(
            preset, config=top["config"], proj_dim=top["proj_dim"], image_size=size
        )
    model = RetrievalModel(
        image,
        text,
        normalize=top["normalize"],
        image_transform=transform,
        tokenizer_path=top["path"],
        config=top,
    )
    if irr is not None:  # IRRA's cross-modal encoder on CLIP's projected tokens
        width = text.text_projection.out_features
        model.irr = build_irr(irr, text.text_model.config, width)
    return model


__all__ = [
    "IMAGE_DEFAULTS",
    "MODEL_DEFAULTS",
    "TEXT_DEFAULTS",
    "SCORINGS",
    "RetrievalModel",
    "build_model",
    "build_model_of",
]
