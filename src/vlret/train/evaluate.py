"""Evaluation of a trained model under the papers' protocols.

========================  =====================  ==========================================
protocol                  data / split           metric
========================  =====================  ==========================================
``f30k``                  F30K ``test``          1000 images x 5000 captions
``coco5k``                COCO ``testall``       5000 images x 25000 captions
``coco1k``                COCO ``testall``       5 folds of 1000 images, averaged
``msrvtt-full``           MSR-VTT ``test``       2990 videos x 20 captions; v2t ranks the best
                                                 of a video's 20 captions (dual-encoding)
``msrvtt-1ka``            MSR-VTT ``test``       1000 videos x 1 caption (JSFUSION)
========================  =====================  ==========================================

``vlret eval --split`` is one of ``test``, ``testall`` and ``dev``, checked against the protocol
and the checkpoint's data format (:func:`check_eval_split`): ``f30k`` takes ``test`` of
precomp or Karpathy data; ``coco5k`` / ``coco1k`` take ``testall`` of precomp data (COCO's
5000 test images; precomp ``test`` is only the first 1000) or ``test`` / ``testall`` of a
Karpathy COCO JSON; the MSR-VTT protocols take ``test`` of MSR-VTT data. ``dev`` (precomp dev,
Karpathy val, MSR-VTT validate) is accepted by every protocol but ``msrvtt-1ka``, whose split
has no dev videos, for checking model selection; papers report the test splits. ``coco1k``
needs a number of images divisible by 5 (its 5 folds).

All of them go through :func:`vlret.metrics.retrieval_metrics` (or
:func:`~vlret.metrics.coco_5fold_metrics`) on L2-normalised embeddings (cosine scores): the
image-to-text rank there is already the rank of an image's best caption, which is the
dual-encoding video-to-text definition of MSR-VTT full.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

from .._files import atomic_write_text
from ..data import RetrievalDataset
from ..metrics import RetrievalMetrics, coco_5fold_metrics, retrieval_metrics
from .builders import build_dataset, encoder_from_state, eval_data_config
from .checkpoint import load_checkpoint
from .config import config_from_dict
from .distributed import resolve_device

PROTOCOLS = ("f30k", "coco1k", "coco5k", "msrvtt-full", "msrvtt-1ka")
EVAL_SPLITS = ("test", "testall", "dev")
#: protocol -> data format -> the splits it evaluates (see the module docstring).
_COCO_SPLITS = {"precomp": ("testall", "dev"), "karpathy": ("test", "testall", "dev")}
PROTOCOL_SPLITS: dict[str, dict[str, tuple[str, ...]]] = {
    "f30k": {"precomp": ("test", "dev"), "karpathy": ("test", "dev")},
    "coco1k": _COCO_SPLITS,
    "coco5k": _COCO_SPLITS,
    "msrvtt-full": {"msrvtt": ("test", "dev")},
    "msrvtt-1ka": {"msrvtt": ("test",)},
}
_TITLES = {
    "f30k": "Flickr30K 1K test",
    "coco1k": "MS-COCO 5-fold 1K test",
    "coco5k": "MS-COCO 5K test",
    "msrvtt-full": "MSR-VTT full test (v2t: best of each video's captions)",
    "msrvtt-1ka": "MSR-VTT 1k-A test",
}
#: protocol -> (name, the papers' test splits, their number of images / videos and texts)
_PAPER_SETS: dict[str, tuple[str, tuple[str, ...], int, int]] = {
    "f30k": ("Flickr30K 1K", ("test",), 1000, 5000),
    "coco1k": ("MS-COCO 5-fold 1K", ("testall", "test"), 5000, 25000),
    "coco5k": ("MS-COCO 5K", ("testall", "test"), 5000, 25000),
    "msrvtt-full": ("MSR-VTT full", ("test",), 2990, 59800),
    "msrvtt-1ka": ("MSR-VTT 1k-A", ("test",), 1000, 1000),
}


@dataclass
class Evaluation:
    """What :func:`run_evaluation` measured: the metrics and the size of the scored split."""

    metrics: RetrievalMetrics
    n_images: int
    n_texts: int


def protocol_title(protocol: str, split: str | None, n_images: int, n_texts: int) -> str:
    """The table title: the paper's label only when ``split`` and the sizes are the paper's
    test set; otherwise what was actually scored, marked as not the paper's set."""
    name, splits, paper_images, paper_texts = _PAPER_SETS[check_protocol(protocol)]
    if split in splits and (n_images, n_texts) == (paper_images, paper_texts):
        return _TITLES[protocol]
    folds = f", 5 folds of {n_images // 5} images" if protocol == "coco1k" else ""
    return (
        f"{name} protocol on {split or 'a'} split of {n_images} images x {n_texts} texts{folds} "
        f"(not the paper's test set: {'/'.join(splits)}, {paper_images} x {paper_texts})"
    )


def check_protocol(protocol: str) -> str:
    if protocol not in PROTOCOLS:
        raise ValueError(f"protocol must be one of {', '.join(PROTOCOLS)}, got {protocol!r}")
    return protocol


def check_eval_split(protocol: str, split: str, data_format: str) -> None:
    """Raise ``ValueError`` unless ``protocol`` evaluates ``split`` of ``data_format`` data."""
    check_protocol(protocol)
    by_format = PROTOCOL_SPLITS[protocol]
    if data_format not in by_format:
        raise ValueError(
            f"protocol {protocol} needs {' or '.join(by_format)} data; the checkpoint was "
            f"trained on {data_format} data"
        )
    if split not in by_format[data_format]:
        raise ValueError(
            f"protocol {protocol} on {data_format} data evaluates the split(s) "
            f"{', '.join(by_format[data_format])}, not {split!r}"
        )


def _unwrap(model: nn.Module) -> nn.Module:
    return model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model


@torch.no_grad()
def encode_dataset(
    model: nn.Module,
    dataset: RetrievalDataset,
    *,
    batch_size: int = 256,
    device: torch.device | str = "cpu",
    normalize: bool = True,
    num_workers: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(img_emb (N_img, E), txt_emb (N_txt, E))`` in float32 on the CPU, each image encoded
    once. The model is put in eval mode and restored afterwards."""
    model = _unwrap(model)
    was_training = model.training
    # Loaders with their own generator leave the global torch RNG untouched (exact resume).
    gen = torch.Generator().manual_seed(0)
    model.eval()
    try:
        images = dataset.images()
        img_parts = []
        for feats, _ in DataLoader(
            images,
            batch_size=batch_size,
            collate_fn=images.collate,
            num_workers=num_workers,
            generator=gen,
        ):
            if isinstance(feats, torch.Tensor):
                feats = feats.to(device)
            img_parts.append(model.encode_images(feats).float().cpu())
        texts = dataset.texts()
        txt_parts = []
        for caps, lengths, _ in DataLoader(
            texts,
            batch_size=batch_size,
            collate_fn=texts.collate,
            num_workers=num_workers,
            generator=gen,
        ):
            if isinstance(caps, torch.Tensor):
                caps = caps.to(device)
            txt_parts.append(model.encode_texts(caps, lengths).float().cpu())
    finally:
        model.train(was_training)
    img, txt = torch.cat(img_parts), torch.cat(txt_parts)
    if normalize:
        img, txt = F.normalize(img, dim=1), F.normalize(txt, dim=1)
    return img, txt


def dev_metrics(
    img_emb: torch.Tensor, txt_emb: torch.Tensor, txt_to_img: torch.Tensor
) -> dict[str, float]:
    """Model-selection metrics: the retrieval metrics of the model's own scores, plus
    ``pos_sim``, the mean cosine of the matching (image, caption) pairs, and
    ``hardest_neg_sim``, the mean over every image and caption query of its hardest
    non-matching cosine (Unified Fig. 4)."""
    out = retrieval_metrics(img_emb, txt_emb, txt_to_img).as_dict()
    # Cosines whatever loss.normalize says; the scores above are the model's own.
    sim = F.normalize(img_emb.float(), dim=1) @ F.normalize(txt_emb.float(), dim=1).t()
    pos = txt_to_img[None, :] == torch.arange(sim.shape[0])[:, None]
    neg = sim.masked_fill(pos, -math.inf)
    hardest = torch.cat([neg.amax(dim=1), neg.amax(dim=0)])
    hardest = hardest[torch.isfinite(hardest)]  # a query without negatives has none
    out["pos_sim"] = float(sim[pos].mean())
    out["hardest_neg_sim"] = float(hardest.mean()) if hardest.numel() else float("nan")
    return out


def protocol_metrics(
    img_emb: torch.Tensor, txt_emb: torch.Tensor, txt_to_img: torch.Tensor, protocol: str
) -> RetrievalMetrics:
    """Metrics of ``protocol`` from normalised embeddings (see the module table)."""
    check_protocol(protocol)
    if protocol == "coco1k":
        n_img = img_emb.shape[0]
        if n_img % 5:
            raise ValueError(
                f"coco1k averages 5 folds of equal size (COCO testall: 5 x 1000 images); "
                f"this split has {n_img} images, not divisible by 5 (use coco5k)"
            )
        return coco_5fold_metrics(img_emb, txt_emb, txt_to_img, n_folds=5)
    return retrieval_metrics(img_emb, txt_emb, txt_to_img)


def format_metrics_table(
    metrics: RetrievalMetrics, protocol: str, *, title: str | None = None
) -> str:
    """The paper-style table: R@1/5/10 both directions, rsum, medr (and each COCO fold);
    ``title`` defaults to the protocol's paper label (see :func:`protocol_title`)."""
    lines = [metrics.format_table(title if title is not None else _TITLES[protocol])]
    for k, fold in enumerate(metrics.folds):
        row = fold.format_table().splitlines()[-1]
        lines.append(f"{row}   (fold {k + 1})")
    return "\n".join(lines)


def metrics_json(
    metrics: RetrievalMetrics, *, protocol: str, split: str, **extra: Any
) -> dict[str, Any]:
    """JSON record: the foundation's key names under ``metrics`` (and per fold under ``folds``)."""
    out: dict[str, Any] = {"protocol": protocol, "split": split, **extra}
    out["metrics"] = metrics.as_dict()
    if metrics.folds:
        out["folds"] = [f.as_dict() for f in metrics.folds]
    return out


def load_trained_model(
    checkpoint: str | Path, *, device: torch.device | str = "cpu"
) -> tuple[nn.Module, Any, Any]:
    """``(model, config, caption encoder)`` rebuilt from a training checkpoint."""
    from ..models import build_model

    state = load_checkpoint(checkpoint)
    if "config" not in state or "encoder" not in state:
        raise ValueError(f"{checkpoint}: not a `vlret train` checkpoint (no config or encoder)")
    config = config_from_dict(state["config"], source=f"{checkpoint} (stored config)")
    encoder = encoder_from_state(state["encoder"])
    model = build_model(config.model, vocab_size=state.get("vocab_size"))
    model.load_state_dict(state["model"])
    return model.to(device).eval(), config, encoder


def evaluate_checkpoint(
    checkpoint: str | Path,
    *,
    data: str | Path,
    split: str,
    protocol: str,
    batch_size: int = 256,
    device: str = "auto",
) -> RetrievalMetrics:
    """The metrics of :func:`run_evaluation`."""
    return run_evaluation(
        checkpoint,
        data=data,
        split=split,
        protocol=protocol,
        batch_size=batch_size,
        device=device,
    ).metrics


def run_evaluation(
    checkpoint: str | Path,
    *,
    data: str | Path,
    split: str,
    protocol: str,
    batch_size: int = 256,
    device: str = "auto",
) -> Evaluation:
    """Load ``checkpoint``, encode ``split`` of the data folder ``data`` and score ``protocol``.

    ``data`` replaces the training data paths (for Karpathy data: the JSON and the image
    folder under it, see :func:`~vlret.train.builders.eval_data_config`); a missing folder
    raises ``FileNotFoundError``, a split the protocol does not evaluate ``ValueError``."""
    check_protocol(protocol)
    if split not in EVAL_SPLITS:
        raise ValueError(f"split must be one of {', '.join(EVAL_SPLITS)}, got {split!r}")
    if not Path(data).exists():
        raise FileNotFoundError(f"{data}: missing; expected the data folder of the test split")
    if batch_size < 1:
        raise ValueError(f"batch_size: expected a positive integer, got {batch_size!r}")
    try:
        dev = resolve_device(device)
    except ValueError as err:
        raise ValueError(f"device: {err}") from None
    model, config, encoder = load_trained_model(checkpoint, device=dev)
    check_eval_split(protocol, split, config.data.format)
    data_cfg = eval_data_config(config.data, data)
    ds_protocol = {"msrvtt-1ka": "1k-A", "msrvtt-full": "full"}.get(protocol)
    transform = getattr(model, "image_transform", None)
    dataset = build_dataset(
        data_cfg, split, encoder, protocol=ds_protocol, image_transform=transform
    )
    normalize = config.loss.params.get("normalize", True)
    img, txt = encode_dataset(
        model, dataset, batch_size=batch_size, device=dev, normalize=normalize
    )
    metrics = protocol_metrics(img, txt, dataset.txt_to_img, protocol)
    return Evaluation(metrics, n_images=int(img.shape[0]), n_texts=int(txt.shape[0]))


def check_json_path(path: str | Path) -> Path:
    """Refuse a ``--json`` target that cannot be written (a folder, a file in a file)."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{path}: --json is a folder; expected a file path such as {path}/m.json")
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise ValueError(f"{path}: --json cannot be written ({parent} is a file)")
    return path


def write_metrics_json(record: dict[str, Any], path: str | Path) -> Path:
    path = check_json_path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return atomic_write_text(path, json.dumps(record, indent=2) + "\n")
