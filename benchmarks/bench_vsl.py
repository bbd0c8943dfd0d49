"""VSL benchmark: caption TF-IDF fit and lookup, loss cost next to the triplet loss, memory.

Every figure is measured in this one run:

1. ``CaptionTfidf.fit`` on 150k generated captions (30k images x 5); target <= 30 s.
2. ``similarity`` lookup of a 128-image batch (median of many); target <= 10 ms.
3. Forward + backward at B=128, VSL (triplet + 10 * VSL) and the triplet loss alone, timed
   interleaved round by round, VSL twice: with the smooth rank's fused native kernel
   (``kernel="native"``, the default where it compiles) and with its PyTorch path
   (``kernel="torch"``, the fallback). Two settings: from a similarity matrix (the loss
   alone, semantic matrix given; target <= 3x the triplet loss) and from D=1024 embeddings
   through the modules (cosine similarity, positive mask and the semantic lookup included,
   as in a training step; target <= 2x). The kernel's float32 result is checked against
   the PyTorch path's first (loss and gradient).
4. The smooth rank alone, native kernel against the PyTorch path, on narrowly and widely
   spread rows (the kernel's cheap path covers entries within 80 tau of their row's mean).
5. Peak memory of VSL forward + backward at B=1024, measured in a fresh child process as the
   growth of the peak resident set (Linux ``VmHWM``, reset through ``/proc/self/clear_refs``)
   over the resident set just before the call.

Usage: ``python benchmarks/bench_vsl.py [--quick] [--threads N]`` (``--quick``: 30k captions,
fewer repeats). Without a C compiler (or with ``VLRET_NATIVE=0``) the native rows are skipped
and say why.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

import numpy as np
import torch

from vlret.losses import TripletLoss, VisualSemanticLoss, triplet_loss, visual_semantic_loss
from vlret.semantic import CaptionTfidf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import machine  # noqa: E402

FUNCTION_WORDS = ["a", "an", "the", "on", "of", "with", "in", "next", "to", "is", "and", "near"]


def generate_captions(n_images: int, per_image: int, seed: int = 0) -> dict[int, list[str]]:
    """Zipf-distributed pseudo-words; each image's captions share a small topic vocabulary."""
    rng = np.random.default_rng(seed)
    syllables = np.array(
        [
            "ka",
            "lo",
            "mi",
            "ren",
            "tu",
            "sa",
            "po",
            "dre",
            "vin",
            "chi",
            "ba",
            "nor",
            "el",
            "ost",
            "qua",
            "fi",
            "gum",
            "hal",
            "jo",
            "wex",
        ]
    )
    picks = rng.integers(0, len(syllables), size=(40000, 4))
    lengths = rng.integers(2, 5, size=40000)
    words = {"".join(syllables[p[:n]]) for p, n in zip(picks, lengths, strict=True)}
    vocab = np.array(sorted(words))[rng.permutation(len(words))][:20000]
    zipf = 1.0 / np.arange(1, len(vocab) + 1) ** 0.9
    zipf /= zipf.sum()
    n_caps = n_images * per_image
    topics = rng.choice(len(vocab), size=(n_images, 8), p=zipf)
    owner = np.repeat(np.arange(n_images), per_image)
    caption_len = rng.integers(8, 16, size=n_caps)
    starts = np.concatenate(([0], np.cumsum(caption_len)))
    token_owner = np.repeat(owner, caption_len)
    n_tokens = int(starts[-1])
    from_topic = topics[token_owner, rng.integers(0, 8, size=n_tokens)]
    background = rng.choice(len(vocab), size=n_tokens, p=zipf)
    tokens = vocab[np.where(rng.random(n_tokens) < 0.7, from_topic, background)]
    function_words = np.array(FUNCTION_WORDS)
    is_function = rng.random(n_tokens) < 0.35
    tokens[is_function] = function_words[rng.integers(0, len(function_words), is_function.sum())]
    tokens = tokens.tolist()
    captions: dict[int, list[str]] = {i: [] for i in range(n_images)}
    for c in range(n_caps):
        captions[int(owner[c])].append(" ".join(tokens[starts[c] : starts[c + 1]]))
    return captions


def median_ms(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def _sync(device: torch.device | None) -> None:
    if device is not None and device.type == "cuda":
        torch.cuda.synchronize()


def interleaved_ms(
    fns: dict, rounds: int, per_round: int, device: torch.device | None = None
) -> dict[str, float]:
    """Median over rounds of each function's per-call time, the functions alternating."""
    for fn in fns.values():  # warm-up
        for _ in range(3):
            fn()
    samples: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            _sync(device)
            t0 = time.perf_counter()
            for _ in range(per_round):
                fn()
            _sync(device)
            samples[name].append((time.perf_counter() - t0) / per_round)
    return {k: 1e3 * statistics.median(v) for k, v in samples.items()}


def bench_fit_and_lookup(n_images: int, repeats: int) -> CaptionTfidf:
    t0 = time.perf_counter()
    captions = generate_captions(n_images, 5)
    n_caps = sum(len(c) for c in captions.values())
    print(f"generated {n_caps} captions for {n_images} images in {time.perf_counter() - t0:.1f} s")
    rng = np.random.default_rng(1)
    fitted = None
    for ngram_range, target in (((1, 1), "target <= 30 s"), ((1, 4), "informative")):
        t0 = time.perf_counter()
        tfidf = CaptionTfidf(ngram_range=ngram_range).fit(captions)
        fit_s = time.perf_counter() - t0
        batches = [rng.integers(0, n_images, 128).tolist() for _ in range(repeats)]
        it = iter(batches)
        lookup = median_ms(lambda it=it, t=tfidf: t.similarity(next(it)), repeats)
        print(
            f"ngram_range={ngram_range}: fit {fit_s:.1f} s ({target}); vocabulary "
            f"{tfidf.vocabulary_size}, image vectors nnz {tfidf.image_vectors.nnz}; "
            f"lookup of 128 images {lookup:.2f} ms median (target <= 10 ms)"
        )
        fitted = fitted or tfidf
    return fitted


def bench_loss_ratio(tfidf: CaptionTfidf, rounds: int, device: torch.device) -> None:
    batch, dim = 128, 1024
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, tfidf.n_images, (batch,), generator=g).tolist()
    img = torch.randn(batch, dim, generator=g).to(device)
    txt = img + torch.randn(batch, dim, generator=g).to(device)
    img.requires_grad_()
    txt.requires_grad_()
    with torch.no_grad():
        sim0 = (
            torch.nn.functional.normalize(img, dim=1)
            @ torch.nn.functional.normalize(txt, dim=1).t()
        )
    semantic = tfidf.similarity(ids, device=device)

    from vlret import _native

    native = _native.library("smooth_rank") is not None
    kernels = ("native", "torch") if native else ("torch",)
    if not native:
        print(f"native smooth-rank kernel: {_native.status('smooth_rank')}; its rows skipped")

    def triplet_sim():
        s = sim0.clone().requires_grad_()
        triplet_loss(s).backward()

    def vsl_sim(kernel: str):
        s = sim0.clone().requires_grad_()
        (triplet_loss(s) + 10.0 * visual_semantic_loss(s, semantic, kernel=kernel)).backward()
        return s

    if native:
        fast, slow = vsl_sim("native"), vsl_sim("torch")
        gap = (fast.grad - slow.grad).abs().max().item()
        print(
            f"native vs torch gradient: max |difference| {gap:.2e} (max |grad| "
            f"{slow.grad.abs().max().item():.2e})"
        )

    triplet_mod = TripletLoss()
    vsl_mods = {k: VisualSemanticLoss(semantic=tfidf, kernel=k) for k in kernels}

    def triplet_emb():
        triplet_mod(img, txt, ids).backward()

    def vsl_emb(kernel: str):
        vsl_mods[kernel](img, txt, ids).backward()

    sims = interleaved_ms(
        {"triplet": triplet_sim} | {f"vsl_{k}": (lambda k=k: vsl_sim(k)) for k in kernels},
        rounds,
        10,
        device,
    )
    embs = interleaved_ms(
        {"triplet": triplet_emb} | {f"vsl_{k}": (lambda k=k: vsl_emb(k)) for k in kernels},
        rounds,
        5,
        device,
    )
    print(f"device {device}")
    machine.record("from_sim_ms", sims)
    machine.record("from_embeddings_ms", embs)
    for label, t, target in (
        ("from sim (B=128)", sims, 3),
        (f"from embeddings (B=128, D={dim})", embs, 2),
    ):
        rows = ", ".join(
            f"triplet+VSL ({k}) {t[f'vsl_{k}']:.3f} ms = {t[f'vsl_{k}'] / t['triplet']:.2f}x"
            for k in kernels
        )
        print(f"fwd+bwd {label}: triplet {t['triplet']:.3f} ms, {rows} (target <= {target}x)")


def bench_rank_spread(rounds: int) -> None:
    """The smooth rank alone (fwd+bwd, B=128, tau=0.001) with the native kernel and with the
    PyTorch path, on rows whose scores spread narrowly (as early in training, and in (3)) and
    widely (as a trained model's): the kernel's float32 ratios need a row's entries within 80
    tau of its mean, its float64 ratios within 700 tau of its midpoint; a row wider still takes
    the exp of each unsaturated pair with an entry out of range."""
    from vlret import _native
    from vlret.losses import smooth_rank

    if _native.library("smooth_rank") is None:
        return
    g = torch.Generator().manual_seed(2)
    spreads = (
        ("narrow (std 0.03)", 0.03),
        ("wide (std 0.15)", 0.15),
        ("very wide (std 0.3, rows past 1400 tau)", 0.3),
    )
    for label, spread in spreads:
        base = torch.randn(128, 128, generator=g) * spread

        def run(kernel: str, base=base) -> None:
            m = base.clone().requires_grad_()
            smooth_rank(m, tau=0.001, kernel=kernel).sum().backward()

        t = interleaved_ms({k: (lambda k=k: run(k)) for k in ("native", "torch")}, rounds, 10)
        machine.record(f"smooth_rank_{spread}_ms", t)
        print(
            f"smooth rank fwd+bwd B=128, {label}: native {t['native']:.3f} ms, torch "
            f"{t['torch']:.3f} ms ({t['torch'] / t['native']:.1f}x faster)"
        )


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def memory_child(batch: int) -> None:
    g = torch.Generator().manual_seed(0)
    sim = (torch.rand(batch, batch, generator=g) * 0.4).requires_grad_()
    semantic = torch.rand(batch, batch, generator=g)
    with open("/proc/self/clear_refs", "w") as f:  # reset the peak RSS (VmHWM) to the RSS now
        f.write("5")
    before = _status_kib("VmRSS")
    t0 = time.perf_counter()
    visual_semantic_loss(sim, semantic).backward()
    seconds = time.perf_counter() - t0
    peak = _status_kib("VmHWM")
    print(f"{(peak - before) / 1024:.1f} {seconds:.2f}")


def bench_memory(batch: int, threads: int) -> None:
    out = subprocess.run(
        [sys.executable, __file__, "--memory-child", str(batch), "--threads", str(threads)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    naive_gib = batch**3 * 4 / 2**30
    print(
        f"VSL fwd+bwd at B={batch}: peak RSS growth {float(out[0]):.0f} MiB (VmHWM - VmRSS, "
        f"fresh process; target < 1024 MiB), {float(out[1]):.1f} s; one unchunked "
        f"B^3 float32 tensor would be {naive_gib:.1f} GiB"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="30k captions, fewer repeats")
    parser.add_argument("--memory-child", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's)")
    machine.add_device_arguments(parser, "cpu")  # the loss timings; (3)'s peak RSS is CPU's
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.memory_child:
        memory_child(args.memory_child)
        return
    device = machine.resolve_device(args.device)
    print(machine.device_line(device))
    tfidf = bench_fit_and_lookup(6000 if args.quick else 30000, 50 if args.quick else 200)
    bench_loss_ratio(tfidf, 10 if args.quick else 30, device)
    if device.type == "cpu":
        bench_rank_spread(10 if args.quick else 30)
    bench_memory(1024, torch.get_num_threads())
    machine.save_json(args.json, "bench_vsl", device, argv)


if __name__ == "__main__":
    main()
