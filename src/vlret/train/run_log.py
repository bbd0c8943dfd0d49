"""``metrics.jsonl``, the run's log: one JSON record per logging step and per epoch."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from .._files import atomic_write_text
from ..metrics import similarity_stats

LOG_FILE = "metrics.jsonl"


def _plain(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def append_record(log: Path, record: dict[str, Any]) -> None:
    """Append one record (non-finite floats as ``null``)."""
    with open(log, "a", encoding="utf-8") as fh:
        fh.write(json.dumps({k: _plain(v) for k, v in record.items()}) + "\n")


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


def batch_similarity_stats(
    img_emb: torch.Tensor, txt_emb: torch.Tensor, ids: torch.Tensor
) -> dict[str, float]:
    """Mean cosine of the positive pairs and mean hardest-negative cosine (both directions)."""
    with torch.no_grad():
        sim = F.normalize(img_emb.float(), dim=1) @ F.normalize(txt_emb.float(), dim=1).t()
    diagonal = torch.arange(sim.shape[1], device=sim.device)
    return similarity_stats(sim, txt_to_img=diagonal, pos_mask=ids[:, None] == ids[None, :])


def epoch_summary(
    epoch: int,
    epochs: int,
    *,
    train_loss: float,
    dev_rsum: float | None,
    best_rsum: float | None,
    best_epoch: int | None,
    seconds: float,
) -> str:
    """The line printed after each epoch (0-based ``epoch``, printed 1-based)."""
    line = f"epoch {epoch + 1}/{epochs}: loss {train_loss:.4g}"
    if dev_rsum is not None:
        best = f"{best_rsum:.2f}" if best_rsum is not None else "-"
        at = f" at epoch {best_epoch + 1}" if best_epoch is not None else ""
        line += f", dev rsum {dev_rsum:.2f} (best {best}{at})"
    return f"{line}, {seconds:.1f} s"
