"""The synthetic world's extra metrics of a trained run, when the test data folder is a
synthetic world (:mod:`vlret.worlds`).
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path
from typing import Any

import torch

from ...eval import Evaluation, MatrixScorer
from ..tables import SYNTHETIC_KEYS
from .spec import EvalSettings, RunSpec


def evaluate_run(checkpoint: Path, spec: RunSpec, settings: EvalSettings) -> Evaluation:
    """A comparison run's test :class:`~vlret.eval.Evaluation` under ``settings`` (its
    protocol, split, data folder and batch size, on the run's device)."""
    from ...run.evaluate import run_evaluation

    return run_evaluation(
        checkpoint,
        data=settings.data or spec.config.data.root,
        split=settings.split,
        protocol=settings.protocol,
        batch_size=settings.batch_size,
        device=spec.config.train.device,
    )


def synthetic_root(data: str | Path) -> Path | None:
    """The synthetic world behind the data folder ``data`` (a folder with ``synthetic.json``;
    ``data`` may also be a Karpathy JSON inside it), else ``None``."""
    from ...worlds import META_FILE

    folder = Path(data)
    if folder.is_file():
        folder = folder.parent
    return folder if (folder / META_FILE).is_file() else None


def extras_world(settings: EvalSettings, spec: RunSpec) -> Path | None:
    """The synthetic world whose extras (:func:`synthetic_extras`) score the runs: the test
    data folder's (:func:`synthetic_root`), or ``None`` under a person-search protocol, whose
    identity-level metrics are the whole report (the extras score caption-level relevance of
    the retrieval worlds; ``vlret synth persons`` writes none of their side files)."""
    from ...eval import get_protocol

    if get_protocol(settings.protocol).relevance_kind.identities:
        return None
    return synthetic_root(settings.data or spec.config.data.root)


def _synthetic_split(root: Path, split: str) -> str | None:
    """Our split name of the evaluated ``split``: the same, or COCO's test / testall twin."""
    twins = {"test": ("test", "testall"), "testall": ("testall", "test")}
    for name in twins.get(split, (split,)):
        if (root / f"{name}_synth.npz").is_file():
            return name
    return None


def _as_embeddings(
    evaluation: Evaluation, scores: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """What :func:`~vlret.worlds.evaluate_synthetic` scores with ``img @ txt.T``: a
    two-tower run's embeddings as its evaluation scored them; otherwise the full score matrix
    ``S`` as the pair ``(I, S^T)`` (none of its metrics normalises, so ``img @ txt.T`` is
    exactly ``S``; the identity is ``N_img`` wide, the smaller side: 4 MB, not 1.6 GB, for
    1000 x 20000). ``S``: ``scores`` when the caller has the full matrix, else the
    evaluation's own when complete (not the COCO 1K fold blocks only), else scored again by
    the evaluation's scorer on its split."""
    if evaluation.embeddings is not None:
        return evaluation.embeddings
    shape = (evaluation.n_images, evaluation.n_texts)
    if scores is None or tuple(scores.shape) != shape:
        scores = evaluation.scores
    if scores is None or bool(scores.isnan().any()):
        scorer = evaluation.scorer
        if not isinstance(scorer, MatrixScorer):
            raise ValueError(
                f"evaluation: the synthetic extras need a score matrix; "
                f"{type(scorer).__name__} has none"
            )
        scores = scorer.scores(evaluation.data)
    return torch.eye(scores.shape[0], dtype=scores.dtype), scores.t()


def synthetic_extras(
    run: Evaluation | str | Path,
    *,
    root: Path,
    spec: RunSpec,
    settings: EvalSettings,
    scores: torch.Tensor | None = None,
) -> dict[str, Any] | None:
    """The synthetic world's extras of a trained run on the test split, through
    :func:`~vlret.worlds.evaluate_synthetic`: ``{"split", "metrics", "trials"}`` with
    the :data:`~vlret.analysis.tables.SYNTHETIC_KEYS` metrics (NaN as ``None``) and the
    forced-choice trial counts; ``None`` (with a warning) when the evaluated captions are not
    the world's split one to one (e.g. MSR-VTT 1k-A, one caption per test video).

    ``run``: the run's :class:`~vlret.eval.Evaluation` under ``settings`` (its split, scorer
    and embeddings or scores are reused), or a checkpoint, evaluated here
    (:func:`~vlret.run.evaluate.run_evaluation`). ``scores``: a cross-attention model's
    full test score matrix when the caller has it already."""
    from ...worlds import evaluate_synthetic, load_synthetic

    name = _synthetic_split(root, settings.split)
    if name is None:
        warnings.warn(f"{root}: no side files of split {settings.split!r}", stacklevel=2)
        return None
    evaluation = run if isinstance(run, Evaluation) else evaluate_run(Path(run), spec, settings)
    annotations = load_synthetic(root, name)
    if not torch.equal(
        torch.as_tensor(evaluation.data.txt_to_img, dtype=torch.long),
        torch.as_tensor(annotations.txt_to_img, dtype=torch.long),
    ):
        warnings.warn(
            f"{spec.variant.label} seed {spec.seed}: the {settings.protocol} {settings.split} "
            f"captions are not those of the synthetic split {name!r}; no synthetic extras",
            stacklevel=2,
        )
        return None
    img, txt = _as_embeddings(evaluation, scores)
    out = evaluate_synthetic(img, txt, annotations)
    ext, clone = out["extended"], out["clone"]
    metrics = {
        "clone_t2i": clone.t2i,
        "clone_i2t": clone.i2t,
        "t2i_rprecision": ext.t2i_rprecision,
        "t2i_map_at_r": ext.t2i_map_at_r,
        "i2t_rprecision": ext.i2t_rprecision,
        "i2t_map_at_r": ext.i2t_map_at_r,
        "secondary_t2i_r1": out["secondary_t2i_r1"],
    }
    for group, subset in out["subsets"].items():  # the recalls tabulated in SUBSET_COLUMNS
        for key, value in subset.as_dict().items():
            if f"{group}_{key}" in SYNTHETIC_KEYS:
                metrics[f"{group}_{key}"] = value
    return {
        "split": name,
        "metrics": {k: float(v) if math.isfinite(v) else None for k, v in metrics.items()},
        "trials": {
            "clone_t2i": clone.t2i_trials,
            "clone_i2t": clone.i2t_trials,
            "secondary_t2i": int((annotations.caption_form == 1).sum()),
            **{
                f"{group}_{d}": getattr(subset, f"{d}_queries")
                for group, subset in out["subsets"].items()
                for d in ("t2i", "i2t")
            },
        },
    }


__all__ = [
    "evaluate_run",
    "extras_world",
    "synthetic_extras",
    "synthetic_root",
]
