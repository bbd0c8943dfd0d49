"""Where a model's scores sit, against the constants a loss assumes (docs/results.md).

Several losses carry constants in score units: GOAL's sigmoid pair weights are centred at
``lam = 0.5`` and its circle weight's offset makes the ``T = 1/2`` contour touch the line
``p = s_n`` at (0.5, 0.5) (docs/goal.md); VSL's smooth rank approximates a rank only when a
row's scores spread over much more than ``n * tau`` (docs/vsl.md). Whether a run is in the
regime its paper describes is a property of the scores the model produces, which this module
measures on batches like the training batches: ``B`` distinct images, one caption each (so the
positives are the diagonal).

* :func:`batch_spread`: one ``(B, B)`` similarity matrix to per-anchor quantities (positive,
  hardest negative, row width) in both directions, and, given a ``tau``, how well the smooth
  rank of Eq. (4) of VSL tracks the exact rank; given :class:`~vlret.losses.GoalParams`, each
  anchor's GOAL weights factor by factor (:func:`~vlret.losses.goal_anchor_weights`).
* :func:`summarise`: the per-anchor values of many batches to medians and quartiles.
* :func:`checkpoint_batches`: a ``vlret train`` checkpoint and a data folder to such
  batches (:class:`ScoredBatch`; two-tower models).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import NamedTuple

import torch

from ..losses import GoalParams, goal_anchor_weights, smooth_rank

#: A pairwise sigmoid of the smooth rank counts as saturated when its exponent ``|x| / tau``
#: is at least this (the sigmoid is then within 0.7% of 0 or 1).
SATURATION = 5.0
#: The quantiles :func:`summarise` reports, besides the median.
QUARTILES = (0.25, 0.75)


def _exact_rank(rows: torch.Tensor) -> torch.Tensor:
    """Descending rank within each row (largest entry 1), ties counting one half each way:
    the limit of the smooth rank as ``tau -> 0``."""
    greater = (rows[:, None, :] > rows[:, :, None]).sum(-1).to(rows.dtype)
    equal = (rows[:, None, :] == rows[:, :, None]).sum(-1).to(rows.dtype) - 1
    return 1 + greater + equal / 2


def batch_spread(
    sim: torch.Tensor,
    *,
    tau: float | None = None,
    goal: GoalParams | None = None,
) -> dict[str, torch.Tensor]:
    """Per-anchor quantities of one batch whose pairs are the diagonal of ``sim``.

    Args:
        sim: ``(B, B)`` similarities of ``B`` distinct images (rows) and one caption of each
            (columns), ``B >= 2``.
        tau: VSL's smooth-rank temperature: adds ``saturated`` (per anchor, the fraction of
            its row's pairwise sigmoids with ``|s_ik - s_ij| / tau >= 5``) and
            ``rank_error`` (per anchor, the mean absolute difference between the smooth rank
            of Eq. (4), descending, and the exact rank).
        goal: A GOAL combination: adds ``goal_triplet``, ``goal_pair_pos`` and
            ``goal_pair_neg`` (``T``, ``P+``, ``P-`` of each anchor's triplet).

    Returns:
        Each value ``(2, B)`` (row 0 the image anchors, rows of ``sim``; row 1 the text
        anchors, columns): ``positive`` (``p``), ``hardest`` (``s_n``, the largest
        non-diagonal entry), ``gap`` (``p - s_n``), ``width`` (the largest minus the
        smallest entry of the anchor's scores), and the keys above.

    Raises:
        ValueError: ``sim`` is not a square floating matrix of at least 2 x 2, or ``tau``
            is not positive.
    """
    if sim.dim() != 2 or sim.shape[0] != sim.shape[1] or sim.shape[0] < 2:
        raise ValueError(f"sim must be a square (B, B) matrix with B >= 2, got {tuple(sim.shape)}")
    if not sim.is_floating_point():
        raise ValueError(f"sim must be floating point, got {sim.dtype}")
    if tau is not None and not tau > 0:
        raise ValueError(f"tau must be positive, got {tau!r}")
    sim = sim.detach()
    n = sim.shape[0]
    both = torch.stack((sim, sim.t()))  # (2, B, B): each anchor's scores along the last axis
    eye = torch.eye(n, dtype=torch.bool, device=sim.device)
    positive = sim.diagonal().expand(2, n)
    hardest = both.masked_fill(eye, -torch.inf).amax(-1)
    out = {
        "positive": positive,
        "hardest": hardest,
        "gap": positive - hardest,
        "width": both.amax(-1) - both.amin(-1),
    }
    if tau is not None:
        rows = both.reshape(2 * n, n)
        diff = (rows[:, None, :] - rows[:, :, None]).abs() / tau
        off = ~torch.eye(n, dtype=torch.bool, device=sim.device)
        saturated = ((diff >= SATURATION) & off).sum((-1, -2)).to(sim.dtype) / (n * (n - 1))
        smooth = smooth_rank(rows, tau=tau, descending=True)
        error = (smooth - _exact_rank(rows)).abs().mean(-1)
        out["saturated"] = saturated.reshape(2, n)
        out["rank_error"] = error.reshape(2, n)
    if goal is not None:
        weights = goal_anchor_weights(sim, ~eye, goal)
        out["goal_triplet"] = weights["triplet"]
        out["goal_pair_pos"] = weights["pair_pos"]
        out["goal_pair_neg"] = weights["pair_neg"]
    return out


def summarise(batches: Sequence[Mapping[str, torch.Tensor]]) -> dict[str, float]:
    """The anchors of every batch pooled, per key and direction: the median and quartiles.

    Args:
        batches: :func:`batch_spread` results (the same keys in each).

    Returns:
        ``<direction>_<key>`` (the median), ``<direction>_<key>_q25`` and ``_q75``, with
        direction ``i2t`` (image anchors) and ``t2i`` (text anchors); ``n_anchors``.

    Raises:
        ValueError: No batches.
    """
    if not batches:
        raise ValueError("batches is empty: nothing to summarise")
    out: dict[str, float] = {}
    for key in batches[0]:
        pooled = torch.cat([b[key].double() for b in batches], dim=1)
        for row, direction in enumerate(("i2t", "t2i")):
            values = pooled[row]
            out[f"{direction}_{key}"] = float(values.quantile(0.5))
            for q in QUARTILES:
                out[f"{direction}_{key}_q{round(q * 100)}"] = float(values.quantile(q))
    out["n_anchors"] = float(sum(b["positive"].shape[1] for b in batches))
    return out


class ScoredBatch(NamedTuple):
    """One batch of :func:`checkpoint_batches`: ``sim[r, c]`` scores image ``images[r]``
    against caption ``captions[c]`` (indices into the split; ``captions[r]`` is one of image
    ``images[r]``'s)."""

    sim: torch.Tensor
    images: torch.Tensor
    captions: torch.Tensor


def checkpoint_batches(
    checkpoint: str | Path,
    *,
    data: str | Path,
    split: str = "train",
    batches: int = 20,
    batch_size: int = 128,
    seed: int = 0,
    max_images: int | None = 4096,
) -> Iterator[ScoredBatch]:
    """Scored batches of ``split`` for a two-tower checkpoint.

    Reads ``split`` of the data folder ``data`` as ``vlret eval`` does (the checkpoint's data
    settings; on the training split the run's noisy pairs stay noisy), limited to its first
    ``max_images`` images, encodes it once, then draws ``batches`` batches of ``batch_size``
    distinct images with one of each image's captions (seeded by ``seed``), scored with the
    run's scoring (cosine or dot).

    Raises:
        FileNotFoundError: A missing checkpoint or data folder.
        ValueError: A pair-scoring checkpoint, or fewer than ``batch_size`` images.
    """
    from ..data.formats import open_dataset
    from ..eval import TwoTowerScorer
    from ..models import PairScorer
    from ..run.builders import load_trained_model, with_training_noise
    from ..run.eval_data import eval_data_config

    if not Path(data).exists():
        raise FileNotFoundError(f"{data}: missing; expected the data folder of the {split} split")
    model, run, encoder = load_trained_model(checkpoint, device=torch.device("cpu"))
    if isinstance(model, PairScorer):
        raise ValueError(f"{checkpoint}: a pair-scoring model; score spread needs a two-tower one")
    settings = eval_data_config(run.data, data)
    dataset = open_dataset(
        settings,
        split,
        encoder=encoder,
        max_images=max_images,
        image_transform=getattr(model, "image_transform", None),
    )
    if split == settings.train_split:
        dataset = with_training_noise(settings, dataset)
    img, txt = TwoTowerScorer(model, scoring=run.scoring, device=torch.device("cpu")).embeddings(
        dataset
    )
    owner = torch.as_tensor(dataset.txt_to_img)
    if img.shape[0] < batch_size:
        raise ValueError(
            f"batch_size: {batch_size} images asked for, {split} has {img.shape[0]} "
            f"(max_images={max_images})"
        )
    order = torch.argsort(owner, stable=True)  # captions grouped by image
    counts = torch.bincount(owner, minlength=img.shape[0])
    starts = torch.cumsum(counts, 0) - counts
    if bool((counts[: img.shape[0]] == 0).any()):
        raise ValueError(f"{split}: an image without a caption; every image needs one")
    gen = torch.Generator().manual_seed(seed)
    for _ in range(batches):
        images = torch.randperm(img.shape[0], generator=gen)[:batch_size]
        pick = (torch.rand(batch_size, generator=gen) * counts[images]).long()
        captions = order[starts[images] + pick]
        yield ScoredBatch(img[images] @ txt[captions].t(), images, captions)


__all__ = [
    "QUARTILES",
    "SATURATION",
    "ScoredBatch",
    "batch_spread",
    "checkpoint_batches",
    "summarise",
]
