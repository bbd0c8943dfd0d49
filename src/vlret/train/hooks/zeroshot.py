"""A zero-shot classification check during training (``[train] zeroshot_every``, open_clip's
``--zeroshot-frequency``).

Its ``[train]`` keys: ``zeroshot_every`` (epochs between checks; 0, the default: off),
``zeroshot_dataset`` (a :mod:`vlret.data.classification` name: ``cifar10``, ``imagefolder``,
...), ``zeroshot_root`` (its folder), ``zeroshot_split`` (default ``test``) and
``zeroshot_templates`` (``openai``, a data set's name or a file; ``""``, the default: the data
set's own list). The model must read pixels (kind ``clip``).

:class:`ZeroShotEvery` classifies a class-labelled set (:mod:`vlret.data.classification`)
with the model being trained, as ``vlret zeroshot`` does (:func:`vlret.eval.zeroshot.
evaluate_zeroshot`), after every ``every``-th epoch and after the last one (open_clip's rule),
on rank 0, and appends one record to ``metrics.jsonl``::

    {"kind": "zeroshot", "epoch": 3, "step": 1200, "dataset": "cifar10", "split": "test",
     "zeroshot_acc1": 0.41, "zeroshot_acc5": 0.88, "zeroshot_mean_per_class_recall": 0.40}

The record follows the epoch's own record and checkpoints (``after_epoch``); it carries the
epoch's last step, so a resume keeps it (:func:`vlret.train.run_log.truncate_log`). The check
uses no random numbers (its loader has its own generator) and restores the model's training
mode, so a run with it trains exactly as one without.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Mapping, Sequence
from typing import Any

from ..._modules import unwrap_model
from ...eval.zeroshot import ClassificationData, evaluate_zeroshot
from ...run.config import ConfigError
from ..context import TrainContext
from ..run_log import LOG_FILE, append_record
from .core import TrainHook

#: the ``kind`` of the records this hook writes to metrics.jsonl
RECORD_KIND = "zeroshot"


class ZeroShotEvery(TrainHook):
    """Zero-shot classification of ``data`` after every ``every``-th epoch and the last.

    Args:
        data: The labelled images (``None`` on ranks other than 0: they do nothing).
        templates: Prompt templates with a ``{c}`` placeholder.
        every: Epochs between checks (positive).
        batch_size: Images (prompts) per batch.
        num_workers: DataLoader workers decoding the images.
    """

    def __init__(
        self,
        data: ClassificationData | None,
        templates: Sequence[str],
        *,
        every: int,
        batch_size: int = 64,
        num_workers: int = 0,
    ) -> None:
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"every must be a positive integer, got {every!r}")
        self.data = data
        self.templates = list(templates)
        self.every = every
        self.batch_size = batch_size
        self.num_workers = num_workers

    @classmethod
    def from_config(cls, ctx: TrainContext) -> ZeroShotEvery:
        """The hook ``ctx.config.train`` asks for; rank 0 reads the data set now, so a
        wrong folder stops the run before its first epoch.

        Raises:
            ConfigError: The model does not read pixels, or the data set or templates cannot
                be read (naming the ``train.zeroshot_*`` key).
        """
        config = ctx.config
        tc, source = config.train, config.source
        if getattr(unwrap_model(ctx.model), "image_transform", None) is None:
            raise ConfigError(
                source,
                "train.zeroshot_every",
                "zero-shot classification needs a model that reads images (kind clip); this "
                "model encodes precomputed features",
            )
        data, templates = None, []
        if ctx.is_main:
            sets = importlib.import_module("vlret.data.classification")
            try:
                data = sets.load_classification(
                    tc.zeroshot_dataset,
                    tc.zeroshot_root,
                    split=tc.zeroshot_split,
                    max_pixels=config.data.max_image_pixels,  # the run's cap
                )
            except (FileNotFoundError, ValueError) as err:
                raise ConfigError(source, "train.zeroshot_root", str(err)) from None
            try:
                spec = tc.zeroshot_templates
                templates = sets.load_templates(spec) if spec else sets.default_templates(data.name)
            except (FileNotFoundError, ValueError) as err:
                raise ConfigError(source, "train.zeroshot_templates", str(err)) from None
        return cls(
            data,
            templates,
            every=tc.zeroshot_every,
            batch_size=tc.eval_batch_size,
            num_workers=config.data.num_workers,
        )

    def due(self, epochs_done: int, epochs: int) -> bool:
        """Whether the check runs after ``epochs_done`` of ``epochs`` epochs."""
        return epochs_done % self.every == 0 or epochs_done == epochs

    def after_epoch(self, ctx: TrainContext, record: Mapping[str, Any]) -> None:
        if not ctx.is_main or self.data is None:
            return
        if not self.due(ctx.epoch, ctx.config.train.epochs):
            return
        result = evaluate_zeroshot(
            ctx.model,
            self.data,
            self.templates,
            tokenizer=ctx.encoder,
            batch_size=self.batch_size,
            device=ctx.device,
            num_workers=self.num_workers,
        )
        line = {
            "kind": RECORD_KIND,
            "epoch": record.get("epoch", ctx.epoch - 1),
            "step": ctx.step,
            "dataset": result.dataset,
            "split": result.split,
            **{f"zeroshot_{k}": v for k, v in result.metrics.items()},
        }
        append_record(ctx.output_dir / LOG_FILE, line)
        if ctx.print_fn is not None:
            ctx.print_fn(summary_line(line))


def summary_line(record: Mapping[str, Any]) -> str:
    """``epoch 3: zero-shot cifar10 test: acc1 41.00%, acc5 88.00%, mean per-class recall ...``"""

    def pct(key: str) -> str:
        value = record[f"zeroshot_{key}"]
        return "-" if value is None or math.isnan(value) else f"{100 * value:.2f}%"

    return (
        f"epoch {record['epoch']}: zero-shot {record['dataset']} {record['split']}: "
        f"acc1 {pct('acc1')}, acc5 {pct('acc5')}, "
        f"mean per-class recall {pct('mean_per_class_recall')}"
    )


__all__ = ["RECORD_KIND", "ZeroShotEvery", "summary_line"]
