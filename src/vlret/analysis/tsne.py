"""A t-SNE of a model's image and text embeddings (AdaCL Fig. 3b-c), ``vlret plot
tsne RUN --split dev``.

:func:`tsne_plot` loads a run's ``best.pt`` (or a checkpoint), samples ``samples`` images of
the split (without replacement, seeded) and one caption of each (its matched pair), encodes
both with the model (L2-normalised when the model scores by cosine, the space its scores
compare; raw for ``dot``), and runs scikit-learn's :class:`~sklearn.manifold.TSNE` on the
images and texts together, so the two modalities share one map.

Colours: on a synthetic world (:mod:`vlret.worlds`; its ``{split}_synth.npz`` side
file next to the data) each point is drawn in the style of its image's **primary object
category** (``square``, ``circle``, ...: the first object of the scene), the group a retrieval
model should cluster: a colour of ten told apart, with a marker shape as the second cue past
ten groups (:func:`vlret.analysis._plotting.series_styles`); images filled, texts hollow. The
legend stands beside the map. Elsewhere points are coloured by modality and a thin line joins
each matched image-text pair (their distance on the map is the alignment AdaCL Fig. 3 shows).

A pair-scoring model (SCAN, BFAN, SGRAF: a :class:`~vlret.models.PairScorer`) has no single
vector per image or caption, and AdaCL Fig. 3b-c maps "the fused embedding" of such models
without defining it. Read here as the **pooled token embedding** each model fuses: an image's
point is the mean of its encoded regions (``encode_images``: the region features after the
model's projection into the space the cross attention compares) and a caption's point the mean
of its encoded words (``encode_texts``, the ``token_lengths`` real rows, padding left out), both
L2-normalised (the scorers compare tokens by cosine). It is the same space for every pair
model, computed once per item with no partner, so images and captions land on one map as a
two-tower model's do; a caption-conditioned (cross-attended) image vector was not taken, as it
is defined per pair, differs between SCAN's, BFAN's and SGRAF's attention, and would put an
image at a different point for each caption. The JSON's ``embedding`` says which was mapped:
``"joint"`` (two-tower) or ``"pooled tokens"`` (pair model).

Written: the PNG, ``FILE.csv`` with one row per point (``modality``, ``image``: the split's
image index, ``caption``: the caption index of a text, empty for an image, ``group``, ``x``,
``y``) and ``FILE.json`` with the settings, the counts and the t-SNE's final KL divergence.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Subset

from .._extras import require
from .._files import atomic_write_text
from ..models import PairScorer
from ..run.eval_members import run_checkpoint  # a run folder's best.pt (else last.pt)
from ._plotting import legend_outside, new_figure, require_matplotlib, save_figure, series_styles

#: The group the points are coloured by on a synthetic world.
GROUP_KIND = "primary object category"
#: A run split's name -> the synthetic world's split names it may be (Karpathy ``val``,
#: MSR-VTT ``validate`` and the ``dev`` alias are the world's ``dev``).
_WORLD_SPLITS = {
    "dev": ("dev",),
    "val": ("dev",),
    "validate": ("dev",),
    "test": ("test", "testall"),
    "testall": ("testall",),
    "train": ("train",),
}


@dataclass
class TsnePoints:
    """The 2-D map: one row per point, images first then their captions in the same order."""

    xy: np.ndarray
    modality: list[str]
    image: list[int]
    caption: list[int | None]
    group: list[str | None]
    settings: dict[str, Any] = field(default_factory=dict)

    def counts(self) -> dict[str, int]:
        """Points per modality."""
        return {m: self.modality.count(m) for m in ("image", "text")}


def world_groups(root: str | Path, split: str, num_images: int) -> list[str] | None:
    """The primary object category of each image of ``split`` of the synthetic world at
    ``root``, or ``None`` when ``root`` holds no world side file of that split, or one of
    another number of images."""
    from ..worlds.language import CATEGORIES

    for name in _WORLD_SPLITS.get(split, (split,)):
        path = Path(root) / f"{name}_synth.npz"
        if path.is_file():
            with np.load(path) as z:
                scenes = z["scenes"]
            if len(scenes) != num_images:
                return None
            return [CATEGORIES[int(c)][0] for c in scenes[:, 0, 0]]
    return None


def sample_pairs(txt_to_img: Any, *, samples: int, seed: int) -> tuple[list[int], list[int]]:
    """``min(samples, images)`` images drawn without replacement (sorted) and one caption of
    each (drawn among its captions), seeded by ``seed``."""
    t2i = np.asarray(torch.as_tensor(txt_to_img), dtype=np.int64)
    n_images = int(t2i.max()) + 1 if len(t2i) else 0
    rng = np.random.default_rng(seed)
    images = sorted(rng.choice(n_images, size=min(samples, n_images), replace=False).tolist())
    captions_of: dict[int, list[int]] = {}
    for j, i in enumerate(t2i.tolist()):
        captions_of.setdefault(i, []).append(j)
    captions = [int(rng.choice(captions_of[i])) for i in images]
    return images, captions


def pooled_tokens(tokens: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
    """A pair model's point per item (module docstring): the mean of the first ``rows[n]``
    rows of ``tokens[n]`` (``(N, T, D)``; every row when ``rows`` is ``None``), L2-normalised;
    ``(N, D)``."""
    if rows is None:
        mean = tokens.mean(dim=1)
    else:
        rows = torch.as_tensor(rows, device=tokens.device)
        keep = torch.arange(tokens.shape[1], device=tokens.device)[None, :] < rows[:, None]
        summed = (tokens * keep[..., None].to(tokens.dtype)).sum(dim=1)
        mean = summed / rows.clamp(min=1)[:, None].to(tokens.dtype)
    return F.normalize(mean, dim=1)


def _encode(model: Any, view: Any, index: list[int], device: Any, batch_size: int, images: bool):
    loader = DataLoader(Subset(view, index), batch_size=batch_size, collate_fn=view.collate)
    pairs = isinstance(model, PairScorer)
    out = []
    with torch.no_grad():
        for batch in loader:
            if images:
                feats = batch[0].to(device) if hasattr(batch[0], "to") else batch[0]
                emb = model.encode_images(feats).float()
                out.append((pooled_tokens(emb) if pairs else emb).cpu())
            else:
                caps, lengths = batch[0], batch[1]
                caps = caps.to(device) if isinstance(caps, torch.Tensor) else caps
                emb = model.encode_texts(caps, lengths).float()
                if pairs:
                    emb = pooled_tokens(emb, model.token_lengths(lengths))
                out.append(emb.cpu())
    return torch.cat(out)


def tsne_points(
    checkpoint: str | Path,
    *,
    split: str = "dev",
    samples: int = 500,
    perplexity: float = 30.0,
    seed: int = 0,
    data: str | Path | None = None,
    device: str = "auto",
    batch_size: int = 256,
) -> TsnePoints:
    """Sample, encode and map a split's images and captions (module docstring).

    Args:
        checkpoint: A run folder (its ``best.pt``) or a checkpoint.
        split: The split of the run's data (``dev``: precomp dev, Karpathy val).
        samples: Images drawn (and as many captions, one per image).
        perplexity: t-SNE's perplexity; less than the number of points.
        seed: The draw's and the t-SNE's seed.
        data: The data folder (default: the run's ``data.root``).
        device: Where the model encodes.
        batch_size: Items per encoding batch.

    Raises:
        FileNotFoundError: No checkpoint or data folder.
        ValueError: A bad ``samples`` / ``perplexity``.
        MissingExtra: scikit-learn is not installed.
    """
    from ..data.formats import open_dataset
    from ..run.builders import load_trained_model
    from ..run.devices import resolve_device
    from ..run.eval_data import eval_data_config, stored_eval_data

    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 2:
        raise ValueError(f"samples: expected an integer >= 2, got {samples!r}")
    if not perplexity > 0:
        raise ValueError(f"perplexity: expected a positive number, got {perplexity!r}")
    manifold = require("sklearn.manifold", "the t-SNE of vlret plot tsne")
    path = run_checkpoint(checkpoint)
    dev = resolve_device(device)
    model, run, encoder = load_trained_model(path, device=dev)
    pairs = isinstance(model, PairScorer)
    root = Path(data) if data is not None else Path(run.data.root)
    config = eval_data_config(stored_eval_data(run.data), root)
    dataset = open_dataset(
        config, split, encoder=encoder, image_transform=getattr(model, "image_transform", None)
    )
    images, captions = sample_pairs(dataset.txt_to_img, samples=samples, seed=seed)
    n_points = 2 * len(images)
    if perplexity >= n_points:
        raise ValueError(
            f"perplexity: {perplexity:g} must be less than the number of points, {n_points} "
            f"({len(images)} images and their captions)"
        )
    model.eval()
    img = _encode(model, dataset.images(), images, dev, batch_size, images=True)
    txt = _encode(model, dataset.texts(), captions, dev, batch_size, images=False)
    if not pairs and getattr(model, "scoring", "cosine") == "cosine":
        img, txt = F.normalize(img, dim=1), F.normalize(txt, dim=1)
    points = torch.cat([img, txt]).double().numpy()
    tsne = manifold.TSNE(
        n_components=2, perplexity=float(perplexity), init="pca", random_state=seed
    )
    xy = tsne.fit_transform(points)
    groups_of = world_groups(config.root, split, dataset.num_images)
    group = [groups_of[i] if groups_of else None for i in images]
    return TsnePoints(
        xy=np.asarray(xy, dtype=np.float64),
        modality=["image"] * len(images) + ["text"] * len(images),
        image=images + images,
        caption=[None] * len(images) + list(captions),
        group=group + group,
        settings={
            "checkpoint": str(path),
            "split": split,
            "data": str(config.root),
            "samples": samples,
            "perplexity": float(perplexity),
            "seed": seed,
            "scoring": getattr(model, "scoring", "cosine"),
            "model": run.model.get("kind"),
            "embedding": "pooled tokens" if pairs else "joint",
            "groups": GROUP_KIND if groups_of else None,
            "kl_divergence": float(getattr(tsne, "kl_divergence_", float("nan"))),
        },
    )


def write_tsne(points: TsnePoints, out: str | Path) -> list[Path]:
    """Draw ``points`` to the PNG ``out`` and write ``out`` with ``.csv`` and ``.json``
    suffixes beside it (module docstring); returns the three paths."""
    require_matplotlib("the t-SNE plot")
    out = Path(out)
    fig = new_figure((9.0, 6.5), layout="constrained")
    ax = fig.subplots()
    is_img = np.array([m == "image" for m in points.modality])
    n = int(is_img.sum())
    xy = points.xy
    if points.settings.get("groups"):
        names = sorted({g for g in points.group if g is not None})
        style_of = dict(zip(names, series_styles(len(names)), strict=True))
        for g in names:  # images filled, texts hollow, in the group's colour and marker
            color, marker = style_of[g]
            mine = np.array([x == g for x in points.group])
            ax.scatter(*xy[mine & is_img].T, color=color, marker=marker, s=30, label=g)
            ax.scatter(
                *xy[mine & ~is_img].T, facecolors="none", edgecolors=color, marker=marker, s=30
            )
        other = np.array([x not in style_of for x in points.group])
        if other.any():  # points of no group (none on a world's split): grey
            ax.scatter(*xy[other].T, color="0.5", marker=".", s=20, label="no group")
        ax.scatter([], [], color="0.3", marker="o", label="image (filled)")
        ax.scatter([], [], facecolors="none", edgecolors="0.3", marker="o", label="text (hollow)")
        title = f"by {GROUP_KIND}; images filled, texts hollow"
    else:
        for a, b in zip(xy[:n], xy[n:], strict=True):
            ax.plot([a[0], b[0]], [a[1], b[1]], color="0.75", linewidth=0.5, zorder=0)
        ax.scatter(xy[is_img, 0], xy[is_img, 1], color="tab:blue", marker="o", s=22, label="image")
        ax.scatter(xy[~is_img, 0], xy[~is_img, 1], color="tab:red", marker="x", s=22, label="text")
        title = "images o, texts x; lines join matched pairs"
    legend_outside(fig, *ax.get_legend_handles_labels(), where="right upper")
    ax.set_xticks([])
    ax.set_yticks([])
    s = points.settings
    ax.set_title(
        f"t-SNE of {n} images and {n} captions ({s.get('split')}), perplexity "
        f"{s.get('perplexity', 0):g}\n{title}",
        fontsize=10,
    )
    png = save_figure(fig, out)
    table = out.with_suffix(".csv")
    rows = io.StringIO(newline="")  # written whole, atomically, under the output-path rule
    writer = csv.writer(rows)
    writer.writerow(["modality", "image", "caption", "group", "x", "y"])
    for i in range(len(points.modality)):
        cap = points.caption[i]
        writer.writerow(
            [
                points.modality[i],
                points.image[i],
                "" if cap is None else cap,
                points.group[i] or "",
                repr(float(xy[i, 0])),
                repr(float(xy[i, 1])),
            ]
        )
    atomic_write_text(table, rows.getvalue())
    meta = out.with_suffix(".json")
    atomic_write_text(meta, json.dumps({**s, "points": points.counts()}, indent=2) + "\n")
    return [png, table, meta]


def tsne_plot(checkpoint: str | Path, out: str | Path | None = None, **options: Any) -> list[Path]:
    """:func:`tsne_points` then :func:`write_tsne`; ``out`` defaults to
    ``tsne_<split>.png`` in the run folder (the checkpoint's folder)."""
    require_matplotlib("vlret plot tsne")
    points = tsne_points(checkpoint, **options)
    if out is None:
        where = Path(checkpoint) if Path(checkpoint).is_dir() else Path(checkpoint).parent
        out = where / f"tsne_{points.settings['split']}.png"
    return write_tsne(points, out)


__all__ = [
    "GROUP_KIND",
    "TsnePoints",
    "run_checkpoint",
    "sample_pairs",
    "tsne_plot",
    "tsne_points",
    "world_groups",
    "pooled_tokens",
    "write_tsne",
]
