"""Zero-shot classification of a class-labelled image set by a two-tower model, as
CLIP_benchmark does it.

The classifier (:func:`zeroshot_classifier`): for each class, every prompt template is filled
with the class name (``{c}``, CLIP_benchmark's placeholder; open_clip's ``{}`` also works),
each prompt is encoded by the text tower and L2-normalised, the class embedding is the mean of
its prompts' embeddings, renormalised. :func:`evaluate_zeroshot` encodes every image,
L2-normalises it and takes ``logits = 100 x cosine`` with each class embedding (the fixed
scale of CLIP's evaluation, not the model's learnt temperature: it changes no rank), then the
metrics of :func:`vlret.metrics.zeroshot_classification_metrics`. Cosines are used whatever a
vlret model's ``scoring``: the classifier averages unit vectors.

The model is anything with ``encode_images(pixels (N, 3, H, W))``, ``encode_texts(ids,
lengths)`` and an ``image_transform`` (PIL image -> pixel tensor): a
:class:`vlret.models.RetrievalModel` of kind ``clip`` (fine-tuned or trained by vlret, or a
local Hugging Face CLIP, :func:`load_hf_clip`). The tokenizer is the model's caption encoder
(anything with ``encode(text) -> ids``; ``pad_id`` if it has one). The data set is a
:class:`vlret.data.classification.ClassificationSet`: ``name``, ``split``, ``classnames``,
``labels`` and ``image(i)`` (a PIL image).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, cast

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

from .._modules import unwrap_model
from .._progress import progress_bar
from ..data.dataset import pad_captions
from ..metrics import ZEROSHOT_METRICS, zeroshot_classification_metrics
from .encode import check_device

#: CLIP_benchmark's fixed logit scale: logits are 100 x the cosine
LOGIT_SCALE = 100.0
#: the ``task`` of CLIP_benchmark's JSON record
TASK = "zeroshot_classification"


class ClassificationData(Protocol):
    """What :func:`evaluate_zeroshot` reads of a data set (a
    :class:`vlret.data.classification.ClassificationSet`)."""

    name: str
    split: str
    classnames: list[str]
    labels: list[int]

    def __len__(self) -> int: ...

    def image(self, i: int) -> Any: ...


def fill_template(template: str, classname: str) -> str:
    """``template`` with the class name in place of ``{c}`` (or open_clip's ``{}``).

    Raises:
        ValueError: The template holds neither placeholder.
    """
    if "{c}" in template:
        return template.replace("{c}", classname)
    if "{}" in template:
        return template.replace("{}", classname)
    raise ValueError(f"template {template!r} has no {{c}} placeholder for the class name")


def _check_names(values: Any, name: str, what: str) -> list[str]:
    if isinstance(values, str) or not isinstance(values, Sequence) or not values:
        raise ValueError(f"{name} must be a non-empty list of {what}, got {values!r:.80}")
    for i, v in enumerate(values):
        if not isinstance(v, str) or not v.strip():
            raise ValueError(f"{name}[{i}] must be a non-empty string, got {v!r}")
    return list(values)


def _check_batch_size(batch_size: Any) -> int:
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    return batch_size


def _bar(items: Iterable[Any], show: bool, **options: Any) -> Iterable[Any]:
    return progress_bar(items, show=show, leave=False, **options)


class _EvalMode:
    """Eval mode for a ``with`` block, the training mode restored afterwards."""

    def __init__(self, model: nn.Module) -> None:
        self.model, self.was_training = model, model.training

    def __enter__(self) -> nn.Module:
        self.model.eval()
        return self.model

    def __exit__(self, *exc: object) -> None:
        self.model.train(self.was_training)


@torch.no_grad()
def encode_prompts(
    model: nn.Module,
    texts: Sequence[str],
    *,
    tokenizer: Any,
    batch_size: int = 256,
    device: torch.device | str = "cpu",
    progress: bool = False,
) -> torch.Tensor:
    """``(len(texts), E)`` float32 CPU embeddings of ``texts``, each L2-normalised: tokenised
    by ``tokenizer.encode``, padded with its ``pad_id`` (0 if none), encoded in batches."""
    batch_size = _check_batch_size(batch_size)
    device = check_device(device)
    pad_id = int(getattr(tokenizer, "pad_id", 0))
    out = []
    starts = range(0, len(texts), batch_size)
    for a in _bar(starts, progress, desc="class prompts", unit="batch"):
        ids = [
            torch.as_tensor(tokenizer.encode(t), dtype=torch.long)
            for t in texts[a : a + batch_size]
        ]
        caps, lengths = pad_captions(ids, pad_id=pad_id)
        emb = cast(Any, model).encode_texts(caps.to(device), lengths.to(device))
        out.append(F.normalize(emb.float(), dim=-1).cpu())
    return torch.cat(out)


@torch.no_grad()
def zeroshot_classifier(
    model: nn.Module,
    classnames: Sequence[str],
    templates: Sequence[str],
    *,
    tokenizer: Any,
    batch_size: int = 256,
    device: torch.device | str = "cpu",
    progress: bool = False,
) -> torch.Tensor:
    """The zero-shot classifier ``(C, E)``: row ``c`` is the renormalised mean of the
    normalised embeddings of every template filled with ``classnames[c]`` (CLIP_benchmark's
    ``zero_shot_classifier``, transposed), float32 on the CPU.

    Args:
        model: A two-tower model with ``encode_texts(ids, lengths)`` (DDP-wrapped is fine).
        classnames: The class names, in label order.
        templates: Prompt templates with a ``{c}`` (or ``{}``) placeholder.
        tokenizer: The model's caption encoder (``encode(text) -> ids``, ``pad_id``).
        batch_size: Prompts per text-tower batch (all classes' prompts are batched together).
        device: Where the text tower runs.
        progress: Show a progress bar (tqdm, the ``train`` extra).

    Returns:
        The unit-norm class embeddings.

    Raises:
        ValueError: Empty or malformed ``classnames`` / ``templates``, a template without a
            placeholder, or a bad ``batch_size`` / ``device``.
    """
    names = _check_names(classnames, "classnames", "class names")
    prompts = _check_names(templates, "templates", "prompt templates")
    texts = [fill_template(t, c) for c in names for t in prompts]
    with _EvalMode(unwrap_model(model)) as m:
        emb = encode_prompts(
            m, texts, tokenizer=tokenizer, batch_size=batch_size, device=device, progress=progress
        )
    per_class = emb.view(len(names), len(prompts), -1).mean(dim=1)
    return F.normalize(per_class, dim=-1)


class _Pixels(Dataset):
    """Image ``i`` of a classification set as the model's pixel tensor, with its label (the
    decoding and transform run in the loader's workers)."""

    def __init__(self, data: ClassificationData, transform: Any) -> None:
        self.data, self.transform = data, transform

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return self.transform(self.data.image(i)), int(self.data.labels[i])


#: Folder names that name a split, not a set (:func:`classification_set_name` looks past them).
_SPLIT_FOLDERS = frozenset({"train", "training", "val", "valid", "validation", "dev", "test"})


def classification_set_name(data: ClassificationData) -> str:
    """The name results give ``data``: a released set's own name (``cifar10``), and for an
    ``imagefolder`` the folder it was read from, past any folder named like a split
    (``imagefolder/category`` for ``.../imagefolder/category/test``, or for
    ``.../category`` holding ``test/``), so two image folders classified in one study give
    rows that can be told apart (CLIP_benchmark's ``dataset`` column)."""
    root = getattr(data, "root", None)
    if data.name != "imagefolder" or root is None:
        return data.name
    folder = Path(root).absolute()
    while folder.name.lower() in _SPLIT_FOLDERS and folder.parent != folder:
        folder = folder.parent
    return f"{data.name}/{folder.name}" if folder.name else data.name


def zeroshot_title(
    dataset: str, split: str, num_images: int, num_classes: int, num_templates: int
) -> str:
    """``Zero-shot classification: cifar10 test (10000 images, 10 classes, 18 templates)``: the
    title of a result's table, and what ``vlret eval --check`` says would be scored."""
    return (
        f"Zero-shot classification: {dataset} {split} ({num_images} images, "
        f"{num_classes} classes, {num_templates} templates)"
    )


@dataclass(frozen=True)
class ZeroShotResult:
    """The zero-shot classification of one split: its metrics (fractions, CLIP_benchmark's
    keys), what was scored, and the logits."""

    #: the set's name (:func:`classification_set_name`: ``cifar10``, ``imagefolder/colour``)
    dataset: str
    split: str
    #: ``acc1``, ``acc5`` (NaN below 5 classes), ``mean_per_class_recall``: fractions
    metrics: dict[str, float]
    num_images: int
    num_classes: int
    num_templates: int
    #: ``(N, C)`` float32 CPU logits (100 x cosine)
    logits: torch.Tensor | None = field(default=None, repr=False, compare=False)

    def title(self) -> str:
        """The table's title (:func:`zeroshot_title`)."""
        return zeroshot_title(
            self.dataset, self.split, self.num_images, self.num_classes, self.num_templates
        )

    def table(self) -> str:
        """A title line and a one-row table of the metrics in percent."""
        title = self.title()
        cells = [
            "-" if math.isnan(self.metrics[k]) else f"{100 * self.metrics[k]:.2f}"
            for k in ZEROSHOT_METRICS
        ]
        head = f"{'acc1 %':>8} {'acc5 %':>8} {'mean per-class recall %':>24}"
        row = f"{cells[0]:>8} {cells[1]:>8} {cells[2]:>24}"
        return "\n".join([title, head, row])

    def record(
        self, *, model: str, pretrained: str = "", source: str | None = None
    ) -> dict[str, Any]:
        """CLIP_benchmark's JSON record (``dataset``, ``model``, ``pretrained``, ``task``,
        ``metrics`` as fractions, ``language``), so results merge with that suite's tables
        (:mod:`vlret.eval.clip_benchmark`); ``acc5`` below 5 classes is ``null``. What vlret
        scored is under ``vlret``.

        Args:
            model: The architecture, as CLIP_benchmark's ``model`` column names one
                (:func:`vlret.eval.clip_benchmark.architecture_name`: ``ViT-B-32``).
            pretrained: The weights: the checkpoint path or model folder.
            source: What kind of model ``pretrained`` is (``vlret-checkpoint``,
                ``hf-clip``), recorded under ``vlret`` when given.
        """
        metrics = {k: (None if math.isnan(v) else v) for k, v in self.metrics.items()}
        scored: dict[str, Any] = {
            "split": self.split,
            "num_images": self.num_images,
            "num_classes": self.num_classes,
            "num_templates": self.num_templates,
        }
        if source is not None:
            scored["model_source"] = source
        return {
            "dataset": self.dataset,
            "model": model,
            "pretrained": pretrained,
            "task": TASK,
            "metrics": metrics,
            "language": "en",
            "vlret": scored,
        }


@torch.no_grad()
def zeroshot_logits(
    model: nn.Module,
    data: ClassificationData,
    classifier: torch.Tensor,
    *,
    batch_size: int = 64,
    device: torch.device | str = "cpu",
    num_workers: int = 0,
    progress: bool = False,
) -> torch.Tensor:
    """``(N, C)`` float32 CPU logits ``100 x cos(image, class)`` of every image of ``data``
    against the rows of ``classifier`` (the model's ``image_transform`` in the loader's
    workers; the loader draws from its own generator, never from the global RNG)."""
    batch_size = _check_batch_size(batch_size)
    device = check_device(device)
    inner = unwrap_model(model)
    transform = getattr(inner, "image_transform", None)
    if transform is None:
        raise ValueError(
            "model has no image_transform: it encodes precomputed features, not pixels; "
            "zero-shot classification needs a model that reads images (kind clip)"
        )
    weights = classifier.to(device=device, dtype=torch.float32)
    loader = DataLoader(
        _Pixels(data, transform),
        batch_size=batch_size,
        num_workers=num_workers,
        generator=torch.Generator().manual_seed(0),
    )
    out = []
    with _EvalMode(inner) as m:
        for pixels, _ in _bar(loader, progress, desc=f"{data.name} images", unit="batch"):
            emb = F.normalize(cast(Any, m).encode_images(pixels.to(device)).float(), dim=-1)
            out.append((LOGIT_SCALE * emb @ weights.T).cpu())
    return torch.cat(out) if out else torch.zeros(0, classifier.shape[0])


def evaluate_zeroshot(
    model: nn.Module,
    data: ClassificationData,
    templates: Sequence[str],
    *,
    tokenizer: Any,
    batch_size: int = 64,
    device: torch.device | str = "cpu",
    num_workers: int = 0,
    progress: bool = False,
    ties: str = "against",
) -> ZeroShotResult:
    """Zero-shot classification of ``data``: the classifier of its class names and
    ``templates`` (:func:`zeroshot_classifier`), the logits of its images
    (:func:`zeroshot_logits`) and their metrics.

    Args:
        model: A two-tower model reading pixels (``image_transform``, ``encode_images``,
            ``encode_texts``), DDP-wrapped or not; put in eval mode and restored.
        data: The labelled images (a :class:`~vlret.data.classification.ClassificationSet`).
        templates: Prompt templates with a ``{c}`` placeholder.
        tokenizer: The model's caption encoder.
        batch_size: Images (and prompts) per batch.
        device: Where the model runs.
        num_workers: DataLoader workers decoding and transforming the images.
        progress: Progress bars on stderr (tqdm, the ``train`` extra).
        ties: How a tie with the true class counts
            (:func:`~vlret.metrics.zeroshot_classification_metrics`).

    Returns:
        The :class:`ZeroShotResult`.

    Raises:
        ValueError: An empty data set, labels outside the class names, a model without an
            image transform, or bad templates / settings.
    """
    if len(data) == 0:
        raise ValueError(f"{data.name} {data.split}: no images to classify")
    classifier = zeroshot_classifier(
        model,
        data.classnames,
        templates,
        tokenizer=tokenizer,
        batch_size=batch_size,
        device=device,
        progress=progress,
    )
    logits = zeroshot_logits(
        model,
        data,
        classifier,
        batch_size=batch_size,
        device=device,
        num_workers=num_workers,
        progress=progress,
    )
    metrics = zeroshot_classification_metrics(logits, list(data.labels), ties=ties)
    return ZeroShotResult(
        dataset=classification_set_name(data),
        split=data.split,
        metrics=metrics,
        num_images=len(data),
        num_classes=len(data.classnames),
        num_templates=len(templates),
        logits=logits,
    )


def is_hf_clip_dir(path: str | Path) -> bool:
    """Whether ``path`` is a folder whose ``config.json`` says ``model_type`` ``clip``."""
    config = Path(path) / "config.json"
    if not config.is_file():
        return False
    try:
        data = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    return isinstance(data, dict) and data.get("model_type") == "clip"


def load_hf_clip(
    path: str | Path,
    *,
    device: torch.device | str = "cpu",
    default_preprocessing: str | None = None,
) -> tuple[nn.Module, Any]:
    """``(model, tokenizer)`` of a local Hugging Face CLIP directory for zero-shot use: a
    :class:`vlret.models.RetrievalModel` of kind ``clip`` with CLIP's own projections (no
    added layer), in eval mode, and the folder's tokenizer, truncating to the text tower's
    ``max_position_embeddings`` (:func:`vlret.models.clip_folder.text_max_positions`).
    Nothing is downloaded.

    The folder is checked before the weights are read: its tokenizer files
    (:func:`vlret.models.clip_folder.check_clip_tokenizer`; ``transformers`` would otherwise
    build a tokenizer of special tokens only, and every class would score alike) and its image
    processor, in either of ``transformers``' layouts
    (:meth:`vlret.models.clip.CLIPImageTransform.from_pretrained`).

    Args:
        path: The folder (``CLIPModel`` and ``CLIPProcessor`` ``save_pretrained`` output).
        device: Where the model goes.
        default_preprocessing: ``"openai-clip"``: OpenAI CLIP's preprocessing for a folder
            with no processor file (refused otherwise).

    Raises:
        FileNotFoundError: ``path`` is not a folder, or lacks tokenizer files, a processor file
            (without ``default_preprocessing``) or weights.
        ValueError: Its ``config.json`` is missing or not a CLIP config, or a file cannot be
            read as ``transformers`` wrote it (the message names the file).
    """
    from ..data import load_hf_tokenizer
    from ..models import build_model
    from ..models.clip_folder import check_clip_tokenizer, text_max_positions

    folder = Path(path)
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder}: missing; expected a local Hugging Face CLIP directory")
    if not is_hf_clip_dir(folder):
        raise ValueError(
            f"{folder}: not a Hugging Face CLIP directory (expected config.json with "
            "model_type 'clip')"
        )
    check_clip_tokenizer(folder)
    config: dict[str, Any] = {"kind": "clip", "path": str(folder), "proj_dim": None}
    if default_preprocessing is not None:  # a model config key only where it is used
        config["default_preprocessing"] = default_preprocessing
    model = build_model(config)
    tokenizer = load_hf_tokenizer(folder, max_positions=text_max_positions(folder))
    return model.to(check_device(device)).eval(), tokenizer


__all__ = [
    "LOGIT_SCALE",
    "TASK",
    "ClassificationData",
    "ZeroShotResult",
    "classification_set_name",
    "encode_prompts",
    "evaluate_zeroshot",
    "fill_template",
    "is_hf_clip_dir",
    "load_hf_clip",
    "zeroshot_classifier",
    "zeroshot_logits",
    "zeroshot_title",
]
