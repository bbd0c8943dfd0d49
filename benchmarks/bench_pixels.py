"""From pixels (issue 27, deliverable 7): input pipeline, gradient-caching memory, GPU throughput.

Three measurements, each a ratio taken side by side in one run, the machine printed first:

(1) **Input pipeline images/s against its bound.** The benchmark writes ``--images`` JPEGs
    (``--size`` px square, smooth random colour fields plus noise, quality 90, so they compress
    like photos rather than like noise or flat colour) into ``--shards`` tar shards in the
    img2dataset layout (``KEY.jpg``, ``KEY.txt``, ``KEY.json``; webdataset's ``TarWriter``).

    * pipeline: the real training input path, :class:`vlret.data.formats.shards.ShardStream` read
      through :class:`~vlret.data.formats.shards.ShardLoader` with ``--workers`` DataLoader
      workers, a
      shuffle buffer of ``--shuffle-buffer``, ``train_transform = "random_resized_crop"`` as
      open_clip sets it (scale (0.9, 1.0), bicubic) on CLIP's eval transform
      ``CLIPImageTransform(224)`` and the preset's byte tokenizer: tar reading, grouping,
      decoding, crop + resize, tokenising, collating and the hand-over of the uint8 batches to
      the main process (the normalisation, two float32 operations per value, runs where the
      batch goes: ``RetrievalBatch.to`` on the device);
    * bound: the same tar files read by a ``multiprocessing.Pool`` of as many processes
      (one task per shard), each JPEG opened, decoded, resized to 224 x 224 (bicubic) and
      turned into a uint8 array, nothing handed back but a count.

    Both are timed from the start of the processes to the last image, in turn (order
    alternating) for ``--rounds`` rounds; the ratio is the median of the per-round ratios.
    Target: pipeline >= 0.8x the bound. When it is missed (or with ``--profile``) one worker's
    share is run in this process under ``cProfile`` and the functions that take the time are
    printed.

(2) **Peak memory of gradient caching with a ViT-B/32-sized tower.** The Trainer's own
    ``train_step`` (forward, tiled InfoNCE with a learnable temperature, backward, clipping,
    AdamW with no decay on norms / biases / the temperature) of a CLIP built from the
    ``ViT-B-32`` preset with random weights (real widths: vision 768, patch 32, 224 px; text
    512, 77 tokens, bytes), on one batch read from the shards of (1), in two forms:

    * ``gc``: ``train.grad_cache_chunk = C`` at batch B;
    * ``plain``: no gradient caching at batch C.

    Each runs in a fresh subprocess; after building the trainer, reading the batch and one
    warm-up step on C items (which creates AdamW's state), the peak of one step beyond that is
    recorded as in ``bench_grad_cache.py``: peak RSS (``VmHWM``, reset through
    ``/proc/self/clear_refs``) minus the RSS before the step, the heap's free pages handed back
    first; on CUDA ``max_memory_allocated`` minus the allocated bytes before the step.
    Target: gc B=4096 / plain B=128 <= 1.3x. ViT-B/32 at B=4096 takes hours on two CPU cores,
    so the default (``--quick``) keeps the real widths, the chunk C=128 and the image size but
    runs ``--layers 2`` layers per tower and B=512: the chunk's activations and the gradients
    both scale with the layers, so their balance (what the ratio measures) is the full model's;
    what a larger B adds (the B x 512 embeddings, their gradients, the loss's O(128 x B) strips)
    is printed. ``--full``: 12 layers, B=4096, C=128 (the issue's sizes).

(3) **GPU pre-training throughput** (only when ``torch.cuda.is_available()``; otherwise skipped
    with the reason printed): the full ViT-B/32 CLIP (``--gpu-patch 16``: ViT-B/16, the same
    widths with 16-pixel patches), ``train.amp = --gpu-amp`` (bf16 default),
    ``--gpu-batch`` per step (256, as LAION's ViT-B/32 runs per GPU), pre-collated batches on
    the GPU (data loading excluded), ``--gpu-steps`` timed steps after 3 warm-up steps;
    samples/s against LAION's published 400-850 samples/s per A100 for open_clip ViT-B/32.
    The device is printed.

Usage (from the repository root)::

    .venv/bin/python benchmarks/bench_pixels.py [--quick | --full] [--parts 1 2 3]
        [--images 2000] [--shards 2 x workers] [--size 256] [--workers 2] [--batch 50] [--rounds 3]
        [--shuffle-buffer 1000] [--profile] [--layers 2] [--gc-batch 512] [--chunk 128]
        [--gpu-batch 256] [--gpu-steps 20] [--gpu-amp bf16|fp16|none] [--timeout 3600]
        [--device auto|cpu|cuda|cuda:N] [--json FILE]

``--device`` (default ``auto``: CUDA when there is one) is where (2) and (3) run; (3) needs CUDA.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import multiprocessing
import os
import platform
import pstats
import statistics
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import machine  # noqa: E402
from bench_grad_cache import peak_of_step  # noqa: E402
from vlret.data.formats.shards import ShardStream  # noqa: E402
from vlret.data.transforms import RandomResizedCrop  # noqa: E402
from vlret.models.clip import CLIPByteTokenizer, CLIPImageTransform  # noqa: E402

TARGET_RATE, TARGET_MEM = 0.8, 1.3
LAION_A100 = (400.0, 850.0)  # open_clip ViT-B/32 samples/s per A100 (LAION's published runs)
CROP = 224
MB, GB = 1024**2, 1024**3
WORDS = "a red blue green small large dog cat car tree house on the in near with two".split()


# ----------------------------------------------------------------------------- the machine


def machine_line() -> str:
    import PIL

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return (
        f"CPU {machine.cpu_name()}, {cores} cores usable ({os.cpu_count()} online), torch "
        f"{torch.__version__} ({torch.get_num_threads()} threads), Pillow {PIL.__version__}, "
        f"Python {platform.python_version()}"
    )


# ----------------------------------------------------------------------------- (1) shards


def photo_like(rng: np.random.Generator, size: int) -> np.ndarray:
    """A ``size`` x ``size`` RGB uint8 picture: a smooth random colour field plus noise."""
    from PIL import Image

    coarse = rng.integers(0, 256, size=(6, 6, 3), dtype=np.uint8)
    smooth = np.asarray(Image.fromarray(coarse).resize((size, size), Image.Resampling.BICUBIC))
    noisy = smooth.astype(np.float32) + rng.normal(0.0, 12.0, size=smooth.shape)
    return np.clip(noisy, 0, 255).astype(np.uint8)


def write_shards(folder: Path, images: int, shards: int, size: int, seed: int = 0) -> list[str]:
    """``images`` JPEGs in ``shards`` img2dataset-style tar files; returns their paths."""
    import webdataset
    from PIL import Image

    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    per = -(-images // shards)
    paths = []
    for s in range(shards):
        path = folder / f"{s:05d}.tar"
        with path.open("wb") as fh, webdataset.TarWriter(fh, encoder=False, mtime=0) as writer:
            for i in range(s * per, min(images, (s + 1) * per)):
                buf = io.BytesIO()
                Image.fromarray(photo_like(rng, size)).save(buf, format="JPEG", quality=90)
                words = rng.choice(WORDS, size=8)
                caption = " ".join(str(w) for w in words)
                key = f"{s * 10_000 + i - s * per:09d}"
                record = {"key": key, "caption": caption, "status": "success", "width": size}
                writer.write(
                    {
                        "__key__": key,
                        "jpg": buf.getvalue(),
                        "txt": caption.encode("utf-8"),
                        "json": json.dumps(record).encode("utf-8"),
                    }
                )
        paths.append(str(path))
    return paths


def make_stream(
    shards: list[str],
    *,
    num_samples: int,
    batch: int,
    workers: int,
    shuffle_buffer: int,
    seed: int = 0,
) -> ShardStream:
    """The training stream of a CLIP run: open_clip's crop on CLIP's 224 px eval transform,
    handing uint8 pixels over as ``build_train_transform`` does (the normalisation runs where
    the batch goes, in ``RetrievalBatch.to``)."""
    eval_transform = CLIPImageTransform(CROP)
    augment = RandomResizedCrop.from_eval(
        eval_transform,
        scale=(0.9, 1.0),
        ratio=(3 / 4, 4 / 3),
        interpolation="bicubic",
        output="uint8",
    )
    return ShardStream(
        shards,
        num_samples=num_samples,
        batch_size=batch,
        seed=seed,
        num_workers=workers,
        shuffle_buffer=shuffle_buffer,
        image_transform=eval_transform,
        augment=augment,
        encoder=CLIPByteTokenizer.for_preset("ViT-B-32"),
    )


def run_pipeline(shards: list[str], images: int, args: argparse.Namespace) -> tuple[int, float]:
    """(images delivered, seconds) of one epoch through the DataLoader workers."""
    stream = make_stream(
        shards,
        num_samples=images,
        batch=args.batch,
        workers=args.workers,
        shuffle_buffer=args.shuffle_buffer,
    )
    start = time.perf_counter()
    count = 0
    for batch in stream.loader(num_workers=args.workers, seed=0):
        count += int(len(batch.img_index))
    return count, time.perf_counter() - start


def decode_shard(path: str) -> int:
    """The bound's task: every JPEG of one shard opened, decoded, resized, made an array."""
    from PIL import Image

    count = 0
    with tarfile.open(path) as tar:
        for member in tar:
            if not member.name.endswith(".jpg"):
                continue
            data = tar.extractfile(member).read()  # type: ignore[union-attr]
            with Image.open(io.BytesIO(data)) as opened:
                image = opened.convert("RGB").resize((CROP, CROP), Image.Resampling.BICUBIC)
            count += int(np.asarray(image).shape[0] > 0)
    return count


def run_bound(shards: list[str], workers: int) -> tuple[int, float]:
    """(images decoded, seconds) of a Pool of ``workers`` processes over the shards."""
    start = time.perf_counter()
    with multiprocessing.get_context("fork").Pool(max(workers, 1)) as pool:
        count = sum(pool.map(decode_shard, shards, chunksize=1))
    return count, time.perf_counter() - start


def profile_worker(shards: list[str], images: int, args: argparse.Namespace, top: int = 12):
    """One worker's share of the epoch in this process (one torch thread, as a DataLoader
    worker has) under cProfile: the top functions by own time and the share of the main
    stages, as text lines."""
    workers = max(args.workers, 1)
    mine = shards[::workers]  # worker 0's shards (the stream shuffles which ones; same count)
    share = (images // workers) // args.batch * args.batch
    stream = make_stream(
        mine,
        num_samples=max(share, args.batch),
        batch=args.batch,
        workers=0,
        shuffle_buffer=args.shuffle_buffer,
    )
    profiler = cProfile.Profile()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as in a DataLoader worker
    start = time.perf_counter()
    profiler.enable()
    try:
        n = sum(int(len(b.img_index)) for b in stream.loader(num_workers=0, seed=0))
    finally:
        profiler.disable()
        torch.set_num_threads(threads)
    seconds = time.perf_counter() - start
    stats = pstats.Stats(profiler)
    total = sum(v[2] for v in stats.stats.values())  # type: ignore[attr-defined]
    stages = {
        "decode (PIL open + convert, decode_sample)": "decode_sample",
        "augment (crop + resize + normalise)": "__call__",
        "tokenise": "encode",
        "collate": "collate_retrieval",
        "tar reading + grouping (webdataset)": "tarfile_samples",
    }
    lines = [f"one worker in-process: {n} images in {seconds:.2f} s = {n / seconds:.0f} images/s"]
    cum = {}
    for (file, _, name), v in stats.stats.items():  # type: ignore[attr-defined]
        for label, fn in stages.items():
            if name == fn and ("transforms" in file or fn != "__call__"):
                cum[label] = max(cum.get(label, 0.0), v[3])
    for label, t in cum.items():
        lines.append(f"  {label}: {t:.2f} s cumulative ({100 * t / seconds:.0f}% of the time)")
    rows = sorted(stats.stats.items(), key=lambda kv: -kv[1][2])[:top]  # type: ignore[attr-defined]
    lines.append(f"  top {top} by own time (of {total:.2f} s profiled):")
    for (file, line, name), v in rows:
        lines.append(f"    {v[2]:7.2f} s  {name} ({Path(file).name}:{line})")
    return lines


def part_pipeline(shards: list[str], args: argparse.Namespace) -> str:
    images = args.images // args.batch * args.batch
    print(
        f"\n=== (1) input pipeline: {args.images} JPEGs {args.size}x{args.size} in "
        f"{len(shards)} shards, {args.workers} processes, batch {args.batch}, shuffle buffer "
        f"{args.shuffle_buffer}, random_resized_crop (0.9, 1.0) bicubic -> {CROP} + CLIP "
        f"normalisation + byte tokens; bound: Pool({args.workers}) open+decode+resize {CROP} "
        "bicubic+to-array"
    )
    ratios, rates = [], {"pipeline": [], "bound": []}
    for r in range(args.rounds):
        order = ("pipeline", "bound") if r % 2 == 0 else ("bound", "pipeline")
        got = {}
        for name in order:
            n, s = (
                run_pipeline(shards, images, args)
                if name == "pipeline"
                else run_bound(shards, args.workers)
            )
            got[name] = n / s
            rates[name].append(n / s)
        ratios.append(got["pipeline"] / got["bound"])
        print(
            f"  round {r + 1}: pipeline {got['pipeline']:7.1f} images/s, bound "
            f"{got['bound']:7.1f} images/s, ratio {ratios[-1]:.2f}x"
        )
    ratio = statistics.median(ratios)
    passed = ratio >= TARGET_RATE
    machine.record(
        "pipeline", {**{k: statistics.median(v) for k, v in rates.items()}, "ratio": ratio}
    )
    line = (
        f"(1) pipeline {statistics.median(rates['pipeline']):.1f} images/s / bound "
        f"{statistics.median(rates['bound']):.1f} images/s = {ratio:.2f}x (median of "
        f"{len(ratios)} rounds)   target >= {TARGET_RATE}x   {'PASS' if passed else 'MISS'}"
    )
    print(line)
    if args.profile or not passed:
        for text in profile_worker(shards, images, args):
            print(f"    {text}")
    return line


# ----------------------------------------------------------------------------- (2) memory


def run_config(spec: dict, out: Path) -> dict:
    """A CLIP pre-training run config (``synth_clip_pretrain``'s settings) on the shards;
    ``spec["vision"]`` / ``spec["text"]``: optional ``CLIPConfig`` tower overrides (the smoke
    test's tiny widths)."""
    layers = spec["layers"]
    train = {
        "epochs": 1,
        "batch_size": spec["batch"],
        "seed": 0,
        "validate": False,
        "progress": False,
        "device": spec["device"],
        "amp": spec.get("amp", False),
    }
    if spec.get("grad_cache"):
        train["grad_cache_chunk"] = spec["grad_cache"]
    return {
        "output_dir": str(out),
        "data": {
            "root": str(Path(spec["shards"][0]).parent),
            "format": "webdataset",
            "shards": spec["shards"],
            "train_num_samples": spec["batch"],
            "shuffle_buffer": 0,
            "train_transform": "random_resized_crop",
            "crop_scale": [0.9, 1.0],
            "crop_interpolation": "bicubic",
            "num_workers": 0,
        },
        "model": {
            "kind": "clip",
            "preset": "ViT-B-32",
            "tokenizer": "bytes",
            "config": {
                "vision_config": {"num_hidden_layers": layers, **spec.get("vision", {})},
                "text_config": {"num_hidden_layers": layers, **spec.get("text", {})},
            },
        },
        "loss": {
            "name": "infonce",
            "temperature": 0.07,
            "learnable_temperature": True,
            "chunk_size": spec["loss_chunk"],
        },
        "optim": {
            "name": "adamw",
            "lr": 5e-4,
            "betas": [0.9, 0.98],
            "weight_decay": 0.2,
            "grad_clip": 1.0,
        },
        "train": train,
    }


def make_trainer(spec: dict, out: Path):
    from vlret.run import config_from_dict
    from vlret.train import Trainer

    torch.manual_seed(0)
    return Trainer(config_from_dict(run_config(spec, out)), print_fn=None)


def first_batch(trainer) -> object:
    """The trainer's first training batch, read from the shards in this process."""
    trainer.sampler.set_epoch(0)
    loader = trainer.sampler.loader(trainer.train_set, num_workers=0, seed=0)
    return next(iter(loader)).to(trainer.device)


def worker_memory(spec: dict) -> dict:
    """Fresh process: the peak of one step of one form (gc at B, or plain at C) beyond set-up."""
    with tempfile.TemporaryDirectory() as tmp:
        trainer = make_trainer(spec, Path(tmp) / "run")
        batch = first_batch(trainer)
        trainer.train_step(batch.chunks(spec["chunk"])[0])  # warm-up: AdamW's state exists
        step = peak_of_step(trainer, batch)
        params = sum(p.numel() for p in trainer.model.parameters())
        return {**step, "params": params}


def worker_gpu(spec: dict) -> dict:
    """Fresh process on CUDA: timed pre-training steps of the full ViT-B/32 (or B/16) CLIP."""
    machine.resolve_device(spec["device"])  # the current CUDA device: synchronize() waits for it
    with tempfile.TemporaryDirectory() as tmp:
        trainer = make_trainer(spec, Path(tmp) / "run")
        batch = first_batch(trainer)
        for _ in range(3):
            trainer.train_step(batch)
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(spec["steps"]):
            trainer.train_step(batch)
        torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        return {
            "samples_per_s": spec["batch"] * spec["steps"] / seconds,
            "seconds": seconds,
            "device": torch.cuda.get_device_name(),
            "memory": torch.cuda.max_memory_allocated(),
        }


WORKERS = {"memory": worker_memory, "gpu": worker_gpu}


def run_worker(spec: dict, timeout: float) -> dict:  # in a fresh process of this script
    return machine.run_worker(os.path.abspath(__file__), spec, timeout)


def part_memory(shards: list[str], args: argparse.Namespace, device: str) -> str:
    base = {
        "shards": shards,
        "layers": args.layers,
        "chunk": args.chunk,
        "loss_chunk": args.chunk,
        "device": device,
        "threads": torch.get_num_threads(),
    }
    mode = "full" if args.full else "quick"
    print(
        f"\n=== (2) peak memory, {mode}: CLIP preset ViT-B-32 at its real widths (vision 768 x "
        f"{args.layers} layers, patch 32, {CROP} px; text 512 x {args.layers} layers, byte "
        f"tokens), fp32, tiled InfoNCE (chunk_size {args.chunk}, learnable temperature), "
        f"AdamW, clip 1.0; gc B={args.gc_batch} C={args.chunk} vs plain B={args.chunk}; "
        "MB: peak of one step beyond set-up + a warm-up step, fresh process"
    )
    plain = run_worker({**base, "kind": "memory", "batch": args.chunk}, args.timeout)
    cached = run_worker(
        {**base, "kind": "memory", "batch": args.gc_batch, "grad_cache": args.chunk}, args.timeout
    )
    for name, res in (("plain", plain), ("gc", cached)):
        if "error" in res:
            print(f"  {name}: {res['error']}")
        else:
            print(
                f"  {name:>5}: {res['peak'] / MB:9.1f} MB peak, {res['seconds']:7.1f} s, loss "
                f"{res['loss']:.4f}, set-up RSS {res['base'] / GB:.2f} GB, "
                f"{res['params'] / 1e6:.1f} M parameters"
            )
    machine.record("memory", {"plain": plain, "gc": cached, "layers": args.layers})
    if "error" in plain or "error" in cached:
        return "(2) n/a: a step did not run   MISS"
    ratio = cached["peak"] / plain["peak"]
    grads = 4 * plain["params"]
    extra = 2 * 2 * args.gc_batch * 512 * 4 + args.chunk * args.gc_batch * 4 * 4
    print(
        f"    the parameters' gradients alone: {grads / MB:.1f} MB (float32); what B adds to a "
        f"gc step beyond one chunk: ~{extra / MB:.1f} MB at B={args.gc_batch} (the 2 x B x 512 "
        f"embeddings and their gradients, the loss's {args.chunk} x B strips)"
    )
    return (
        f"(2) peak gc B={args.gc_batch} (C={args.chunk}) / plain B={args.chunk}, {args.layers} "
        f"layers: {cached['peak'] / MB:.1f} / {plain['peak'] / MB:.1f} MB = {ratio:.2f}x   "
        f"target <= {TARGET_MEM}x   {'PASS' if ratio <= TARGET_MEM else 'MISS'}"
    )


# ----------------------------------------------------------------------------- (3) GPU


def part_gpu(shards: list[str], args: argparse.Namespace, device: str) -> str:
    name = f"ViT-B/{args.gpu_patch}"
    print(f"\n=== (3) {name} pre-training samples/s on a GPU")
    if not device.startswith("cuda"):
        no_gpu = "torch.cuda.is_available() is False (no GPU on this machine)"
        line = f"(3) skipped: {no_gpu if not torch.cuda.is_available() else 'not CUDA: ' + device}"
        print(line)
        return line
    amp = {"none": False, "fp16": "fp16", "bf16": "bf16"}[args.gpu_amp]
    spec = {
        "kind": "gpu",
        "shards": shards,
        "layers": 12,
        "batch": args.gpu_batch,
        "loss_chunk": args.gpu_batch,
        "chunk": args.gpu_batch,
        "device": device,
        "amp": amp,
        "steps": args.gpu_steps,
        "threads": torch.get_num_threads(),
        # ViT-B/16 is the ViT-B-32 preset with 16-pixel patches (196 tokens instead of 49)
        "vision": {"patch_size": args.gpu_patch},
    }
    res = run_worker(spec, args.timeout)
    machine.record(
        "gpu_training",
        {**res, "batch": args.gpu_batch, "amp": args.gpu_amp, "patch": args.gpu_patch},
    )
    if "error" in res:
        line = f"(3) GPU run: {res['error']}"
    else:
        low, high = LAION_A100
        line = (
            f"(3) {name} on {res['device']}: {res['samples_per_s']:.0f} samples/s "
            f"(B={args.gpu_batch}, "
            f"amp {args.gpu_amp}, {args.gpu_steps} steps in {res['seconds']:.1f} s, peak "
            f"{res['memory'] / GB:.1f} GB, data loading excluded) vs LAION's {low:.0f}-"
            f"{high:.0f} samples/s per A100 (open_clip ViT-B/32)"
        )
    print(line)
    return line


# ----------------------------------------------------------------------------- main


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="the default sizes (2 layers, B=512)")
    size.add_argument("--full", action="store_true", help="(2) at 12 layers, B=4096")
    parser.add_argument("--parts", type=int, nargs="+", choices=(1, 2, 3), default=[1, 2, 3])
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument(
        "--shards", type=int, default=None, help="tar shards (default: 2 x --workers, at least 4)"
    )
    parser.add_argument("--size", type=int, default=256, help="JPEG side in pixels")
    parser.add_argument("--workers", type=int, default=2, help="processes of (1), both sides")
    parser.add_argument("--batch", type=int, default=50, help="batch of the pipeline in (1)")
    parser.add_argument("--shuffle-buffer", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--profile", action="store_true", help="profile one worker of (1)")
    parser.add_argument("--layers", type=int, default=None, help="(2): default 2, --full 12")
    parser.add_argument("--gc-batch", type=int, default=None, help="(2): default 512 / 4096")
    parser.add_argument("--chunk", type=int, default=128, help="(2): grad_cache_chunk")
    machine.add_device_arguments(parser, "auto")
    parser.add_argument("--gpu-batch", type=int, default=256)
    parser.add_argument("--gpu-steps", type=int, default=20)
    parser.add_argument("--gpu-amp", choices=("bf16", "fp16", "none"), default="bf16")
    parser.add_argument(
        "--gpu-patch", type=int, choices=(32, 16), default=32, help="(3): ViT-B/32 or ViT-B/16"
    )
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per subprocess")
    parser.add_argument("--_worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.layers is None:
        args.layers = 12 if args.full else 2
    if args.gc_batch is None:
        args.gc_batch = 4096 if args.full else 512
    if args.shards is None:
        args.shards = max(4, 2 * args.workers)
    if args.shards < args.workers:  # ShardStream gives every reader a shard of its own
        parser.error(f"--shards {args.shards} is fewer than --workers {args.workers}")
    return args


def main(argv: list[str] | None = None) -> list[str]:
    """Run the benchmark; returns the summary lines."""
    args = parse(argv)
    if args._worker is not None:
        spec = json.loads(args._worker)
        torch.set_num_threads(spec["threads"])
        print(json.dumps(WORKERS[spec["kind"]](spec)))
        return []
    device = str(machine.resolve_device(args.device))
    print(machine_line())
    print(machine.device_line(device))
    t_start = time.perf_counter()
    summary = []
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        shards = write_shards(Path(tmp) / "shards", args.images, args.shards, args.size)
        size = sum(os.path.getsize(p) for p in shards)
        print(
            f"wrote {args.images} JPEGs ({args.size} px, {size / args.images / 1024:.1f} KB each)"
            f" in {len(shards)} shards in {time.perf_counter() - start:.1f} s"
        )
        if 1 in args.parts:
            summary.append(part_pipeline(shards, args))
        if 2 in args.parts:
            summary.append(part_memory(shards, args, device))
        if 3 in args.parts:
            summary.append(part_gpu(shards, args, device))
    print(f"\nsummary ({time.perf_counter() - t_start:.0f} s):")
    for line in summary:
        print(f"  {line}")
    machine.record("summary", summary)
    machine.save_json(args.json, "bench_pixels", torch.device(device), argv)
    return summary


if __name__ == "__main__":
    main()
