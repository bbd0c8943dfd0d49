"""The synthetic world's extra metrics of a trained run, when the test data folder is a
synthetic world (:mod:`vlret.data.synthetic`).
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path
from typing import Any

import torch

from ..tables import SYNTHETIC_KEYS
from .spec import EvalSettings, RunSpec


def synthetic_root(data: str | Path) -> Path | None:
    """The synthetic world behind the data folder ``data`` (a folder with ``synthetic.json``;
    ``data`` may also be a Karpathy JSON inside it), else ``None``."""
    from ...data.synthetic import META_FILE

    folder = Path(data)
    if folder.is_file():
        folder = folder.parent
    return folder if (folder / META_FILE).is_file() else None


def _synthetic_split(root: Path, split: str) -> str | None:
    """Our split name of the evaluated ``split``: the same, or COCO's test / testall twin."""
    twins = {"test": ("test", "testall"), "testall": ("testall", "test")}
    for name in twins.get(split, (split,)):
        if (root / f"{name}_synth.npz").is_file():
            return name
    return None


def _pair_scores_as_embeddings(
    model: torch.nn.Module, dataset: Any, batch_size: int, device: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """A pair-scoring model's ``(N_img, N_txt)`` score matrix ``S`` as the embedding pair
    ``(I, S^T)``: every metric of :func:`~vlret.data.synthetic.evaluate_synthetic` scores with
    ``img @ txt.T``, which is then exactly ``S`` (none of them normalises); the identity is
    ``N_img`` wide, the smaller side of a retrieval split."""
    from ...eval import encode_tokens, score_matrix

    regions, texts = encode_tokens(model, dataset, batch_size=batch_size, device=device)
    sim = score_matrix(model, regions, texts, device=device)
    return torch.eye(sim.shape[0], dtype=sim.dtype), sim.t()


def synthetic_extras(
    checkpoint: Path,
    *,
    root: Path,
    spec: RunSpec,
    settings: EvalSettings,
    scores: torch.Tensor | None = None,
) -> dict[str, Any] | None:
    """The synthetic world's extras of a trained run on the test split, through
    :func:`~vlret.data.synthetic.evaluate_synthetic`: ``{"split", "metrics", "trials"}`` with
    the :data:`~vlret.analysis.tables.SYNTHETIC_KEYS` metrics (NaN as ``None``) and the
    forced-choice trial counts; ``None`` (with a warning) when the evaluated captions are not
    the world's split one to one (e.g. MSR-VTT 1k-A, one caption per test video). ``scores``:
    a cross-attention model's full test score matrix when the caller has it already (else
    the pairs are scored here)."""
    from ...data.synthetic import evaluate_synthetic, load_synthetic
    from ...eval import get_protocol
    from ...models import PairScorer
    from ...train.builders import build_dataset, eval_data_config
    from ...train.evaluate import encode_dataset, load_trained_model

    name = _synthetic_split(root, settings.split)
    if name is None:
        warnings.warn(f"{root}: no side files of split {settings.split!r}", stacklevel=2)
        return None
    device = spec.config.train.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    model, config, encoder = load_trained_model(checkpoint, device=device)
    ds_protocol = get_protocol(settings.protocol).data_protocol
    dataset = build_dataset(
        eval_data_config(config.data, settings.data or config.data.root),
        settings.split,
        encoder,
        protocol=ds_protocol,
        image_transform=getattr(model, "image_transform", None),
    )
    annotations = load_synthetic(root, name)
    if not torch.equal(
        torch.as_tensor(dataset.txt_to_img, dtype=torch.long),
        torch.as_tensor(annotations.txt_to_img, dtype=torch.long),
    ):
        warnings.warn(
            f"{spec.variant.label} seed {spec.seed}: the {settings.protocol} {settings.split} "
            f"captions are not those of the synthetic split {name!r}; no synthetic extras",
            stacklevel=2,
        )
        return None
    if isinstance(model, PairScorer):
        if scores is not None and scores.shape == (dataset.num_images, dataset.num_captions):
            # img @ txt.T is the score matrix; the identity on the smaller side keeps this
            # (N_img, N_img) rather than (N_txt, N_txt): 4 MB, not 1.6 GB, for 1000 x 20000
            img, txt = torch.eye(scores.shape[0], dtype=scores.dtype), scores.t()
        else:
            img, txt = _pair_scores_as_embeddings(model, dataset, settings.batch_size, device)
    else:
        img, txt = encode_dataset(
            model,
            dataset,
            batch_size=settings.batch_size,
            device=device,
            normalize=config.scoring == "cosine",
        )
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
    "synthetic_extras",
    "synthetic_root",
]
