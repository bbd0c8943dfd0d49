"""Construction of the multi-expert video models from a ``[model]`` config section.

Schema (``vlret.models.build_model``; ``experts`` and, for MMT, ``text.path`` required; other
defaults shown):

    {"kind": "ce", "experts": {"appearance": 2048, "audio": 128, ...},   # name -> input dim
     "embed_dim": 512, "vlad_clusters": {"audio": 16, ...},   # temporal experts via NetVLAD
     "collaborative": True, "cg_reduce": "mean",              # mean | sum
     "text": {"vocab_size": <from build_model(vocab_size=...)>, "word_dim": 300,
              "vlad_clusters": 32}}
    {"kind": "mmt", "experts": {...}, "embed_dim": 512, "num_layers": 4, "num_heads": 4,
     "ff_dim": 3072, "dropout": 0.1, "max_frames": 30,
     "text": {"kind": "bert", "path": DIR, "dropout": 0.1}}

The order of ``experts`` is the model's expert order.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..attention import positive_int
from ..text import resolve_vocab_size
from .ce import CollaborativeExperts
from .common import MultiExpertModel, check_experts
from .mmt import MultiModalTransformer

#: The ``[model] kind`` values this package builds.
VIDEO_EXPERT_KINDS = ("ce", "mmt")

#: Per kind: the valid top-level keys and their defaults (``...`` marks required).
VIDEO_EXPERT_MODEL_DEFAULTS: dict[str, dict[str, Any]] = {
    "ce": {
        "kind": "ce",
        "experts": ...,
        "embed_dim": 512,
        "vlad_clusters": {},
        "collaborative": True,
        "cg_reduce": "mean",
        "text": {},
    },
    "mmt": {
        "kind": "mmt",
        "experts": ...,
        "embed_dim": 512,
        "num_layers": 4,
        "num_heads": 4,
        "ff_dim": 3072,
        "dropout": 0.1,
        "max_frames": 30,
        "text": {},
    },
}
CE_TEXT_DEFAULTS: dict[str, Any] = {"vocab_size": None, "word_dim": 300, "vlad_clusters": 32}
MMT_TEXT_DEFAULTS: dict[str, Any] = {"kind": "bert", "path": ..., "dropout": 0.1}


def _section(name: str, given: Any, defaults: dict[str, Any]) -> dict[str, Any]:
    if not isinstance(given, Mapping):  # "" names the top level
        raise ValueError(f"{name}: must be a table (dict), got {type(given).__name__}")
    prefix = f"{name}." if name else ""
    unknown = sorted(set(given) - set(defaults))
    if unknown:
        raise ValueError(
            f"{prefix}{unknown[0]}: unknown key for this model; valid keys: {sorted(defaults)}"
        )
    out = {**copy.deepcopy(defaults), **copy.deepcopy(dict(given))}
    missing = [k for k, v in out.items() if v is ...]
    if missing:
        raise ValueError(
            f"{prefix}{missing[0]}: required for a {defaults.get('kind', name)!r} model"
        )
    return out


def _bool(value: Any, name: str) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{name}: must be true or false, got {value!r}")
    return value


def build_video_expert_model(
    top: Mapping[str, Any], *, vocab_size: int | None = None
) -> MultiExpertModel:
    """Build the model of a ``ce`` / ``mmt`` config.

    Args:
        top: The ``[model]`` section, its top level already merged over
            :data:`VIDEO_EXPERT_MODEL_DEFAULTS` (``build_model`` does that).
        vocab_size: ``len(vocabulary)`` for CE's word embeddings; may instead be given as
            ``text.vocab_size`` (they must agree). Ignored by MMT (BERT has its own).

    Returns:
        The :class:`~vlret.models.video_experts.CollaborativeExperts` or
        :class:`~vlret.models.video_experts.MultiModalTransformer`; ``model.config`` holds the
        resolved config, which ``build_model`` accepts back.

    Raises:
        ValueError: An unknown key, a missing required key or an invalid value; the message
            starts with the key (``"text.path: required"``).
        ImportError: MMT without ``transformers``.
        FileNotFoundError: MMT's ``text.path`` is not a directory.
    """
    top = copy.deepcopy(dict(top))
    kind = top["kind"]
    if kind not in VIDEO_EXPERT_KINDS:
        raise ValueError(f"kind: {kind!r} is not one of {list(VIDEO_EXPERT_KINDS)}")
    top = _section("", top, VIDEO_EXPERT_MODEL_DEFAULTS[kind])
    top["experts"] = check_experts(top["experts"], "experts")
    embed_dim = positive_int(top["embed_dim"], "embed_dim")
    if kind == "ce":
        text = _section("text", top["text"], CE_TEXT_DEFAULTS)
        text["vocab_size"] = resolve_vocab_size(
            text["vocab_size"], vocab_size, "CE's word embedding"
        )
        clusters = top["vlad_clusters"]
        if not isinstance(clusters, Mapping):
            raise ValueError(f"vlad_clusters: must be a table expert -> clusters, got {clusters!r}")
        top["vlad_clusters"] = dict(clusters)
        top["text"] = text
        return CollaborativeExperts(
            top["experts"],
            vocab_size=text["vocab_size"],
            embed_dim=embed_dim,
            vlad_clusters=top["vlad_clusters"],
            collaborative=_bool(top["collaborative"], "collaborative"),
            cg_reduce=top["cg_reduce"],
            word_dim=positive_int(text["word_dim"], "text.word_dim"),
            text_clusters=positive_int(text["vlad_clusters"], "text.vlad_clusters"),
            config=top,
        )
    text = _section("text", top["text"], MMT_TEXT_DEFAULTS)
    if text["kind"] != "bert":
        raise ValueError(f"text.kind: MMT's text encoder is 'bert', got {text['kind']!r}")
    if not isinstance(text["path"], (str, Path)):
        raise ValueError(f"text.path: must be a directory path, got {text['path']!r}")
    text["path"] = str(text["path"])
    top["text"] = text
    return MultiModalTransformer(
        top["experts"],
        text_path=text["path"],
        embed_dim=embed_dim,
        num_layers=top["num_layers"],
        num_heads=top["num_heads"],
        ff_dim=top["ff_dim"],
        dropout=top["dropout"],
        max_frames=top["max_frames"],
        text_dropout=text["dropout"],
        config=top,
    )


__all__ = [
    "CE_TEXT_DEFAULTS",
    "MMT_TEXT_DEFAULTS",
    "VIDEO_EXPERT_KINDS",
    "VIDEO_EXPERT_MODEL_DEFAULTS",
    "build_video_expert_model",
]
