"""`vlret demo`: the quick demo, or a loss comparison on a synthetic world.

* ``vlret demo`` (no ``--preset``; a few seconds): every registered loss on a seeded batch
  (value and gradient norm), then the retrieval metrics of a seeded toy problem
  (:func:`run_demo`).
* ``vlret demo --preset tiny|small``: :func:`run_comparison_demo` writes the synthetic world of
  the preset (reused when the folder already holds it with the same settings), then compares
  triplet-HN, InfoNCE, Unified, GOAL (cir, sig-ms), VSL and AdaCL, each with its paper's
  hyper-parameters, on the same model (the packaged configs ``vlret/configs/demo_*.toml``),
  and returns a :class:`DemoResult` (the comparison report: table, CSV, JSON, plots).

=========  ===========================================================  ===================
preset     world / schedule                                             2 CPU cores (wall)
=========  ===========================================================  ===================
``tiny``   synthetic ``tiny`` (240 / 40 / 40 images x 5 captions),      ~50 s
           batch 32, 10 epochs (5 of them warm-up), 1 seed
``small``  synthetic ``f30k-like`` cut to 6000 train and 500 dev         ~5.5 min, 0.6 GB RAM
           images (its 1000-image test split is the f30k-like one),
           batch 128, 6 epochs (2 of them warm-up), 1 seed
           (``make demo``)
=========  ===========================================================  ===================

Triplet-HN, GOAL and VSL (triplet-HN base) get VSE-infinity's all-negatives warm-up
(``train.all_negatives_epochs`` in the configs' ``[train]``; :mod:`vlret.train.warmup`), the
other three losses have no hardest-negative phase to warm up.

Layout of OUT (default ``runs/demo``): ``data-{preset}/`` (the world), ``demo_{preset}.yaml``
(the resolved comparison config: ``vlret compare`` on it reproduces the numbers) and
``{preset}-e{epochs}/`` (the comparison; finished runs are reused, as with ``vlret compare``).
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .losses import available_losses, build_loss, loss_class
from .metrics import coco_5fold_metrics, retrieval_metrics
from .semantic import CaptionTfidf

_OBJECTS = ("dog", "cat", "horse", "bicycle", "kite", "boat", "pizza", "train", "clock", "bench")
_COLOURS = ("red", "blue", "green", "white", "black", "yellow")
_PLACES = ("street", "beach", "kitchen", "park", "field", "table", "river")


def demo_batch(batch_size: int, dim: int, seed: int):
    """Paired embeddings in which every 4th text is a second caption of the previous image."""
    g = torch.Generator().manual_seed(seed)
    img_ids = torch.arange(batch_size) - (torch.arange(batch_size) % 4 == 3).long()
    latent = torch.randn(batch_size, dim, generator=g)
    img = latent[img_ids] + 2.5 * torch.randn(batch_size, dim, generator=g)
    txt = latent[img_ids] + 2.5 * torch.randn(batch_size, dim, generator=g)
    return img, txt, img_ids


def demo_captions(img_ids: torch.Tensor, seed: int) -> dict[int, list[str]]:
    """Five template captions per image id, sharing objects and places across images."""
    g = torch.Generator().manual_seed(seed + 1)

    def pick(words):
        return words[int(torch.randint(len(words), (1,), generator=g))]

    captions = {}
    for image in sorted(set(img_ids.tolist())):
        obj, colour, place = pick(_OBJECTS), pick(_COLOURS), pick(_PLACES)
        captions[image] = [
            f"a {colour} {obj} in the {place}",
            f"the {obj} near a {pick(_OBJECTS)} on the {place}",
            f"{colour} {obj} standing by the {place}",
            f"a photo of a {obj}",
            f"there is a {pick(_COLOURS)} {pick(_OBJECTS)} at the {place}",
        ]
    return captions


def build_demo_loss(name: str, img_ids: torch.Tensor, seed: int) -> nn.Module:
    """The registered loss with its defaults; VSL gets a TF-IDF fitted on the demo captions."""
    if name == "vsl":
        return build_loss(name, semantic=CaptionTfidf().fit(demo_captions(img_ids, seed)))
    return build_loss(name)


def loss_rows(
    batch_size: int = 64, dim: int = 128, seed: int = 0
) -> list[tuple[str, float, float]]:
    """(name, loss value, gradient norm w.r.t. both embeddings) for every registered loss."""
    rows = []
    for name in available_losses():
        img, txt, img_ids = demo_batch(batch_size, dim, seed)
        img.requires_grad_(True)
        txt.requires_grad_(True)
        loss = build_demo_loss(name, img_ids, seed)
        loss.train()
        value = loss(img, txt, img_ids=img_ids)
        value.backward()
        grad_norm = torch.cat([img.grad.flatten(), txt.grad.flatten()]).norm()
        rows.append((name, float(value.detach()), float(grad_norm)))
    return rows


def synthetic_problem(n_img: int, per_image: int, dim: int, noise: float, seed: int):
    """Unit-norm image embeddings; each caption is its image plus Gaussian noise."""
    g = torch.Generator().manual_seed(seed)
    img = torch.nn.functional.normalize(torch.randn(n_img, dim, generator=g), dim=1)
    txt_to_img = torch.arange(n_img).repeat_interleave(per_image)
    txt = img[txt_to_img] + noise * torch.randn(len(txt_to_img), dim, generator=g) / dim**0.5
    return img, torch.nn.functional.normalize(txt, dim=1), txt_to_img


def run_demo(seed: int = 0, print_fn: Callable[[str], None] = print) -> None:
    start = time.perf_counter()
    print_fn("vlret demo: every registered loss on one seeded batch (B=64, D=128,")
    print_fn("every 4th text a second caption of the previous image, masked as a positive)\n")
    print_fn(f"{'loss':<18} {'paper':<40} {'value':>10} {'|grad|':>9}")
    for name, value, grad in loss_rows(seed=seed):
        paper = getattr(loss_class(name), "paper", "")[:40]
        print_fn(f"{name:<18} {paper:<40} {value:>10.4f} {grad:>9.4f}")

    print_fn("\nSynthetic retrieval: 1000 images x 5 captions, D=256, caption = image + noise")
    print_fn("(recalls in %, ties count against the query)\n")
    print_fn(
        f"{'setting':<22} {'i2t R@1':>7} {'R@5':>6} {'R@10':>6} {'t2i R@1':>8} "
        f"{'R@5':>6} {'R@10':>6} {'rsum':>7}"
    )

    def line(label, m):
        print_fn(
            f"{label:<22} {m.i2t_r1:7.1f} {m.i2t_r5:6.1f} {m.i2t_r10:6.1f} {m.t2i_r1:8.1f} "
            f"{m.t2i_r5:6.1f} {m.t2i_r10:6.1f} {m.rsum:7.1f}"
        )

    for noise in (2.0, 4.0, 8.0):
        img, txt, t2i = synthetic_problem(1000, 5, 256, noise, seed)
        line(f"noise {noise:g}", retrieval_metrics(img, txt, t2i))
    g = torch.Generator().manual_seed(seed)
    _, _, t2i = synthetic_problem(1000, 5, 256, 1.0, seed)
    line(
        "random embeddings",
        retrieval_metrics(
            torch.randn(1000, 256, generator=g), torch.randn(5000, 256, generator=g), t2i
        ),
    )
    line(
        "collapsed (all equal)",
        retrieval_metrics(torch.ones(1000, 256), torch.ones(5000, 256), t2i),
    )
    img, txt, t2i = synthetic_problem(5000, 5, 256, 6.0, seed)
    line("5K, noise 6", retrieval_metrics(img, txt, t2i))
    line("5-fold 1K, noise 6", coco_5fold_metrics(img, txt, t2i))
    print_fn(f"\ndone in {time.perf_counter() - start:.1f} s")


# --------------------------------------------------------------------------------------------
# The comparison demo on a synthetic world
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DemoPreset:
    """A synthetic world (preset and :class:`~vlret.data.synthetic.SyntheticConfig`
    overrides) and the packaged comparison config trained on it."""

    name: str
    world: str
    world_overrides: dict[str, Any] = field(default_factory=dict)
    description: str = ""

    @property
    def config_name(self) -> str:
        return f"demo_{self.name}.toml"


DEMO_PRESETS: dict[str, DemoPreset] = {
    "tiny": DemoPreset(
        "tiny",
        "tiny",
        description="synthetic tiny world (240/40/40 images), 10 epochs, 1 seed",
    ),
    "small": DemoPreset(
        "small",
        "f30k-like",
        {"splits": {"train": 6000, "dev": 500, "test": 1000}},
        description="f30k-like world cut to 6000 train / 500 dev images (the f30k-like "
        "1000-image test split), 6 epochs, 1 seed",
    ),
}
WORLD_SEED = 0


def demo_config_text(preset: str) -> str:
    """The packaged comparison config of ``preset`` (``vlret/configs/demo_{preset}.toml``)."""
    from importlib import resources

    return (resources.files("vlret") / "configs" / DEMO_PRESETS[preset].config_name).read_text(
        encoding="utf-8"
    )


def ensure_world(
    preset: str, root: str | Path, print_fn: Callable[[str], None] = print
) -> tuple[Path, bool]:
    """Write the synthetic world of ``preset`` to ``root``, or reuse it when ``root`` already
    holds the same world (preset, seed, config, format, no noise); ``(root, written)``."""
    from .data.synthetic import META_FILE, get_preset, write_synthetic

    p = DEMO_PRESETS[preset]
    root = Path(root)
    want = {
        "preset": p.world,
        "format": "precomp",
        "seed": WORLD_SEED,
        "noise": None,
        "config": json.loads(json.dumps(asdict(get_preset(p.world, **p.world_overrides)))),
    }
    meta_path = root / META_FILE
    if meta_path.is_file():
        try:
            meta = json.loads(meta_path.read_text(encoding="utf-8"))
        except json.JSONDecodeError:
            meta = {}
        if {k: meta.get(k) for k in want} == want:
            print_fn(f"data: {root} (reused)")
            return root, False
    start = time.perf_counter()
    write_synthetic(
        p.world,
        root,
        format="precomp",
        seed=WORLD_SEED,
        overwrite=meta_path.is_file(),  # an earlier demo world with other settings
        **p.world_overrides,
    )
    print_fn(f"data: {root} (written in {time.perf_counter() - start:.1f} s)")
    return root, True


def write_demo_config(
    preset: str,
    path: str | Path,
    *,
    data_root: Path,
    epochs: int | None = None,
    seed: int | None = None,
) -> Path:
    """The packaged config of ``preset`` pointed at ``data_root`` (and its feature size), with
    the optional ``train.epochs`` / ``train.seed``, written as YAML to ``path``."""
    import sys

    import yaml

    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib

    raw = tomllib.loads(demo_config_text(preset))
    meta = json.loads((data_root / "synthetic.json").read_text(encoding="utf-8"))
    hint = meta["train_config_hint"]
    raw["data"].update(hint["data"])
    raw["model"]["image"]["in_dim"] = hint["image_in_dim"]
    if epochs is not None:
        raw["train"]["epochs"] = epochs
    if seed is not None:
        raw["train"]["seed"] = seed
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    header = (
        f"# vlret demo --preset {preset}: resolved from the packaged "
        f"{DEMO_PRESETS[preset].config_name}\n"
    )
    path.write_text(header + yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")
    return path


@dataclass
class DemoResult:
    report: Any  # ComparisonReport
    config: Path
    data: Path
    seconds: float
    seeds: int
    command: str = ""


def run_comparison_demo(
    preset: str = "tiny",
    *,
    out: str | Path = "runs/demo",
    epochs: int | None = None,
    seeds: int | None = None,
    seed: int | None = None,
    losses: Sequence[str] | None = None,
    fresh: bool = False,
    progress: bool = True,
    print_fn: Callable[[str], None] = print,
) -> DemoResult:
    """Synthesize ``preset``'s world under ``out`` (or reuse it), then run the comparison of
    its packaged config; ``epochs`` / ``seeds`` / ``seed`` (first training seed) / ``losses``
    override the config's, ``fresh`` deletes an earlier comparison folder of the same
    settings first."""
    import shlex

    from .analysis.compare import compare, read_compare_config

    if preset not in DEMO_PRESETS:
        raise ValueError(f"preset must be one of {', '.join(DEMO_PRESETS)}, got {preset!r}")
    start = time.perf_counter()
    out = Path(out)
    data, written = ensure_world(preset, out / f"data-{preset}", print_fn=print_fn)
    if written:  # runs trained on an earlier world in the same folder would be reused
        for stale in sorted(out.glob(f"{preset}-e*")):
            if (stale / "runs").is_dir():
                shutil.rmtree(stale)
                print_fn(f"removed {stale} (trained on an earlier world)")
    config = write_demo_config(
        preset, out / f"demo_{preset}.yaml", data_root=data, epochs=epochs, seed=seed
    )
    raw, section = read_compare_config(config)
    n_epochs = raw["train"]["epochs"]
    n_seeds = seeds if seeds is not None else section.get("seeds", 1)
    cmp_dir = out / f"{preset}-e{n_epochs}"
    if fresh and cmp_dir.exists():
        shutil.rmtree(cmp_dir)
    print_fn(f"comparison: {cmp_dir} ({n_seeds} seed(s), {n_epochs} epochs)")
    report = compare(config, losses=losses, seeds=n_seeds, out=cmp_dir, progress=progress)
    argv = ["vlret", "compare", str(config), "--seeds", str(n_seeds), "--out", str(cmp_dir)]
    if losses is not None:
        argv += ["--losses", ",".join(losses)]
    return DemoResult(
        report=report,
        config=config,
        data=data,
        seconds=time.perf_counter() - start,
        seeds=n_seeds,
        command=" ".join(shlex.quote(a) for a in argv),
    )
