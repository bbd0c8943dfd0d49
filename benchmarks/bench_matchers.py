"""Part (e) of ``bench_cross_attention.py``: the matchers IMRAM, CVSE, CHAN and DIME (AdaCL
Table 1) at the COCO test geometry, measured side by side.

Each model is built at its paper's size (``MATCHER_CONFIGS``), in eval mode, and encodes random
BUTD-sized inputs: ``R = 36`` regions of 2048 values per image, captions of 8 + Poisson(4)
tokens clipped to 20 (mean about 12). Then, on ``--matcher-images`` x ``5 *
--matcher-images`` pairs (the 1 : 5 image : caption ratio of the COCO 5K test), three things
score the same encoded tensors, interleaved in each repeat:

* vlret's block scorer, ``model.score``;
* the authors' per-caption evaluation loop, rewritten from their released code in
  ``benchmarks/ref_<kind>.py`` (``reference_scores``) and run on the model's own weights in
  their evaluation's shards; the scores are asserted equal first. Target >= 5x;
* the bare matrix products the block scorer must do over its own blocks (``gemm_bound`` of the
  same file), for the ratio to the GEMM bound.

A COCO-5K scoring is 5000 x 25000 pairs; the ratios are measured on a slice of it (a
per-caption loop over all 25000 captions takes hours on a CPU) and the printed
``5K estimate`` scales vlret's time by the pair count. ``--coco5k-matcher KIND`` (for a GPU)
times the whole 5000 x 25000 scoring with vlret only.

The BERT text sides (DIME, CHAN with ``text.kind = "bert"``) read a randomly initialised local
BERT of BERT-base's width (768) and 2 layers, written to a temporary folder: the scorer sees
only the projected tokens, so the encoder's depth does not change what is timed.
"""

from __future__ import annotations

import copy
import importlib
import json
import statistics
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy
import torch

import machine
from machine import spread

KINDS = ("imram", "cvse", "chan", "chan_bert", "dime")
R, IN_DIM, VOCAB = 36, 2048, 10000

#: The model each part builds: the paper's sizes (the kind's defaults, written out where a
#: default differs from the paper's main row).
MATCHER_CONFIGS: dict[str, dict[str, Any]] = {
    "imram": {"kind": "imram", "embed_dim": 1024},
    "cvse": {"kind": "cvse", "embed_dim": 1024},
    "chan": {"kind": "chan", "embed_dim": 1024},
    "chan_bert": {"kind": "chan", "embed_dim": 1024, "image": {"self_attention": False}},
    "dime": {"kind": "dime", "embed_dim": 256},
}
#: Images per part: the reference loops differ by orders of magnitude in cost.
DEFAULT_IMAGES = {"imram": 32, "cvse": 256, "chan": 128, "chan_bert": 128, "dime": 32}


def _bert_folder(root: Path) -> Path:
    from vlret.worlds.bert import write_random_bert

    words = [f"w{i}" for i in range(2000)]
    captions = [" ".join(words[i : i + 20]) for i in range(0, len(words), 20)]
    return write_random_bert(
        root / "bert", captions, hidden=768, layers=2, heads=12, intermediate=3072
    )


def _word(i: int) -> str:
    """A letters-only word for index ``i`` (the concept counter skips non-alphabetic tokens)."""
    return "q" + "".join(chr(97 + (i // 26**k) % 26) for k in range(3))


def _concept_folder(root: Path) -> Path:
    """CVSE's concept statistics (``vlret cvse-concepts``, the release's 300 concepts) from
    random training captions over 3000 words, 5 for each of 2000 images."""
    from vlret.cli import main as vlret_main

    data = root / "cvse_data"
    data.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(1)
    words = torch.randint(0, 3000, (10000, 12), generator=g).tolist()
    lines = [" ".join(_word(i) for i in caption) for caption in words]
    (data / "train_caps.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    numpy.save(data / "train_ims.npy", numpy.zeros((2000, 1, 4), dtype=numpy.float32))
    out = root / "cvse_concepts"
    if vlret_main(["cvse-concepts", str(data), "--out", str(out), "--min-count", "1"]) != 0:
        raise SystemExit("cvse: vlret cvse-concepts failed")
    return out


def build(kind: str, bert_root: Path) -> tuple[torch.nn.Module, int]:
    """The part's model in eval mode and its vocabulary size (CVSE's and the BERT sides'
    from the folders written for them under ``bert_root``)."""
    from vlret.models import build_model

    config = copy.deepcopy(MATCHER_CONFIGS[kind])
    needs_bert = kind in ("dime", "chan_bert")
    vocab = VOCAB
    if needs_bert:
        folder = bert_root / "bert"
        if not folder.exists():
            _bert_folder(bert_root)
        config["text"] = {**config.get("text", {}), "kind": "bert", "path": str(folder)}
        vocab = json.loads((folder / "config.json").read_text())["vocab_size"]
    if kind == "cvse":
        from vlret.models.matchers.cvse_build import concepts_vocab_size

        folder = bert_root / "cvse_concepts"
        if not folder.exists():
            _concept_folder(bert_root)
        config["concepts"] = str(folder)
        vocab = concepts_vocab_size(folder) or VOCAB
    model = build_model(config, vocab_size=vocab)
    return model.eval(), vocab


def inputs(n_img: int, n_cap: int, vocab: int, seed: int = 0):
    """Raw region features, caption ids (``[1, vocab)``, zero-padded) and lengths."""
    g = torch.Generator().manual_seed(seed)
    features = torch.randn(n_img, R, IN_DIM, generator=g).relu()
    lengths = (8 + torch.poisson(torch.full((n_cap,), 4.0), generator=g)).clamp(max=20).long()
    captions = torch.randint(1, vocab, (n_cap, int(lengths.max())), generator=g)
    captions = captions * (torch.arange(captions.shape[1]) < lengths[:, None])
    return features, captions, lengths


def _reference(kind: str):
    return importlib.import_module(f"ref_{kind.split('_')[0]}")


def bench_matcher(kind: str, args, timer: Callable, device: torch.device, bert_root: Path) -> None:
    model, vocab = build(kind, bert_root)
    model = model.to(device)
    n_img = args.matcher_images or DEFAULT_IMAGES[kind]
    n_cap = 5 * n_img
    features, captions, lengths = inputs(n_img, n_cap, vocab)
    with torch.no_grad():
        regions = model.encode_images(features.to(device))
        words = model.encode_texts(captions.to(device), lengths.to(device))
        rows = model.token_lengths(lengths).to(device)
    ref = _reference(kind)
    print(
        f"\n(e) {kind}: {n_img} x {n_cap} pairs, encoded {tuple(regions.shape)} x "
        f"{tuple(words.shape)}"
    )
    with torch.no_grad():
        ours = model.score(regions, words, rows)
        want = ref.reference_scores(model, regions, words, rows)
        diff = (ours.double() - want.double()).abs().max().item()
        scale = want.double().abs().max().item()
        tol = 1e-4 * max(1.0, scale)
        print(f"  max |vlret - loop| = {diff:.2e} (tolerance {tol:.1e}, scores up to {scale:.2f})")
        if not diff <= tol:
            raise SystemExit(f"{kind}: scores differ from the reference loop")
        bound = ref.gemm_bound(model, regions, words, rows)
        loop_ratio, bound_ratio, t_ours = [], [], []
        for _ in range(args.repeats):
            tb, _ = timer(bound)
            to, _ = timer(lambda: model.score(regions, words, rows))
            tr, _ = timer(lambda: ref.reference_scores(model, regions, words, rows))
            loop_ratio.append(tr / to)
            bound_ratio.append(to / tb)
            t_ours.append(to)
    per_pair = statistics.median(t_ours) / (n_img * n_cap)
    machine.record(
        f"matcher_{kind}",
        {
            "images": n_img,
            "captions": n_cap,
            "seconds": statistics.median(t_ours),
            "loop/vlret": statistics.median(loop_ratio),
            "vlret/gemm_bound": statistics.median(bound_ratio),
            "coco5k_estimate_s": per_pair * 5000 * 25000,
        },
    )
    print(
        f"  vlret {statistics.median(t_ours) * 1e3:.0f} ms | loop / vlret {spread(loop_ratio)} "
        f"[target >= 5x] | vlret / GEMM bound {spread(bound_ratio)} | 5K estimate "
        f"{per_pair * 5000 * 25000 / 60:.0f} min"
    )


def bench_matchers(args, timer: Callable, device: torch.device) -> None:
    """Every part of ``--parts`` that names a matcher."""
    kinds = [k for k in KINDS if k in args.parts.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        for kind in kinds:
            bench_matcher(kind, args, timer, device, Path(tmp))


def bench_coco5k_matcher(kind: str, timer: Callable, device: torch.device) -> None:
    """One whole COCO-5K scoring (5000 x 25000 pairs) of ``kind`` with vlret only."""
    with tempfile.TemporaryDirectory() as tmp:
        model, vocab = build(kind, Path(tmp))
        model = model.to(device)
        features, captions, lengths = inputs(5000, 25000, vocab, seed=3)
        with torch.no_grad():
            regions = torch.cat([model.encode_images(f.to(device)) for f in features.split(500)])
            # one call: the captions' padded width is the longest caption's
            words = model.encode_texts(captions.to(device), lengths.to(device))
            rows = model.token_lengths(lengths).to(device)
            print(f"\nCOCO-5K {kind}: 5000 x 25000 pairs on {device}")
            base = machine.reset_peak(device)
            t, sims = timer(lambda: model.score(regions, words, rows))
            peak = machine.peak_since(device, base)
    finite = bool(torch.isfinite(sims).all())
    machine.record(
        f"coco5k_{kind}",
        {"images": 5000, "captions": 25000, "seconds": t, "finite": finite, "peak_bytes": peak},
    )
    print(
        f"  {t:.1f} s ({5000 * 25000 / t / 1e6:.2f} M pairs/s), finite: {finite}"
        + ("" if peak is None else f", peak {peak / 1024**3:.2f} GiB beyond the inputs")
    )
