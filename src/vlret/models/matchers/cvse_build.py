"""A CVSE config resolved into its parts: the encoders, the concept inputs read from a
``vlret cvse-concepts`` folder, and the checked options (:func:`build_parts`)."""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch

from ..attention import positive_float, positive_int
from ..cross_model import REGION_DEFAULTS, WORD_DEFAULTS, RegionEncoder, WordEncoder
from ..text import resolve_vocab_size
from .cvse_concepts import gen_a_concept
from .cvse_files import (
    CATEGORY_FILE,
    VOCAB_CONCEPTS_FILE,
    find_adjacency_file,
    read_adjacency_pickle,
    read_category_concepts,
    read_vocab_concepts,
)

#: The image section's keys and defaults.
CVSE_IMAGE_DEFAULTS: dict[str, Any] = dict(REGION_DEFAULTS)
#: The text section's keys and defaults: the release drops 40% of the word embeddings.
CVSE_TEXT_DEFAULTS: dict[str, Any] = {**WORD_DEFAULTS, "dropout": 0.4}
#: ``concept_vectors`` values besides a ``.npy`` path.
VECTOR_MODES = ("random", "learned")
#: The seed of the random concept vectors (a rebuilt model draws the same ones).
VECTOR_SEED = 0


class ConceptInputs(NamedTuple):
    """What the model takes from the concept folder.

    Attributes:
        adjacency: ``(C, C)`` processed adjacency (``gen_A_concept``'s ``adj_all``).
        vectors: ``(C, concept_dim)`` concept word vectors.
        learned: Whether the vectors are trained.
        concept_of_id: ``(V,)`` each vocabulary id's concept, -1 for none.
    """

    adjacency: torch.Tensor
    vectors: torch.Tensor
    learned: bool
    concept_of_id: torch.Tensor


def load_concepts(
    folder: Any, *, concept_vectors: Any, concept_dim: int, vocab_size: int
) -> ConceptInputs:
    """Read a concept folder for a model over a ``vocab_size``-word vocabulary.

    Raises:
        FileNotFoundError: The folder or one of its files is missing.
        ValueError: Files that disagree with each other or with the model (the message
            starts with the config key).
    """
    if not isinstance(folder, (str, Path)) or not str(folder):
        raise ValueError(
            f"concepts: the folder written by `vlret cvse-concepts DATA_ROOT --out DIR` is "
            f"required, got {folder!r}"
        )
    root = Path(folder)
    if not root.is_dir():
        raise FileNotFoundError(
            f"concepts: {root} is not a folder (write it with vlret cvse-concepts)"
        )
    try:
        words = read_category_concepts(root / CATEGORY_FILE)
        stats = read_adjacency_pickle(find_adjacency_file(root))
        size, pairs = read_vocab_concepts(root / VOCAB_CONCEPTS_FILE, len(words))
    except ValueError as err:
        raise ValueError(f"concepts: {err}") from None
    c = len(words)
    if stats["nums"].shape[0] != c:
        raise ValueError(
            f"concepts: the adjacency pickle holds {stats['nums'].shape[0]} concepts, "
            f"{CATEGORY_FILE} {c}"
        )
    if size != vocab_size:
        raise ValueError(
            f"concepts: {VOCAB_CONCEPTS_FILE} was written for a vocabulary of {size} words, the "
            f"model's has {vocab_size} (run vlret cvse-concepts with the run's vocabulary)"
        )
    adjacency = torch.from_numpy(gen_a_concept(stats)["adj_all"])
    concept_of_id = torch.full((vocab_size,), -1, dtype=torch.long)
    for index, concept in pairs.items():
        concept_of_id[index] = concept
    vectors, learned = _vectors(concept_vectors, c, concept_dim)
    return ConceptInputs(adjacency, vectors, learned, concept_of_id)


def concepts_vocab_size(folder: Any) -> int | None:
    """The vocabulary size a concept folder's :data:`VOCAB_CONCEPTS_FILE` was written for, or
    None where it cannot be read (the model's build then says why): the stand-in a config
    check builds the model with before the run's vocabulary exists."""
    if not isinstance(folder, (str, Path)) or not str(folder):
        return None
    try:
        data = json.loads((Path(folder) / VOCAB_CONCEPTS_FILE).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    size = data.get("vocab_size") if isinstance(data, dict) else None
    return size if isinstance(size, int) and not isinstance(size, bool) and size > 0 else None


def _vectors(mode: Any, count: int, dim: int) -> tuple[torch.Tensor, bool]:
    if mode in VECTOR_MODES:
        gen = torch.Generator().manual_seed(VECTOR_SEED)
        return torch.randn(count, dim, generator=gen), mode == "learned"
    if not isinstance(mode, (str, Path)) or not str(mode).endswith(".npy"):
        raise ValueError(
            f"concept_vectors: must be one of {list(VECTOR_MODES)} or a .npy file path, "
            f"got {mode!r}"
        )
    path = Path(mode)
    if not path.is_file():
        raise FileNotFoundError(f"concept_vectors: {path} is missing")
    try:
        array = np.load(path, allow_pickle=False)
    except ValueError as err:
        raise ValueError(f"concept_vectors: {path} is not a plain .npy array ({err})") from None
    if array.shape != (count, dim) or not np.issubdtype(array.dtype, np.floating):
        raise ValueError(
            f"concept_vectors: {path} holds {array.dtype} {array.shape}; expected floats "
            f"({count} concepts, concept_dim={dim})"
        )
    if not np.isfinite(array).all():
        raise ValueError(f"concept_vectors: {path} holds NaN or infinite values")
    return torch.from_numpy(array.astype(np.float32)), False


def _section(name: str, given: Any, defaults: dict[str, Any]) -> dict[str, Any]:
    if not isinstance(given, Mapping):
        raise ValueError(f"{name}: must be a dict, got {type(given).__name__}")
    unknown = sorted(set(given) - set(defaults))
    if unknown:
        raise ValueError(
            f"{name}.{unknown[0]}: unknown key for a cvse model; valid keys: {sorted(defaults)}"
        )
    return {**copy.deepcopy(defaults), **copy.deepcopy(dict(given))}


def _share(value: Any, name: str, *, closed: bool = True) -> float:
    """A number in [0, 1] (``closed``) or [0, 1)."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or not (0 <= value <= 1 if closed else 0 <= value < 1):
        bound = "[0, 1]" if closed else "[0, 1)"
        raise ValueError(f"{name}: must be a number in {bound}, got {value!r}")
    return float(value)


def build_parts(
    cfg: dict[str, Any], *, vocab_size: int | None
) -> tuple[RegionEncoder, WordEncoder, ConceptInputs, dict[str, Any]]:
    """Resolve ``cfg`` in place (its ``image`` / ``text`` sections filled in) and build the
    encoders, the concept inputs and the :class:`~vlret.models.matchers.cvse.CVSE` options.

    Raises:
        ValueError: An unknown key or an invalid value (the message names the key).
        FileNotFoundError: A concept file is missing.
    """
    image_cfg = _section("image", cfg["image"], CVSE_IMAGE_DEFAULTS)
    text_cfg = _section("text", cfg["text"], CVSE_TEXT_DEFAULTS)
    text_cfg["vocab_size"] = resolve_vocab_size(text_cfg["vocab_size"], vocab_size, "CVSE's bi-GRU")
    embed_dim = positive_int(cfg["embed_dim"], "embed_dim")
    for key in ("word_dim", "num_layers"):
        positive_int(text_cfg[key], f"text.{key}")
    if not isinstance(text_cfg["bidirectional"], bool):
        raise ValueError(
            f"text.bidirectional: must be true or false, got {text_cfg['bidirectional']!r}"
        )
    image = RegionEncoder(positive_int(image_cfg["in_dim"], "image.in_dim"), embed_dim)
    text = WordEncoder(
        text_cfg["vocab_size"],
        word_dim=text_cfg["word_dim"],
        embed_dim=embed_dim,
        num_layers=text_cfg["num_layers"],
        bidirectional=text_cfg["bidirectional"],
        dropout=_share(text_cfg["dropout"], "text.dropout", closed=False),
    )
    hidden = cfg["gcn_hidden"]
    hidden = embed_dim // 2 if hidden is None else positive_int(hidden, "gcn_hidden")
    if hidden < 1:
        raise ValueError(
            f"gcn_hidden: embed_dim // 2 is 0 for embed_dim={embed_dim}; set gcn_hidden"
        )
    concept_dim = positive_int(cfg["concept_dim"], "concept_dim")
    if isinstance(cfg["concept_vectors"], Path):
        cfg["concept_vectors"] = str(cfg["concept_vectors"])
    if isinstance(cfg["concepts"], Path):
        cfg["concepts"] = str(cfg["concepts"])
    options = {
        "num_regions": positive_int(cfg["num_regions"], "num_regions"),
        "dropout": _share(cfg["dropout"], "dropout", closed=False),
        "gcn_hidden": hidden,
        "concept_temperature": positive_float(cfg["concept_temperature"], "concept_temperature"),
        "concept_label_ratio": _share(cfg["concept_label_ratio"], "concept_label_ratio"),
        "fuse_train": _share(cfg["fuse_train"], "fuse_train"),
        "fuse_eval": _share(cfg["fuse_eval"], "fuse_eval"),
        "weight_fused": _share(cfg["weight_fused"], "weight_fused"),
    }
    concepts = load_concepts(
        cfg["concepts"],
        concept_vectors=cfg["concept_vectors"],
        concept_dim=concept_dim,
        vocab_size=text_cfg["vocab_size"],
    )
    cfg["image"], cfg["text"] = image_cfg, text_cfg
    return image, text, concepts, options


__all__ = [
    "CVSE_IMAGE_DEFAULTS",
    "CVSE_TEXT_DEFAULTS",
    "VECTOR_MODES",
    "ConceptInputs",
    "build_parts",
    "concepts_vocab_size",
    "load_concepts",
]
