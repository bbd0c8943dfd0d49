"""CLIP_benchmark's result records, so vlret's results merge with that suite's tables.

CLIP_benchmark (LAION-AI/CLIP_benchmark) writes one JSON file per evaluation,
``{"dataset", "model", "pretrained", "task", "metrics", "language"}``: ``model`` is the
architecture (open_clip's name, ``ViT-B-32`` or ``ViT-B-32-quickgelu``), ``pretrained`` the
weights (a tag or a checkpoint path), ``metrics`` a flat dictionary of fractions. Its ``build``
step reads every file, puts each one's ``metrics`` beside its other keys in one row (and
``model_fullname`` = ``model + " " + pretrained``) and writes one CSV of all rows. vlret writes
both of its tasks that way:

* ``zeroshot_classification`` (``vlret zeroshot --json``,
  :meth:`vlret.eval.zeroshot.ZeroShotResult.record`): ``acc1``, ``acc5``,
  ``mean_per_class_recall``; ``dataset`` names the set, an image folder by its folder
  (``imagefolder/category``, :func:`vlret.eval.zeroshot.classification_set_name`).
* ``zeroshot_retrieval`` (``vlret eval --json-format clip_benchmark``,
  :func:`retrieval_record`): ``image_retrieval_recall@K`` and ``text_retrieval_recall@K`` for
  K = 1, 5, 10; ``dataset`` is the protocol (``f30k``, ``coco5k``, ``msrvtt-1ka``), with the
  split when it is not the paper's test split (``coco5k/dev``).

Both put the architecture in ``model`` (:func:`architecture_name`) and the checkpoint path or
model folder in ``pretrained``, and add a ``vlret`` object saying what was scored (protocol,
split, sizes), which ``build`` carries as one more column.

**What the recalls mean.** CLIP_benchmark's ``image_retrieval_recall@K`` is text-to-image: the
fraction of captions whose own image is among the K images scoring highest against it;
``text_retrieval_recall@K`` is image-to-text: the fraction of images with at least one of
their captions among the K captions scoring highest ("any correct caption in top K", the way
CLIP-style papers count it). These are vlret's ``t2i_rK`` and ``i2t_rK`` (an image's rank is its
best caption's) divided by 100, so ``image_retrieval_recall@5 = t2i_r5 / 100`` and
``text_retrieval_recall@5 = i2t_r5 / 100``; a video stands for the image under MSR-VTT, and the
COCO 5-fold 1K protocol averages its five equal folds. One difference remains: vlret counts a
tie with the ground truth against the query, while CLIP_benchmark's ``torch.topk`` breaks ties
in an unspecified order; with float scores of trained models ties do not occur and the two
agree (the tests compute CLIP_benchmark's definition independently and compare).

Not written in this format, refused in one line: person search (its relevance is the person's
identity, not the caption's own image, so the numbers would not mean what the column says),
the approximate shortlist protocol and the non-standard re-scorings (a merged table could not
tell them from the standard evaluation).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import nn

from .._modules import unwrap_model
from .pipeline import Evaluation
from .protocols import EvalProtocol, get_protocol
from .scorers import EnsembleScorer, PairModelScorer, Scorer, TwoTowerScorer

#: The ``task`` of a retrieval record.
TASK_RETRIEVAL = "zeroshot_retrieval"
#: The cut-offs a retrieval record reports (CLIP_benchmark's ``--recall_k 1 5 10``).
RECALL_KS = (1, 5, 10)
#: The ``--json-format`` choices of ``vlret eval``: vlret's own record, or CLIP_benchmark's.
JSON_FORMATS = ("vlret", "clip_benchmark")
#: open_clip's ViT sizes: (vision width, vision layers) -> (letter, text width, text layers,
#: joint dimension), as its model configs ViT-B-*, ViT-L-*, ViT-H-* give them.
_VIT_SIZES = {
    (768, 12): ("B", 512, 12, 512),
    (1024, 24): ("L", 768, 12, 768),
    (1280, 32): ("H", 1024, 24, 1024),
}
#: open_clip's default input size, left out of its model names.
_DEFAULT_IMAGE_SIZE = 224
#: Options of the cross-attention kinds that change the architecture (SCAN's direction,
#: SGRAF's module, BFAN's focal attention).
_VARIANT_KEYS = ("direction", "module", "focal")


def _clip_towers(model: nn.Module) -> tuple[Any, Any] | None:
    """``(vision config, text config)`` of a CLIP's ``transformers`` towers, or ``None``."""
    image = getattr(model, "image_encoder", None)
    text = getattr(model, "text_encoder", None)
    vision_config = getattr(getattr(image, "vision_model", None), "config", None)
    text_config = getattr(getattr(text, "text_model", None), "config", None)
    if vision_config is None or text_config is None:
        return None
    return vision_config, text_config


def _clip_name(model: nn.Module, vision: Any, text: Any) -> str:
    """open_clip's name of a CLIP's shape, or its shape spelled out (see
    :func:`architecture_name`)."""
    vw, vl = int(vision.hidden_size), int(vision.num_hidden_layers)
    tw, tl = int(text.hidden_size), int(text.num_hidden_layers)
    patch = int(vision.patch_size)
    projection = getattr(model.image_encoder, "visual_projection", None)
    joint = int(projection.out_features) if isinstance(projection, nn.Linear) else vw
    crop = getattr(getattr(model, "image_transform", None), "crop", None)
    height, width = crop if crop is not None else (vision.image_size, vision.image_size)
    size = str(height) if height == width else f"{height}x{width}"
    known = _VIT_SIZES.get((vw, vl))
    if known is not None and known[1:] == (tw, tl, joint):
        name = f"ViT-{known[0]}-{patch}"
        if size != str(_DEFAULT_IMAGE_SIZE):
            name += f"-{size}"
    else:
        name = f"ViT-custom-v{vw}x{vl}-t{tw}x{tl}-p{patch}-d{joint}-{size}"
    if getattr(vision, "hidden_act", None) == "quick_gelu":
        name += "-quickgelu"
    added = getattr(model.image_encoder, "embed_proj", None)
    if isinstance(added, nn.Linear):  # vlret's layer on top of CLIP's projection
        name += f"-proj{added.out_features}"
    return name


def _part(section: Any) -> str | None:
    """An encoder's word in a name: its preset (``resnet-152``) or its kind (``gru``)."""
    if not isinstance(section, Mapping):
        return None
    value = section.get("preset") or section.get("kind")
    return str(value) if value else None


def architecture_name(model: nn.Module) -> str:
    """The architecture of ``model`` as CLIP_benchmark's ``model`` column names one.

    * A CLIP of one of open_clip's sizes (the towers' widths and depths, the joint dimension):
      open_clip's name, ``ViT-B-32``, ``ViT-L-14``, with the input size when it is not 224
      (``ViT-L-14-336``; ``384x128`` for a person-search input), ``-quickgelu`` when its
      activation is OpenAI's (as open_clip names OpenAI's own weights), and ``-projN`` when
      vlret adds a projection to N dimensions (``model.proj_dim``).
    * Another CLIP: its shape, ``ViT-custom-v{width}x{layers}-t{width}x{layers}-p{patch}-
      d{joint dimension}-{image size}`` (vision tower, text tower), e.g. the shipped
      synthetic pre-training's ``ViT-custom-v64x2-t64x2-p8-d64-32``.
    * Any other vlret model: its resolved config's kind, variant (SCAN's direction, SGRAF's
      module), image and text encoders and joint dimension, e.g. ``vse-precomp-gru-1024``,
      ``scan-t2i-precomp-gru-1024``; a model without a config, its class name.

    Args:
        model: The model (DDP-wrapped is fine).

    Returns:
        The name, without spaces or commas (CLIP_benchmark's ``model,pretrained`` syntax).
    """
    inner = unwrap_model(model)
    towers = _clip_towers(inner)
    if towers is not None:
        return _clip_name(inner, *towers)
    config = getattr(inner, "config", None)
    if not isinstance(config, Mapping) or not config.get("kind"):
        return type(inner).__name__
    parts = [str(config["kind"])]
    parts += [str(config[k]) for k in _VARIANT_KEYS if isinstance(config.get(k), str)]
    parts += [p for p in (_part(config.get("image")), _part(config.get("text"))) if p]
    if config.get("embed_dim"):
        parts.append(str(config["embed_dim"]))
    return "-".join(parts).replace(" ", "_").replace(",", "_")


def _scorer_models(scorer: Scorer | None) -> list[nn.Module]:
    """The models whose scores an exact scorer measured (an ensemble's members in order)."""
    if isinstance(scorer, TwoTowerScorer | PairModelScorer):
        return [scorer.model]
    if isinstance(scorer, EnsembleScorer):
        return [m for s in scorer.scorers for m in _scorer_models(s)]
    return []


def retrieval_dataset_name(protocol: str | EvalProtocol, split: str) -> str:
    """The ``dataset`` of a retrieval record: the protocol's name (``coco5k``), followed by the
    split when it is not one of the protocol's paper splits (``coco5k/dev``), so a dev-split
    evaluation is never taken for the paper's test."""
    chosen = get_protocol(protocol)
    return chosen.name if split in chosen.paper_splits else f"{chosen.name}/{split}"


def check_retrieval_request(
    protocol: str | EvalProtocol, *, approximate: bool = False, rescored: bool = False
) -> None:
    """Refuse, before anything is evaluated, what CLIP_benchmark's retrieval record cannot hold
    (module docstring): a protocol that does not rank by the caption's own image or video,
    the approximate shortlist protocol and a re-scored evaluation.

    Args:
        protocol: The protocol (a registered name or record).
        approximate: The approximate shortlist protocol was asked for (``--shortlist``).
        rescored: A non-standard re-scoring was asked for (``--rescore``).

    Raises:
        ValueError: One line naming ``--json-format clip_benchmark`` and why.
    """
    chosen = get_protocol(protocol)
    why = ""
    if not chosen.relevance_kind.clip_benchmark:
        why = (
            f"protocol {chosen.name} counts {chosen.relevance} as relevant; CLIP_benchmark's "
            "zeroshot_retrieval record counts only a caption's own image"
        )
    elif approximate:
        why = "the approximate shortlist protocol would read as the exact evaluation there"
    elif rescored:
        why = "a re-scored (non-standard) evaluation would read as the standard one there"
    if why:
        raise ValueError(f"--json-format clip_benchmark: {why}; use --json-format vlret")


def retrieval_record(evaluation: Evaluation, *, language: str = "en") -> dict[str, Any]:
    """CLIP_benchmark's ``zeroshot_retrieval`` record of a retrieval evaluation (module
    docstring): ``dataset`` (:func:`retrieval_dataset_name`), ``model``
    (:func:`architecture_name`; an ensemble's distinct architectures joined by ``+``),
    ``pretrained`` (the checkpoint path or model folder; an ensemble's joined by ``+``),
    ``task``, ``metrics`` (``image_retrieval_recall@K`` = ``t2i_rK`` / 100 and
    ``text_retrieval_recall@K`` = ``i2t_rK`` / 100, K in :data:`RECALL_KS`, in
    CLIP_benchmark's order), ``language`` and ``vlret`` (protocol, split, sizes, folds).

    Args:
        evaluation: What :func:`vlret.eval.evaluate` returned, carrying its protocol, split
            and scorer.
        language: The captions' language (CLIP_benchmark's ``--language``).

    Returns:
        The record, ready for ``json.dump``.

    Raises:
        ValueError: An evaluation without protocol or split, or one
            :func:`check_retrieval_request` refuses.
    """
    if evaluation.protocol is None or evaluation.split is None:
        raise ValueError("evaluation: carries no protocol or split; evaluate it with both")
    check_retrieval_request(
        evaluation.protocol,
        approximate=evaluation.approximate,
        rescored=evaluation.rescore is not None,
    )
    metrics = evaluation.metrics.as_dict()
    out: dict[str, float] = {}
    for k in RECALL_KS:
        out[f"image_retrieval_recall@{k}"] = metrics[f"t2i_r{k}"] / 100.0
        out[f"text_retrieval_recall@{k}"] = metrics[f"i2t_r{k}"] / 100.0
    names = list(dict.fromkeys(architecture_name(m) for m in _scorer_models(evaluation.scorer)))
    vlret: dict[str, Any] = {
        "protocol": evaluation.protocol.name,
        "split": evaluation.split,
        "n_images": evaluation.n_images,
        "n_texts": evaluation.n_texts,
    }
    if evaluation.protocol.folds > 1:
        vlret["folds"] = evaluation.protocol.folds
    return {
        "dataset": retrieval_dataset_name(evaluation.protocol, evaluation.split),
        "model": "+".join(names),
        "pretrained": "+".join(evaluation.members),
        "task": TASK_RETRIEVAL,
        "metrics": out,
        "language": language,
        "vlret": vlret,
    }


__all__ = [
    "JSON_FORMATS",
    "RECALL_KS",
    "TASK_RETRIEVAL",
    "architecture_name",
    "check_retrieval_request",
    "retrieval_dataset_name",
    "retrieval_record",
]
