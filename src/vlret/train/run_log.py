"""``metrics.jsonl``, the run's log: one JSON record per logging step and per epoch; and the
console's report of a run (the start-of-run summary, one line per epoch).

Epochs are numbered from 0, in ``metrics.jsonl`` (``epoch``, ``best_epoch``) and on the console
alike: ``epoch 2 (3/5)`` is the record with ``"epoch": 2``, the third of five epochs.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from .._files import WriteFailed, atomic_write_text, write_failure
from .context import TrainContext
from .pretrained_rate import pretrained_rate_warning

LOG_FILE = "metrics.jsonl"


def _plain(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def append_record(log: Path, record: dict[str, Any]) -> None:
    """Append one record (non-finite floats as ``null``).

    Raises:
        WriteFailed: The disk is full, the file size limit reached or the folder read-only
            (naming the log; a line cut short is dropped by the next resume's
            :func:`truncate_log`).
    """
    line = json.dumps({k: _plain(v) for k, v in record.items()}) + "\n"
    try:
        with open(log, "a", encoding="utf-8") as fh:
            fh.write(line)
    except OSError as err:
        _raise_named(err, log)
        raise


def _raise_named(err: OSError, path: Path) -> None:
    """Raise a write refused for room or permission as :class:`WriteFailed` naming ``path``
    (an append or a plain write names no file, or the wrong one); return otherwise."""
    if err.errno is not None and write_failure(err) is not None:
        raise WriteFailed(err.errno, path, kept=False) from err


def copy_log(source: Path, log: Path) -> None:
    """Start ``log`` as a copy of ``source`` (a run resumed into another folder)."""
    data = source.read_bytes()
    try:
        log.write_bytes(data)
    except OSError as err:
        _raise_named(err, log)
        raise


def truncate_log(log: Path, *, step: int, epoch: int) -> None:
    """Drop the records written after a checkpoint taken at ``step`` inside ``epoch`` (by a run
    killed before its next checkpoint), and a last line cut short by the kill."""
    if not log.is_file():
        return
    kept = []
    for line in log.read_text(encoding="utf-8").splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut by SIGKILL
        if rec.get("step", 0) <= step and not (
            rec.get("kind") == "epoch" and rec.get("epoch", -1) >= epoch
        ):
            kept.append(line)
    atomic_write_text(log, "".join(k + "\n" for k in kept))


#: Rows of one tile of :func:`batch_similarity_stats`' cosines: ``rows x B`` (bounded so that a
#: large batch, say B = 65536, never forms its ``B x B`` matrix on a logging step).
STATS_TILE_ELEMENTS = 2**24


def batch_similarity_stats(
    img_emb: torch.Tensor,
    txt_emb: torch.Tensor,
    ids: torch.Tensor,
    *,
    tile_elements: int = STATS_TILE_ELEMENTS,
) -> dict[str, float]:
    """Mean cosine of the positive pairs ``(j, j)`` and mean hardest-negative cosine over every
    image (row) and text (column) query (pairs of equal ``ids`` are no negatives), as
    :func:`~vlret.metrics.similarity_stats` of the cosine matrix; computed in row tiles of at
    most ``tile_elements`` cosines (at least one row; the columns' maxima carried across
    tiles), so memory is ``O(tile_elements)`` whatever the batch."""
    with torch.no_grad():
        img = F.normalize(img_emb.float(), dim=1)
        txt = F.normalize(txt_emb.float(), dim=1)
        n = txt.shape[0]
        rows = max(1, tile_elements // n)
        col_max = txt.new_full((n,), -math.inf)
        row_max, positives = [], []
        for start in range(0, img.shape[0], rows):
            block = img[start : start + rows] @ txt.t()
            positives.append(block.diagonal(offset=start).clone())  # before the mask
            block.masked_fill_(ids[start : start + rows, None] == ids[None, :], -math.inf)
            row_max.append(block.amax(dim=1))
            col_max = torch.maximum(col_max, block.amax(dim=0))
        hardest = torch.cat([*row_max, col_max])
        hardest = hardest[torch.isfinite(hardest)]  # a query without negatives has none
        return {
            "pos_sim": float(torch.cat(positives).mean()),
            "hardest_neg_sim": float(hardest.mean()) if hardest.numel() else float("nan"),
        }


def step_record(
    ctx: TrainContext, loss: float, context: dict[str, Any], rate: float
) -> dict[str, Any]:
    """The ``kind: step`` record of ``metrics.jsonl``: loss, learning rate, pairs per second,
    the positive and hardest-negative cosines of the batch (from the pair scorer's score
    matrix when the step's ``context`` holds one), the loss's own statistics, the training
    procedure's (``context["stats"]``, a callable returning them, called only on the logging
    steps: AOQ's ``aoq_weight_*``, Meta-SPN's ``metaspn_*``) and the AMP loss scale."""
    from ..run.pair_scoring import score_stats

    record: dict[str, Any] = {
        "kind": "step",
        "epoch": ctx.epoch,
        "step": ctx.step,
        "loss": loss,
        "lr": context["lr"],
        "pairs_per_s": rate,
    }
    if "sim" in context:
        record.update(score_stats(context["sim"], context["ids"]))
    elif "batch_stats" in context:  # gradient caching: taken before the re-encoding
        record.update(context["batch_stats"])
    else:
        record.update(batch_similarity_stats(context["img"], context["txt"], context["ids"]))
    record.update({f"loss_{k}": v for k, v in ctx.loss_fn.last_stats.items()})
    if "stats" in context:
        record.update(context["stats"]())
    if ctx.scaler.is_enabled():
        record["amp_scale"] = float(ctx.scaler.get_scale())
    return record


def epoch_record(
    ctx: TrainContext,
    epoch: int,
    *,
    train_loss: float,
    seconds: float,
    dev: dict[str, float | None] | None,
    skipped: int | None,
    dev_loss: float | None = None,
) -> dict[str, Any]:
    """The ``kind: epoch`` record of ``metrics.jsonl``: the training loss, with a dev set the
    dev loss beside it (``dev_loss``, :mod:`.dev_loss`; ``null`` when not computed), the
    learning rate, the time, the selection (``select_on``, the dev metric ``best.pt``
    maximises; its best value as ``best_metric`` and again as ``best_<select_on>``, e.g.
    ``best_rsum`` or ``best_identity_t2i_r1``; ``best_epoch``), the dev metrics with a
    ``dev_`` prefix, the epoch's bad training samples skipped as ``skipped`` (a training set
    that skips them: :func:`vlret.data.bad_samples.counts_skipped`) and, for a dev set that
    leaves its bad samples out when it is read (:mod:`vlret.data.bad_samples`), their count
    as ``dev_skipped``."""
    name = ctx.select_on
    dev_skipped = getattr(ctx.dev_set, "skipped", None)
    return {
        "kind": "epoch",
        "epoch": epoch,
        "step": ctx.step,
        "train_loss": train_loss,
        **({"dev_loss": dev_loss} if dev is not None else {}),
        "lr": ctx.optimizer.param_groups[0]["lr"],
        "time_s": seconds,
        "select_on": name,
        "best_metric": ctx.best_metric,
        f"best_{name}": ctx.best_metric,
        "best_epoch": ctx.best_epoch,
        **({f"dev_{k}": v for k, v in dev.items()} if dev else {}),
        **({"skipped": skipped} if skipped is not None else {}),
        **({"dev_skipped": dev_skipped} if isinstance(dev_skipped, int) else {}),
    }


def selected_value(dev: dict[str, float | None] | None, select_on: str) -> float | None:
    """The dev value of ``select_on`` (None without validation); a dev record without that
    key (a model whose validation does not compute it) is an error naming it."""
    if dev is None:
        return None
    value = dev.get(select_on)
    if value is None:
        raise ValueError(
            f"train.select_on = {select_on!r}: the dev metrics hold no such key (they hold "
            f"{', '.join(sorted(dev))})"
        )
    return float(value)


def epoch_line(ctx: TrainContext, record: dict[str, Any], *, dev_value: float | None) -> str:
    """:func:`epoch_summary` of the epoch ``record`` (:func:`epoch_record`) of the run ``ctx``."""
    return epoch_summary(
        record["epoch"],
        ctx.config.train.epochs,
        train_loss=record["train_loss"],
        dev_loss=record.get("dev_loss"),
        dev_value=dev_value,
        best_value=record["best_metric"],
        best_epoch=record["best_epoch"],
        seconds=record["time_s"],
        skipped=record.get("skipped"),
        dev_skipped=record.get("dev_skipped"),
        select_on=record["select_on"],
    )


def epoch_summary(
    epoch: int,
    epochs: int,
    *,
    train_loss: float,
    dev_value: float | None,
    best_value: float | None,
    best_epoch: int | None,
    seconds: float,
    skipped: int | None = None,
    select_on: str = "rsum",
    dev_loss: float | None = None,
    dev_skipped: int | None = None,
) -> str:
    """The line printed after each epoch: ``epoch 2 (3/5): loss 0.81, dev loss 0.93, dev
    identity_t2i_r1 31.20 (best 31.20 at epoch 2), 4.1 s``; ``dev_loss``: the training loss
    on the dev split (:mod:`.dev_loss`; shown when computed); ``dev_value`` / ``best_value``:
    this epoch's and the best dev value of ``select_on``, the metric ``best.pt`` maximises;
    ``epoch`` and ``best_epoch`` count from 0, as the epoch records of ``metrics.jsonl`` do;
    ``skipped``: the bad training samples skipped in the epoch (shown where they are counted);
    ``dev_skipped``: the bad samples the dev set left out (shown when there are any: the dev
    set is read once, so the count is the same every epoch; ``metrics.jsonl`` records it)."""
    line = f"epoch {epoch} ({epoch + 1}/{epochs}): loss {train_loss:.4g}"
    if dev_loss is not None:
        line += f", dev loss {dev_loss:.4g}"
    if dev_value is not None:
        best = f"{best_value:.2f}" if best_value is not None else "-"
        at = f" at epoch {best_epoch}" if best_epoch is not None else ""
        line += f", dev {select_on} {dev_value:.2f} (best {best}{at})"
    if skipped is not None:
        line += f", {_plural(skipped, 'bad sample')} skipped"
    if dev_skipped:
        line += f", {_plural(dev_skipped, 'bad dev sample')} left out"
    return f"{line}, {seconds:.1f} s"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _sizes(dataset: Any) -> str:
    """A split's size for the start-of-run summary, with where it was read from (a CSV's rows
    against its lines) and the bad samples a dev set left out."""
    if hasattr(dataset, "shards"):  # a shard stream (vlret.data.formats.shards): no size on disk
        shards = _plural(len(dataset.shards), "shard")
        return f"{_plural(dataset.num_samples, 'sample')} (data.train_num_samples) from {shards}"
    line = f"{_plural(dataset.num_images, 'image')} / {_plural(dataset.num_captions, 'caption')}"
    source = getattr(dataset, "source_summary", None)
    if isinstance(source, str):
        line += f" from {source}"
    skipped = getattr(dataset, "skipped", None)
    if isinstance(skipped, int) and skipped:
        line += f" ({_plural(skipped, 'bad sample')} left out)"
    return line


def run_summary(ctx: TrainContext) -> str:
    """The lines a :class:`~vlret.train.Trainer` (its ``ctx``) prints when a run starts: device and
    processes, the splits' sizes, steps per epoch and the batch (``train.batch_size`` is the
    global batch: each of the ``world`` processes takes ``batch_size / world``), the epochs
    (numbered from 0) and the output folder."""
    tc, world, dev_set = ctx.config.train, ctx.world_size, ctx.dev_set
    batch_size, epochs, warmup_epochs = tc.batch_size, tc.epochs, tc.all_negatives_epochs
    steps_per_epoch = ctx.steps_per_epoch
    processes = "1 process" if world == 1 else f"{world} processes (torchrun)"
    dev = f"dev {_sizes(dev_set)}" if dev_set is not None else "no dev set (best.pt = last epoch)"
    per_rank = batch_size // world
    batch = f"batch {batch_size}" + (
        f" ({per_rank} per process x {world} processes)" if world > 1 else ""
    )
    last = max(epochs - 1, 0)
    span = f"{_plural(epochs, 'epoch')}, numbered {'0-' if last else ''}{last} as in {LOG_FILE}"
    if warmup_epochs >= epochs > 0:
        span += "; all-negatives warm-up in every epoch"
    elif warmup_epochs:
        first = f"epochs 0-{warmup_epochs - 1}" if warmup_epochs > 1 else "epoch 0"
        span += (
            f"; all-negatives warm-up in {first}, the hardest negative from epoch {warmup_epochs}"
        )
    if ctx.epoch:
        span += f"; resuming in epoch {ctx.epoch}"
    lines = [
        f"run: device {ctx.device}, {processes}",
        f"  data: train {_sizes(ctx.train_set)}, {dev}",
        f"  steps: {_plural(steps_per_epoch, 'step')} per epoch, {batch}",
        f"  epochs: {span}",
        f"  output: {ctx.output_dir}",
    ]
    if ctx.procedure != tc.procedure:  # "standard" resolved by the loss's and model's needs
        why = f"train.procedure {tc.procedure!r} resolved by what the loss and the model need"
        lines.insert(-1, f"  procedure: {ctx.procedure} ({why})")
    elif ctx.procedure != "standard":
        lines.insert(-1, f"  procedure: {ctx.procedure}")
    warning = pretrained_rate_warning(ctx.config)
    if warning is not None:
        lines.append(f"  warning: {warning}")
    return "\n".join(lines)
