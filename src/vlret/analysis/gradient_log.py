"""The gradient analysis over training: a per-batch log and its figure (Unified paper Sec. 3.3).

* :class:`GradientLog`, a training hook (``vlret train --log-gradients N``, or
  ``Trainer(config, hooks=[GradientLog(every=N)])``): every ``N`` steps, from the first, it
  splits the gradient of the run's loss on the step's batch into the tangent components of
  :mod:`vlret.analysis.gradients` and appends one record to ``gradients.jsonl`` in the run
  folder::

      {"kind": "gradients", "epoch": 0, "step": 1, "loss": "triplet", "terms": "anchor",
       "batch": 32, "i2t_positive": 0.91, "i2t_negatives": 0.66, "i2t_tangent": 1.19,
       "i2t_radial": 0.68, "i2t_on_negatives": 0.66, "i2t_tangent_sum": 1.19,
       "i2t_pos_sim": 0.02, "i2t_hardest_neg_sim": 0.71, "t2i_positive": ..., ...}

  Each value is the mean over the batch's anchors (images for ``i2t_``, texts for ``t2i_``).
  The embeddings are the step's own (the forward pass before the optimiser's update), detached;
  the analysis runs in float64 on a copy of nothing the run keeps (the loss's state, mode and
  the random generators are restored), so a run with the log trains exactly as one without.
  Under torchrun, rank 0 logs its local batch. A resumed run drops the records after its
  checkpoint's step; a fresh run starts the file empty.
* :func:`read_gradient_log` and :func:`plot_gradient_curves`: the figure of ``vlret plot
  gradients RUN [RUN ...] --out FIG.png``: one panel per component against steps, one colour
  per run, I->T solid and T->I dashed, and a last panel with the batches' positive and
  hardest-negative cosines (the condition under which Sec. 3.3 expects Triplet-HN's gradient
  to vanish; cf. Fig. 4).

The paper's Fig. 1-2 are diagrams of one moment (the arrows of the gradients on the sphere);
this figure follows the lengths of those arrows through a run.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from .._files import atomic_write_text
from ..train.context import TrainContext
from ..train.hooks.core import StepOutput, TrainHook
from ..train.run_log import append_record, truncate_log
from ._plotting import legend_outside, new_figure, save_figure, series_styles
from .curves import _key
from .epoch_curves import run_labels
from .gradients import COMPONENTS, DIRECTIONS, TERMS, check_analysable, gradient_record

#: The run folder's gradient log.
GRADIENT_LOG = "gradients.jsonl"
#: The ``kind`` of its records.
RECORD_KIND = "gradients"
#: The figure's default name in the run folder (one run, no ``--out``).
GRADIENT_FIGURE = "gradients.png"
#: The panel titles of the components (:data:`vlret.analysis.gradients.COMPONENTS`).
TITLES = {
    "positive": "tangent pull of the positive",
    "negatives": "tangent push of the negatives",
    "tangent": "tangent gradient |g(v_i)| (Eq. 11 / 17)",
    "radial": "radial part (removed by normalisation)",
    "on_negatives": "on the negatives |g(t_j)| (Eq. 12 / 18)",
    "tangent_sum": "Eq. 17 literally (sum of norms)",
}


class GradientLog(TrainHook):
    """Append the tangent components of the loss's gradient on every ``every``-th step's batch
    (from the first step) to ``gradients.jsonl`` (module docstring).

    Args:
        every: Steps between records (positive).
        terms: ``"anchor"`` (each anchor's own terms, Sec. 3.3's reading) or ``"all"``
            (the whole loss); see :func:`vlret.analysis.gradients.gradient_components`.

    Raises:
        ValueError: A bad ``every`` or ``terms``; from :meth:`on_fit_start`, a loss that
            cannot be analysed or a run that keeps no embeddings (gradient caching).
    """

    def __init__(self, *, every: int, terms: Literal["anchor", "all"] = "anchor") -> None:
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"every must be a positive integer, got {every!r}")
        if terms not in TERMS:
            raise ValueError(f"terms must be one of {', '.join(TERMS)}, got {terms!r}")
        self.every = every
        self.terms: Literal["anchor", "all"] = terms

    def due(self, step: int) -> bool:
        """Whether the step numbered ``step`` (from 1) is logged: 1, 1 + every, ..."""
        return (step - 1) % self.every == 0

    def on_fit_start(self, ctx: TrainContext) -> None:
        check_analysable(ctx.loss_fn)
        if ctx.config.train.grad_cache_chunk:
            raise ValueError(
                "the gradient log needs each step's embeddings, which gradient caching "
                "(train.grad_cache_chunk) does not keep"
            )
        if not ctx.is_main:
            return
        log = ctx.output_dir / GRADIENT_LOG
        if ctx.step == 0:
            atomic_write_text(log, "")
        else:
            truncate_log(log, step=ctx.step, epoch=ctx.epoch)

    def after_step(self, ctx: TrainContext, step: StepOutput) -> None:
        if not ctx.is_main or not self.due(ctx.step):
            return
        img, txt = step.context.get("img"), step.context.get("txt")
        if img is None or txt is None:
            raise ValueError(
                "the gradient log needs the step's embeddings: a model that scores pairs "
                "(SCAN, SGRAF) has none"
            )
        ids = step.context.get("ids")
        fields = gradient_record(ctx.loss_fn, img, txt, img_ids=ids, terms=self.terms)
        record = {"kind": RECORD_KIND, "epoch": ctx.epoch, "step": ctx.step, **fields}
        append_record(ctx.output_dir / GRADIENT_LOG, record)


def read_gradient_log(path: str | Path) -> list[dict[str, Any]]:
    """The records of a run's ``gradients.jsonl``, in order (a line cut by a kill skipped).

    Args:
        path: The log, or the run folder holding it.

    Raises:
        FileNotFoundError: No log there (the run was trained without ``--log-gradients``).
        ValueError: The log holds no gradient record.
    """
    path = Path(path)
    if path.is_dir():
        path = path / GRADIENT_LOG
    if not path.is_file():
        raise FileNotFoundError(
            f"{path}: no gradient log (train the run with vlret train --log-gradients N)"
        )
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(rec, dict) and rec.get("kind") == RECORD_KIND and "step" in rec:
            records.append(rec)
    if not records:
        raise ValueError(f"{path}: no gradient record in the log")
    return records


def step_series(records: Sequence[Mapping[str, Any]], key: str) -> tuple[list[int], list[float]]:
    """``(steps, values)`` of ``key`` over the records that hold a finite value of it."""
    steps, values = [], []
    for rec in records:
        value = rec.get(key)
        if isinstance(value, int | float) and math.isfinite(value):
            steps.append(int(rec["step"]))
            values.append(float(value))
    return steps, values


def plot_gradient_curves(
    run_dirs: Sequence[str | Path], out: str | Path, *, relative: bool = False
) -> Path:
    """Draw the gradient components of each run against steps (``vlret plot gradients``).

    Args:
        run_dirs: Run folders (or their ``gradients.jsonl``); each is one colour, labelled
            with its name and its loss.
        out: The PNG file to write.
        relative: Divide each line by its largest value, so runs whose losses have different
            scales (a ``"mean"`` reduction, VLC's factor gamma) compare by shape.

    Returns:
        ``out``.

    Raises:
        FileNotFoundError: A run has no gradient log.
        ValueError: A log without records, or a folder given twice.
        ImportError: matplotlib is not installed.
    """
    logs = {}
    for label, path in run_labels(run_dirs).items():
        recs = read_gradient_log(path)
        logs[f"{label} ({recs[-1].get('loss', '?')})"] = recs
    shown = [c for c in COMPONENTS if any(f"i2t_{c}" in r for rs in logs.values() for r in rs)]
    fig = new_figure((16.0, 7.5), layout="constrained")
    axes = fig.subplots(2, 4).ravel()
    styles = series_styles(len(logs))
    unit = " / its max" if relative else ""
    for ax, component in zip(axes, shown, strict=False):
        for (color, marker), (label, recs) in zip(styles, logs.items(), strict=True):
            for direction, line in zip(DIRECTIONS, ("-", "--"), strict=True):
                steps, values = step_series(recs, f"{direction}_{component}")
                if relative and values and max(values) > 0:
                    values = [v / max(values) for v in values]
                shown_marker = marker if len(steps) < 30 else None
                ax.plot(steps, values, line, color=color, marker=shown_marker, label=label)
        ax.set_title(TITLES[component] + unit, fontsize=9)
    sims = axes[len(shown)]
    for (color, _), recs in zip(styles, logs.values(), strict=True):
        for key, line in (("pos_sim", "-"), ("hardest_neg_sim", ":")):
            sims.plot(*step_series(recs, f"i2t_{key}"), line, color=color)
    sims.set_title("I->T cosine: positive (solid), hardest negative (dotted)", fontsize=9)
    for ax in axes[len(shown) + 1 :]:
        ax.set_axis_off()
    for ax in axes[: len(shown) + 1]:
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    handles = [_key(c, None) for c, _ in styles] + [_key("black", None, s) for s in ("-", "--")]
    legend_outside(fig, handles, [*logs, "I->T (image anchors)", "T->I (text anchors)"])
    fig.suptitle(
        "Tangent components of the loss's gradient per anchor, batch means (Unified Sec. 3.3)"
    )
    return save_figure(fig, Path(out))


__all__ = [
    "GRADIENT_FIGURE",
    "GRADIENT_LOG",
    "RECORD_KIND",
    "GradientLog",
    "plot_gradient_curves",
    "read_gradient_log",
    "step_series",
]
