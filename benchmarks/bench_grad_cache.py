"""Gradient caching at scale (issue 15, deliverable 3; issue 31, deliverable 4): peak memory
and step time, side by side.

What is measured: the Trainer's own ``train_step`` (forward, InfoNCE loss, backward, gradient
clipping at 2.0, Adam) on batches collated beforehand from generated precomputed features (so
data loading is not in the step), in two forms built from the same config and seed:

* ``plain``  the config without ``train.grad_cache_chunk``: the whole batch encoded with a graph.
* ``gc``     ``train.grad_cache_chunk = C`` (``--chunk``, default 128): :class:`GradCache` encodes
  the batch in chunks of C without a graph, the loss back-propagates into the embeddings, and
  each chunk is re-encoded with a graph to carry its slice of the cached gradient.

Both use the same tiled loss, ``InfoNCELoss(temperature=0.05, chunk_size=L)`` (``--loss-chunk``,
default 128), so the loss never builds the ``B x B`` matrix; its ``O(L x B)`` strips remain and
their share is printed with (a).
Three models, all with the image tower of ``configs/synth_f30k_compare.toml`` (36 x 64
precomputed region features -> FC -> max pooling, joint space 128):

* ``gru``   that config's model: bi-GRU text encoder (word 64, last hidden state).
* ``bert``  a tiny LOCAL Hugging Face BERT text tower: ``BertConfig(hidden 128, 2 layers, 2 heads,
  intermediate 256, vocab ~1000)`` with random weights and a word-level ``BertTokenizer``, written
  with ``save_pretrained`` into a temporary folder and loaded from there through the model config
  ``text = {kind = "bert", path = DIR, pooling = "cls"}`` (the tokenizer is the model folder's).
* ``bert-base``  the same with BERT-base's shape (hidden 768, 12 layers, 12 heads, intermediate
  3072, vocabulary 30522 (the captions' words and filler tokens), 512 positions; 109 M
  parameters with the rest of the model), random weights: where gradient caching matters. The
  captions are the synthetic world's, 16 tokens padded (printed); a B=4096 gc step takes about
  10 minutes on one core of the 2-core box, so run it with ``--memory-only`` (no plain step
  beyond B=C, no timed pair (b)).

Memory: every (model, form, B) runs in a fresh subprocess (as in ``bench_losses.py``). After
building the trainer, collating the batch and one warm-up step on 32 of its items (which also
creates Adam's state), the peak of one full step beyond that state is recorded: on CPU the peak
RSS (``VmHWM``, reset through ``/proc/self/clear_refs``) minus the RSS before the step, with the
heap's free pages first handed back (glibc ``malloc_trim``; otherwise a step reusing memory that
set-up freed looks smaller than it is); on CUDA ``torch.cuda.max_memory_allocated`` minus the
allocated bytes before the step. For (a), the tiled loss alone at that B (``bench_losses``'
worker, D=128), the parameters' gradient bytes (alive through every re-encoded chunk after the
first) and the gc step's time split are printed too. ``--baseline-src DIR`` runs every memory
case a second time on the library in ``DIR`` (the ``src`` of a ``git worktree`` of an earlier
commit), each pair in turn, and prints its figures and ratio beside this checkout's: before
and after, in one run. ``--worker-env NAME=VALUE`` sets the workers' environment, e.g.
``MALLOC_MMAP_THRESHOLD_=131072``, which fixes glibc's mmap threshold so that the peak RSS
follows the memory in use rather than the heap's fragmentation. ``--memory-repeats N`` runs
each memory case in N fresh processes and reports the median peak (the small models' peak RSS
varies by several MB from one process to the next). A plain B whose extrapolated need
(the plain B=C peak scaled linearly in B, x1.5) exceeds the memory guard (``--max-mem-gb``,
default 70% of RAM / GPU memory) is not run. Time: in one more subprocess per
model, at the largest B of ``--batches`` whose plain step ran, a plain and a gc trainer (same init)
step in turn for ``--rounds`` rounds (order alternating each round) after one warm-up step each;
the ratio is the median of the per-round ratios gc / plain. The warm-up steps of the two trainers
see the same batch from the same weights: their losses and gradients are compared as a check
that the gc step is the plain step.

Targets (issue 15, on this 2-core 24 GB CPU box), PASS/MISS printed per target and model:

(a) peak of a B=4096 gc step (C=128) <= 1.3x the peak of a plain B=128 step;
(b) gc step time <= 1.5x plain step time at the largest B where plain fits;
(c) one B=65536 gc step (tiled loss + gradient caching; ``--big-models``, default gru) completes
    here; its peak memory and time are printed.

Usage (from the repository root)::

    .venv/bin/python benchmarks/bench_grad_cache.py [--models gru bert bert-base]
        [--batches 1024 2048 4096] [--chunk 128] [--loss-chunk 128] [--rounds 5]
        [--skip-65536] [--big-batch 65536] [--big-models gru] [--device auto|cpu|cuda|cuda:N]
        [--memory-only] [--memory-repeats 1] [--baseline-src DIR] [--worker-env NAME=VALUE ...]
        [--json FILE]        [--threads 1] [--max-mem-gb G] [--timeout 1800]

    # before / after side by side, the BERT-base tower:
    git worktree add /tmp/base 6b209b6
    .venv/bin/python benchmarks/bench_grad_cache.py --models bert-base --batches 1024 4096 \
        --memory-only --skip-65536 --baseline-src /tmp/base/src
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_losses  # noqa: E402  (the memory probes are bench_losses')
import bench_train  # noqa: E402  (the batches are collated as bench_train does)
import machine  # noqa: E402
import vlret  # noqa: E402
from vlret.data.writers import make_tiny_precomp, tiny_captions  # noqa: E402
from vlret.run import config_from_dict
from vlret.train import Trainer

MODELS = ("gru", "bert", "bert-base")
FEATURES = (36, 64)  # regions x dim of the synthetic f30k-like world
EMBED = 128
TEMPERATURE = 0.05
WARMUP_ITEMS = 32
TARGET_MEM, TARGET_TIME = 1.3, 1.5
MB, GB = 1024**2, 1024**3
BERT_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
BERT_VOCAB = 1000
#: ``write_bert`` sizes: (hidden, layers, heads, intermediate, vocabulary, positions).
BERT_SIZES = {
    "bert": (128, 2, 2, 256, BERT_VOCAB, 64),
    "bert-base": (768, 12, 12, 3072, 30522, 512),  # bert-base-uncased's shape
}


# ----------------------------------------------------------------------------- set-up


def write_bert(path: Path, size: str = "bert") -> Path:
    """A random BERT of ``BERT_SIZES[size]`` and its word-level tokenizer (the captions' words,
    padded to the vocabulary size with filler tokens), saved as a local checkpoint folder."""
    import transformers

    hidden, layers, heads, inner, vocab_size, positions = BERT_SIZES[size]
    words = sorted({w for c in tiny_captions(500, np.random.default_rng(0)) for w in c.split()})
    words = [w.lower() for w in words]
    fill = [f"tok{i}" for i in range(max(0, vocab_size - len(BERT_SPECIALS) - len(words)))]
    vocab = list(dict.fromkeys(BERT_SPECIALS + words + fill))
    path.mkdir(parents=True, exist_ok=True)
    (path / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    transformers.BertTokenizer(str(path / "vocab.txt")).save_pretrained(str(path))
    config = transformers.BertConfig(
        vocab_size=len(vocab),
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=inner,
        max_position_embeddings=positions,
    )
    torch.manual_seed(0)
    transformers.BertModel(config).save_pretrained(str(path))
    return path


def model_section(model: str, bert_dirs: dict[str, str]) -> dict:
    image = {"kind": "precomp", "in_dim": FEATURES[1], "pooling": "max"}
    if model == "gru":
        text = {"kind": "gru", "word_dim": 64, "bidirectional": True, "pooling": "last"}
    else:
        text = {"kind": "bert", "path": bert_dirs[model], "pooling": "cls"}
    return {"embed_dim": EMBED, "image": image, "text": text}


def make_trainer(spec: dict, batch: int, grad_cache: int | None, out: Path) -> Trainer:
    train = {
        "epochs": 1,
        "batch_size": batch,
        "seed": 0,
        "validate": False,
        "progress": False,
        "device": spec["device"],
    }
    if grad_cache is not None:
        train["grad_cache_chunk"] = grad_cache
    raw = {
        "output_dir": str(out),
        "data": {"root": spec["data"], "min_count": 1},
        "model": model_section(spec["model"], spec["bert"]),
        "loss": {"name": "infonce", "temperature": TEMPERATURE, "chunk_size": spec["loss_chunk"]},
        "optim": {"name": "adam", "lr": 5e-4, "grad_clip": 2.0},
        "train": train,
    }
    return Trainer(config_from_dict(raw), print_fn=None)


def n_params(trainer: Trainer) -> int:
    return sum(p.numel() for p in trainer.model.parameters())


# ----------------------------------------------------------------------------- workers


def release_free_heap() -> None:
    """Give the heap's free pages back to the OS (glibc ``malloc_trim``) before the RSS baseline.

    Set-up (collating B items, the warm-up step) leaves freed memory resident; a step that
    reuses it would not raise the RSS, and its peak would be under-counted (B=65536: 0 MB).
    """
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: the baseline keeps that memory
        pass


def timed_phases(trainer: Trainer) -> dict[str, float]:
    """Wrap a gc trainer's GradCache so that its two passes are timed (filled during the step):
    ``encode`` (chunks without a graph), ``reencode`` (chunks with a graph + their backward)."""
    phases: dict[str, float] = {}
    cache = trainer.grad_cache
    if not cache:
        return phases
    for name, method in (("encode", cache.forward), ("reencode", cache.backward)):

        def wrapped(*a, _name=name, _method=method):
            bench_losses.sync(trainer.device)
            start = time.perf_counter()
            out = _method(*a)
            bench_losses.sync(trainer.device)
            phases[_name] = time.perf_counter() - start
            return out

        setattr(cache, method.__name__, wrapped)
    return phases


def peak_of_step(trainer, batch) -> dict:
    """Peak memory (bytes) of one ``train_step`` beyond the state before it, its time and
    loss: on CUDA ``max_memory_allocated`` minus the allocated bytes before; on CPU the peak RSS
    (``VmHWM``, reset) minus the RSS before, the heap's free pages handed back first."""
    device = trainer.device
    gc.collect()
    release_free_heap()
    bench_losses.sync(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
    else:
        base = bench_losses._status_kb("VmRSS") * 1024
        bench_losses._reset_peak_rss()
    start = time.perf_counter()
    loss, _ = trainer.train_step(batch)
    bench_losses.sync(device)
    seconds = time.perf_counter() - start
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(device) - base
    else:
        peak = bench_losses._status_kb("VmHWM") * 1024 - base
    return {"peak": peak, "seconds": seconds, "loss": loss, "base": base}


def worker_memory(spec: dict) -> dict:
    """Fresh process: peak memory and time of one step of one form at one B."""
    with tempfile.TemporaryDirectory() as tmp:
        gcc = spec["chunk"] if spec["form"] == "gc" else None
        trainer = make_trainer(spec, spec["batch"], gcc, Path(tmp) / "run")
        device = trainer.device
        batch = bench_train.batches(trainer, 1)[0]
        trainer.train_step(batch.chunks(min(WARMUP_ITEMS, spec["batch"]))[0])  # warm-up
        phases = timed_phases(trainer)
        step = peak_of_step(trainer, batch)
        return {
            **step,
            "params": n_params(trainer),
            "grad_bytes": sum(
                p.numel() * p.element_size() for p in trainer.model.parameters() if p.requires_grad
            ),
            "tokens": tuple(batch.captions.shape)[-1] if torch.is_tensor(batch.captions) else None,
            "library": os.path.dirname(os.path.dirname(os.path.abspath(vlret.__file__))),
            "device": str(device),
            "phases": phases,
        }


def worker_time(spec: dict) -> dict:
    """Fresh process: a plain and a gc trainer (same init) stepping in turn at one B."""
    with tempfile.TemporaryDirectory() as tmp:
        plain = make_trainer(spec, spec["batch"], None, Path(tmp) / "plain")
        cached = make_trainer(spec, spec["batch"], spec["chunk"], Path(tmp) / "gc")
        device = plain.device
        data = bench_train.batches(plain, 2)
        losses = [plain.train_step(data[0])[0], cached.train_step(data[0])[0]]  # warm-up
        # train_step leaves the step's (clipped) gradients in .grad until the next step
        pairs = list(zip(plain.model.parameters(), cached.model.parameters(), strict=True))
        scale = max(float(a.grad.abs().max()) for a, _ in pairs if a.grad is not None)
        diff = max(float((a.grad - b.grad).abs().max()) for a, b in pairs if a.grad is not None)
        times: dict[str, list[float]] = {"plain": [], "gc": []}
        for r in range(spec["rounds"]):
            order = (("plain", plain), ("gc", cached))
            for name, trainer in order if r % 2 == 0 else order[::-1]:
                bench_losses.sync(device)
                start = time.perf_counter()
                trainer.train_step(data[r % len(data)])
                bench_losses.sync(device)
                times[name].append(time.perf_counter() - start)
        return {"times": times, "losses": losses, "grad_diff": diff / scale}


WORKERS = {"memory": worker_memory, "time": worker_time}


def run_worker(spec: dict, timeout: float, src: str | None = None, env: dict | None = None) -> dict:
    """``spec`` in a fresh process of this script (``bench_losses.run_worker`` runs its own);
    ``src``: the ``vlret`` it imports comes from that folder (``--baseline-src``); ``env``:
    more environment variables (``--worker-env``)."""
    cmd = [sys.executable, os.path.abspath(__file__), "--_worker", json.dumps(spec)]
    environ = {**os.environ, **(env or {})}
    if src:
        environ["PYTHONPATH"] = os.pathsep.join(
            p for p in (os.path.abspath(src), environ.get("PYTHONPATH")) if p
        )
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=environ)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or [""])[-1][:160]
        return {"error": f"failed (rc={proc.returncode}) {tail}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ----------------------------------------------------------------------------- main


def ok(res: dict | None) -> bool:
    return res is not None and "error" not in res


def cell(res: dict | None, note: str = "") -> str:
    if res is None:
        return f"{note:>22}"
    if "error" in res:
        return f"{res['error'][:60]:>22}"
    return f"{res['peak'] / MB:10.1f} {res['seconds']:9.2f} s"


def median_run(runs: list[dict]) -> dict:
    """The run of median peak (the lower middle one of an even count), every peak listed in
    it; the first failure if any failed."""
    failed = [r for r in runs if not ok(r)]
    if failed:
        return failed[0]
    ranked = sorted(runs, key=lambda r: r["peak"])
    return {**ranked[(len(ranked) - 1) // 2], "peaks": [r["peak"] for r in runs]}


def mb(res: dict | None) -> str:
    return f"{res['peak'] / MB:.1f}" if ok(res) else ("-" if res is None else "failed")


def verdict(passed: bool) -> str:
    return "PASS" if passed else "MISS"


def phase_note(res: dict) -> str:
    """The gc step's time split: encode without a graph, loss (+ clip, Adam), re-encode."""
    ph = res.get("phases") or {}
    if not {"encode", "reencode"} <= ph.keys():
        return ""
    rest = res["seconds"] - ph["encode"] - ph["reencode"]
    return (
        f"time {res['seconds']:.2f} s = encode without graph {ph['encode']:.2f} + loss "
        f"fwd/bwd, clip, Adam {rest:.2f} + re-encode with graph and backward "
        f"{ph['reencode']:.2f} s"
    )


def loss_probe(batch: int, args: argparse.Namespace) -> dict:
    """The tiled InfoNCE step alone at ``batch`` x EMBED (``bench_losses``' worker, own process)."""
    spec = {
        "method": "tiled",
        "loss": "infonce",
        "batch": batch,
        "dim": EMBED,
        "dtype": "float32",
        "device": args.device,
        "chunk": args.loss_chunk,
        "repeats": 1,
        "time_budget": 5.0,
        "threads": args.threads,
    }
    return bench_losses.run_worker(spec, args.timeout)


def make_data(root: Path, batch: int) -> str:
    make_tiny_precomp(
        root, sizes={"train": math.ceil(batch / 5) + 1, "dev": 1}, feature_shape=FEATURES
    )
    return str(root)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", choices=MODELS, default=["gru", "bert"])
    parser.add_argument("--batches", type=int, nargs="+", default=[1024, 2048, 4096])
    parser.add_argument("--chunk", type=int, default=128, help="train.grad_cache_chunk")
    parser.add_argument("--loss-chunk", type=int, default=128, help="InfoNCELoss chunk_size")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds for (b)")
    parser.add_argument("--skip-65536", action="store_true", help="skip target (c)")
    parser.add_argument(
        "--memory-repeats",
        type=int,
        default=1,
        help="fresh processes per memory case; the median peak is reported (the CPU's peak RSS "
        "varies by several MB between runs of the small models)",
    )
    parser.add_argument(
        "--memory-only",
        action="store_true",
        help="(a) only: no plain step beyond B=C, no timed pair (b); for the big towers",
    )
    parser.add_argument("--big-batch", type=int, default=65536, help="B of target (c)")
    parser.add_argument("--big-models", nargs="+", choices=MODELS, default=["gru"])
    machine.add_device_arguments(parser, "auto")
    parser.add_argument(
        "--baseline-src",
        default=None,
        help="the src folder of another checkout (e.g. a git worktree of the base commit): "
        "the memory cases run on its library too, side by side",
    )
    parser.add_argument(
        "--worker-env",
        nargs="+",
        default=[],
        metavar="NAME=VALUE",
        help="environment of the workers (e.g. MALLOC_MMAP_THRESHOLD_=131072)",
    )
    parser.add_argument("--threads", type=int, default=1, help="torch threads in the workers")
    parser.add_argument("--max-mem-gb", type=float, default=None, help="default: 70%% of memory")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per subprocess")
    parser.add_argument("--_worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args._worker is not None:
        spec = json.loads(args._worker)
        torch.set_num_threads(spec["threads"])
        print(json.dumps(WORKERS[spec["kind"]](spec)))
        return

    device = machine.resolve_device(args.device)
    args.device = str(device)  # what the workers get
    bad = [v for v in args.worker_env if "=" not in v or not v.split("=", 1)[0]]
    if bad:
        parser.error(f"--worker-env takes NAME=VALUE, got {bad[0]!r}")
    worker_env = dict(v.split("=", 1) for v in args.worker_env)
    if args.memory_repeats < 1:
        parser.error(f"--memory-repeats must be at least 1, got {args.memory_repeats}")
    guard = (
        args.max_mem_gb * GB if args.max_mem_gb else 0.7 * bench_losses.total_memory_bytes(device)
    )
    batches = sorted(set(args.batches))
    a_batch = 4096 if 4096 in batches else batches[-1]
    probe = "CUDA max_memory_allocated" if device.type == "cuda" else "peak RSS (VmHWM)"
    print(machine.device_line(device))
    print(
        f"torch {torch.__version__}, device {device}, {args.threads} thread(s) per worker, "
        f"memory guard {guard / GB:.1f} GB, grad_cache_chunk C={args.chunk}, "
        f"loss InfoNCELoss(temperature={TEMPERATURE}, chunk_size={args.loss_chunk})"
    )
    print(
        "step: Trainer.train_step (forward, loss, backward, clip, Adam) on pre-collated batches; "
        f"MB: {probe} of one step beyond the state after set-up and a warm-up step, fresh process"
        + (f", median of {args.memory_repeats}" if args.memory_repeats > 1 else "")
    )
    lib = os.path.dirname(os.path.dirname(os.path.abspath(vlret.__file__)))
    print(
        f"library: {lib}"
        + (f"; baseline library (--baseline-src): {args.baseline_src}" if args.baseline_src else "")
        + (f"; worker environment: {' '.join(args.worker_env)}" if args.worker_env else "")
    )
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        data = make_data(tmp / "data", batches[-1])
        big_data = None
        berts = {
            m: str(write_bert(tmp / m, m)) for m in BERT_SIZES if m in args.models + args.big_models
        }
        base = {
            "device": args.device,
            "threads": args.threads,
            "chunk": args.chunk,
            "loss_chunk": args.loss_chunk,
            "bert": berts,
        }
        summary = []
        loss_alone = loss_probe(a_batch, args)
        loss_note = (
            f"alone {loss_alone['peak'] / MB:.1f} MB, bench_losses tiled worker, D={EMBED}"
            if ok(loss_alone)
            else f"alone: {loss_alone['error']}"
        )
        for model in args.models:
            spec = {**base, "model": model, "data": data}

            def memory(form, batch, spec=spec, src=None):
                runs = [
                    run_worker(
                        {**spec, "kind": "memory", "form": form, "batch": batch},
                        args.timeout,
                        src,
                        worker_env,
                    )
                    for _ in range(args.memory_repeats)
                ]
                return median_run(runs)

            def before(form, batch):  # the same case on --baseline-src's library
                return memory(form, batch, src=args.baseline_src) if args.baseline_src else None

            ref, ref_before = memory("plain", args.chunk), before("plain", args.chunk)
            per_item = ref["peak"] / args.chunk if ok(ref) else 0.0
            params = f"{ref['params'] / 1e6:.2f} M parameters" if ok(ref) else "?"
            if model == "gru":
                text = "bi-GRU word 64"
            else:
                hidden, layers, heads, inner, vocab, _ = BERT_SIZES[model]
                text = (
                    f"local random BERT (hidden {hidden}, {layers} layers, {heads} heads, "
                    f"intermediate {inner}, vocabulary {vocab})"
                )
            tokens = f", captions of {ref['tokens']} tokens (padded)" if ok(ref) else ""
            print(
                f"\n=== {model}: precomp {FEATURES[0]}x{FEATURES[1]} + FC max, {text}{tokens}, "
                f"embed {EMBED}, {params}"
            )
            head = f"  {'B':>6}   {'plain MB':>10} {'plain s':>11}   {'gc MB':>10} {'gc s':>11}"
            if args.baseline_src:
                head += f"   {'baseline: plain MB':>18} {'gc MB':>10}"
            print(head)
            rows: dict[int, tuple[dict | None, dict | None]] = {}
            gc_before: dict[int, dict | None] = {}
            for batch in sorted({args.chunk, *batches}):
                need = 1.5 * per_item * batch
                if batch == args.chunk:
                    plain, note = ref, ""
                elif args.memory_only:
                    plain, note = None, "not run (--memory-only)"
                elif need > guard:
                    plain, note = None, f"skipped (~{need / GB:.1f} GB)"
                else:
                    plain, note = memory("plain", batch), ""
                cached = memory("gc", batch) if batch in batches else None
                rows[batch] = (plain, cached)
                record = {"plain": plain or note, "gc": cached}
                row = f"  {batch:>6}   {cell(plain, note)}   {cell(cached, 'not run')}"
                if args.baseline_src:
                    gc_before[batch] = before("gc", batch) if batch in batches else None
                    first = ref_before if batch == args.chunk else None
                    record["baseline"] = {"plain": first, "gc": gc_before[batch]}
                    row += f"   {mb(first):>18} {mb(gc_before[batch]):>10}"
                machine.record(f"{model} B={batch}", record)
                print(row)
            print(
                f"  plain B={args.big_batch} would need ~{per_item * args.big_batch / GB:.1f} GB "
                "(plain B=C peak scaled linearly; not run)"
            )

            # (a) memory
            plain_ref, cached_a = rows[args.chunk][0], rows[a_batch][1]
            if ok(plain_ref) and ok(cached_a):
                r = cached_a["peak"] / plain_ref["peak"]
                line = (
                    f"(a) peak gc B={a_batch} (C={args.chunk}) / plain B={args.chunk}: "
                    f"{cached_a['peak'] / MB:.1f} / {plain_ref['peak'] / MB:.1f} MB = {r:.2f}x"
                    f"   target <= {TARGET_MEM}x   {verdict(r <= TARGET_MEM)}"
                )
            else:
                line = "(a) n/a: a step did not run   MISS"
            print(line)
            summary.append(f"{model} {line}")
            if args.baseline_src:
                old = gc_before.get(a_batch)
                if ok(old) and ok(ref_before):
                    r = old["peak"] / ref_before["peak"]
                    line = (
                        f"(a) baseline ({args.baseline_src}), same cases: "
                        f"{old['peak'] / MB:.1f} / {ref_before['peak'] / MB:.1f} MB = {r:.2f}x"
                    )
                else:
                    line = "(a) baseline: a step did not run"
                print(line)
                summary.append(f"{model} {line}")
            if ok(cached_a):
                leaves = 4 * a_batch * EMBED * 4  # img, txt leaves and their gradients, float32
                print(
                    f"    what the gc B={a_batch} peak holds beyond one chunk: the tiled loss on "
                    f"the B={a_batch} embeddings ({loss_note}) and the leaves + their "
                    f"gradients ({leaves / MB:.1f} MB); {phase_note(cached_a)}"
                )
                print(
                    f"    and the parameters' gradients ({cached_a['grad_bytes'] / MB:.1f} MB), "
                    "summed over the chunks: from the second chunk on they are alive through "
                    "each chunk's forward, where a plain step allocates them during its backward "
                    "as its activations are freed"
                )

            # (b) time at the largest B where plain ran
            fits = [b for b in batches if ok(rows[b][0])]
            if args.memory_only:
                line = "(b) not run (--memory-only)"
            elif not fits:
                line = "(b) n/a: no plain step ran   MISS"
            else:
                b_batch = fits[-1]
                res = run_worker(
                    {**spec, "kind": "time", "batch": b_batch, "rounds": args.rounds},
                    args.timeout,
                    env=worker_env,
                )
                if not ok(res):
                    line = f"(b) B={b_batch}: {res['error']}   MISS"
                else:
                    tp, tg = res["times"]["plain"], res["times"]["gc"]
                    r = statistics.median(g / p for g, p in zip(tg, tp, strict=True))
                    lp, lg = res["losses"]
                    machine.record(f"{model} time B={b_batch}", {**res, "gc/plain": r})
                    print(
                        f"    same step check at B={b_batch}: loss plain {lp:.6f} gc {lg:.6f}, "
                        f"max |grad difference| / max |grad| {res['grad_diff']:.1e}"
                    )
                    print(f"    plain s: {' '.join(f'{t:.2f}' for t in tp)}")
                    print(f"    gc s:    {' '.join(f'{t:.2f}' for t in tg)}")
                    if ok(ref):
                        n = b_batch / args.chunk
                        print(
                            f"    for scale: {n:.0f} plain B={args.chunk} steps (memory-run "
                            f"time x {n:.0f}) ~{ref['seconds'] * n:.2f} s"
                        )
                    line = (
                        f"(b) step time gc / plain at B={b_batch} (largest plain B run): "
                        f"median {statistics.median(tg):.2f} / {statistics.median(tp):.2f} s, "
                        f"median of {len(tp)} round ratios {r:.2f}x   "
                        f"target <= {TARGET_TIME}x   {verdict(r <= TARGET_TIME)}"
                    )
            print(line)
            summary.append(f"{model} {line}")

        # (c) the big batch
        if not args.skip_65536:
            big_data = make_data(tmp / "big", args.big_batch)
            for model in args.big_models:
                spec = {**base, "model": model, "data": big_data, "kind": "memory", "form": "gc"}
                res = run_worker({**spec, "batch": args.big_batch}, args.timeout, env=worker_env)
                machine.record(f"{model} gc B={args.big_batch}", res)
                print(
                    f"\n=== {model}: one gc step at B={args.big_batch} (C={args.chunk}, "
                    f"loss chunk_size {args.loss_chunk})"
                )
                if ok(res):
                    line = (
                        f"(c) B={args.big_batch} gc step completed: peak "
                        f"{res['peak'] / MB:.1f} MB beyond set-up (set-up RSS/allocated "
                        f"{res['base'] / GB:.2f} GB), {res['seconds']:.1f} s, "
                        f"loss {res['loss']:.4f}   PASS"
                    )
                else:
                    line = f"(c) B={args.big_batch}: {res['error']}   MISS"
                print(line)
                if ok(res):
                    print(f"    {phase_note(res)}")
                summary.append(f"{model} {line}")
    print(f"\nsummary ({time.perf_counter() - t_start:.0f} s):")
    for line in summary:
        print(f"  {line}")
    machine.record("summary", summary)
    machine.save_json(args.json, "bench_grad_cache", device, argv)


if __name__ == "__main__":
    main()
