"""Zero-shot classification (the ``zeroshot-classification`` protocol): each image of a
class-labelled set against a classifier built from the class names and prompt templates, as
CLIP_benchmark computes it (:func:`vlret.eval.zeroshot.evaluate_zeroshot`, the machinery of
``vlret zeroshot``). Its relevance is the class label.

``vlret eval RUN_OR_CKPT --protocol zeroshot-classification --dataset NAME --data DIR`` runs
it on one model that reads pixels: a checkpoint or run folder of kind ``clip``, or
``--model-dir`` (a local Hugging Face CLIP). A run trained with a zero-shot check
(``[train] zeroshot_every``) gives the defaults: its ``zeroshot_dataset``, ``zeroshot_root``
and ``zeroshot_templates``. The split is the protocol's (``test``, each set's official test
split). ``--json`` writes vlret's record or (``--json-format clip_benchmark``)
CLIP_benchmark's ``zeroshot_classification`` record, the one ``vlret zeroshot --json``
writes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..clip_benchmark import architecture_name
from ..protocols import EvalProtocol
from ..protocols.zeroshot import ZEROSHOT_CLASSIFICATION
from ..zeroshot import (
    ZeroShotResult,
    classification_set_name,
    evaluate_zeroshot,
    zeroshot_title,
)
from .base import EvalRequest, EvalTask, Harness, PixelModel, TaskNeeds
from .registry import register_task

#: The data format of a class-labelled set in the protocol record's ``splits``.
CLASSIFICATION_FORMAT = "classification"


@dataclass(frozen=True)
class ZeroShotRun:
    """A zero-shot task's result: the :class:`~vlret.eval.zeroshot.ZeroShotResult` and the
    model it scored."""

    result: ZeroShotResult
    protocol: EvalProtocol
    pixel: PixelModel = field(repr=False)

    def table(self) -> str:
        """The title and the one-row table of acc1, acc5 and mean per-class recall (%)."""
        return self.result.table()

    def record(self, *, json_format: str = "vlret") -> dict[str, Any]:
        """CLIP_benchmark's ``zeroshot_classification`` record (``clip_benchmark``: as
        ``vlret zeroshot --json`` writes it), or vlret's: ``protocol``, ``split``, the
        checkpoint (``checkpoint``) or CLIP folder (``model_dir``), ``title``, ``dataset``,
        ``n_images``, ``n_classes``, ``n_templates`` and ``metrics`` (fractions; ``acc5``
        below five classes is ``null``)."""
        result, pixel = self.result, self.pixel
        if json_format == "clip_benchmark":
            return result.record(
                model=architecture_name(pixel.model),
                pretrained=str(pixel.path),
                source=pixel.source,
            )
        key = "checkpoint" if pixel.source == "vlret-checkpoint" else "model_dir"
        return {
            "protocol": self.protocol.name,
            "split": result.split,
            key: str(pixel.path),
            "title": result.title(),
            "dataset": result.dataset,
            "n_images": result.num_images,
            "n_classes": result.num_classes,
            "n_templates": result.num_templates,
            "metrics": {k: (None if math.isnan(v) else v) for k, v in result.metrics.items()},
        }


@dataclass(frozen=True)
class PreparedZeroShot:
    """The model, the set and its templates loaded and checked; nothing encoded yet."""

    protocol: EvalProtocol
    pixel: PixelModel = field(repr=False)
    data: Any = field(repr=False)
    templates: tuple[str, ...]
    batch_size: int
    num_workers: int
    progress: bool
    notes: tuple[str, ...] = ()
    #: why each default was taken (``model``, ``dataset``, ``data``, ``templates``)
    why: dict[str, str] = field(default_factory=dict)

    def summary(self) -> list[str]:
        """Model, data, split, protocol, the table's title and the set's size."""

        def why(key: str) -> str:
            return f" ({self.why[key]})" if key in self.why else ""

        data, pixel = self.data, self.pixel
        kind = "a local Hugging Face CLIP folder" if pixel.source == "hf-clip" else ""
        model = f"{pixel.path}{why('model')}" + (f" ({kind})" if kind else "")
        name = classification_set_name(data)
        n, c, t = len(data), len(data.classnames), len(self.templates)
        return [
            f"model: {model}",
            f"data: {name}{why('dataset')} in {data.root}{why('data')}",
            f"split: {data.split}",
            f"protocol: {self.protocol.name}",
            f"title: {zeroshot_title(name, data.split, n, c, t)}",
            f"size: {n} images x {c} classes, {t} templates{why('templates')}",
        ]

    def run(self) -> ZeroShotRun:
        """Build the classifier, encode the images, count the metrics."""
        pixel = self.pixel
        result = evaluate_zeroshot(
            pixel.model,
            self.data,
            list(self.templates),
            tokenizer=pixel.tokenizer,
            batch_size=self.batch_size,
            device=pixel.device,
            num_workers=self.num_workers,
            progress=self.progress,
        )
        return ZeroShotRun(result, self.protocol, pixel)


class ZeroShotTask(EvalTask):
    """Zero-shot classification of a class-labelled image set by one model."""

    options = ("dataset", "templates", "classnames", "num_workers")
    kind = "classification"

    def __init__(self, protocol: EvalProtocol) -> None:
        if not protocol.relevance_kind.classes:
            raise ValueError(
                f"protocol {protocol.name}: zero-shot classification ranks class labels; its "
                f"relevance is {protocol.relevance}"
            )
        super().__init__(protocol)

    @property
    def needs(self) -> TaskNeeds:
        """One pixel model, a class-labelled set, its class names and templates."""
        splits = "/".join(self.protocol.splits.get(CLASSIFICATION_FORMAT, ()))
        default = self.protocol.paper_splits[0]
        return TaskNeeds(
            model="one vlret checkpoint or run folder of a model that reads pixels (kind "
            "clip), or --model-dir (a local Hugging Face CLIP)",
            data="a class-labelled image set: --dataset NAME (imagenet1k, cifar10, cifar100, "
            "caltech101, food101, flowers102, pets, fgvc_aircraft, imagefolder) in --data DIR "
            "(default: the run's train.zeroshot_dataset and zeroshot_root)",
            split=f"{splits} (default: {default}; a set's test split is its official one)",
            classes="the set's class names (--classnames FILE replaces them) and prompt "
            "templates (--templates openai|NAME|FILE; default: the set's own)",
        )

    def prepare(self, request: EvalRequest, *, harness: Harness) -> PreparedZeroShot:
        """Check ``request``, load the model (:meth:`Harness.load_pixel_model`), the set and
        its templates (:mod:`vlret.data.classification`)."""
        from ...data import classification as sets

        self.check_options(request, flags={})
        if len(request.checkpoints) > 1:
            raise ValueError(
                f"RUN_OR_CKPT: zero-shot classification scores one model, got "
                f"{len(request.checkpoints)} (ensembles average retrieval score matrices)"
            )
        split = request.split or self.protocol.paper_splits[0]
        try:
            self.protocol.check_split(split, CLASSIFICATION_FORMAT)
        except ValueError as err:
            raise ValueError(f"--split: {err}") from None
        options = request.options
        num_workers = options.get("num_workers", 0)
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 0:
            raise ValueError(f"--num-workers must be >= 0, got {num_workers!r}")
        if request.data is not None and not Path(request.data).exists():
            raise FileNotFoundError(f"--data {request.data}: missing; expected the set's folder")
        pixel = harness.load_pixel_model(
            checkpoint=request.checkpoints[0] if request.checkpoints else None,
            model_dir=request.model_dir,
            device=request.device,
            default_preprocessing=request.default_preprocessing,
        )
        why: dict[str, str] = {"model": pixel.why} if pixel.why else {}
        run_set = str(pixel.train.get("zeroshot_dataset") or "")
        dataset = options.get("dataset") or run_set
        if not dataset:
            raise ValueError(
                "--dataset: required (imagenet1k, cifar10, ..., imagefolder); "
                f"{pixel.path} names no zero-shot set (train.zeroshot_dataset)"
            )
        from_run = dataset == run_set and "dataset" not in options
        if from_run:
            why["dataset"] = "the run's train.zeroshot_dataset"
        root = request.data
        if root is None and dataset == run_set and pixel.train.get("zeroshot_root"):
            root = Path(str(pixel.train["zeroshot_root"]))
            why["data"] = "the run's train.zeroshot_root"
        if root is None:
            raise ValueError(f"--data: required, the folder of the {dataset} set")
        data = sets.load_classification(
            dataset, root, split=split, classnames=options.get("classnames")
        )
        spec = options.get("templates")
        if spec is None and from_run and pixel.train.get("zeroshot_templates"):
            spec = str(pixel.train["zeroshot_templates"])
            why["templates"] = "the run's train.zeroshot_templates"
        if spec is not None:
            templates = sets.load_templates(spec)
        else:
            templates = sets.default_templates(dataset)
        taken = {"model": ("checkpoint", pixel.path), "dataset": ("dataset", dataset)}
        taken.update(data=("data", root), templates=("templates", spec))
        notes = tuple(
            f"{word}: {value} ({why[key]})" for key, (word, value) in taken.items() if key in why
        )
        return PreparedZeroShot(
            self.protocol,
            pixel,
            data,
            tuple(templates),
            batch_size=request.batch_size,
            num_workers=num_workers,
            progress=request.progress,
            notes=notes,
            why=why,
        )


ZEROSHOT = register_task(ZeroShotTask(ZEROSHOT_CLASSIFICATION))

__all__ = [
    "CLASSIFICATION_FORMAT",
    "ZEROSHOT",
    "PreparedZeroShot",
    "ZeroShotRun",
    "ZeroShotTask",
]
