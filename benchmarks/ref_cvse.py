"""CVSE's reference scoring loop and its GEMM bound, and the release's forward written out
sample by sample (the tests' float64 oracle for the encoders).

``reference_scores`` is the authors' ``t2i_sep_sim`` (``BruceW91/CVSE`` ``evaluation.py``),
rewritten step by step: for each caption, ``0.95 * <fused image, fused caption> + 0.05 *
<consensus image, consensus caption>`` against every image, in float64 as the release scores
in numpy. ``gemm_bound`` runs only the products the block scorer must do (one ``(n_img, 2D) x
(2D, block)`` product per caption block, into preallocated outputs).

``reference_levels`` recomputes one side's ``[instance, consensus, fused]`` vectors and concept
weights the release's way, each image or caption on its own (the word features of a caption
from the model's word encoder run on that caption alone, unpadded), the self-attention softmax
over the release's padded positions unmasked, BatchNorm statistics written out over the batch
in training mode, every ``l2norm`` with the release's eps 1e-12 (``util/utils.py``).

Run it for the block scorer's ratio: ``OMP_NUM_THREADS=1 python benchmarks/ref_cvse.py``.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

EPS = 1e-12
BN_EPS = 1e-5


def _l2n(x: torch.Tensor) -> torch.Tensor:
    return x / (x.pow(2).sum(-1, keepdim=True).sqrt() + EPS)


def reference_scores(model, regions, words, word_lengths) -> torch.Tensor:
    """``(n_img, n_cap)`` float64 scores of encoded rows ``[instance, consensus, fused]``, one
    caption at a time (``t2i_sep_sim``), with the model's ``weight_fused``."""
    w = float(model.weight_fused)
    fused_img, cons_img = regions[:, 2].double(), regions[:, 1].double()
    columns = []
    for i in range(words.shape[0]):
        fused_cap, cons_cap = words[i, 2].double(), words[i, 1].double()
        d_fused = (fused_img * fused_cap).sum(dim=1)
        d_cons = (cons_img * cons_cap).sum(dim=1)
        columns.append(w * d_fused + (1.0 - w) * d_cons)
    return torch.stack(columns, dim=1)


def gemm_bound(model, regions, words, word_lengths) -> Callable[[], None]:
    """A closure running the bare products of :meth:`CVSE.score` at its own caption blocks."""
    from vlret.models.attention import DEFAULT_MAX_ELEMENTS

    n_img, n_cap, dim = regions.shape[0], words.shape[0], regions.shape[2]
    img = torch.randn(n_img, 2 * dim, dtype=regions.dtype)
    txt_t = torch.randn(2 * dim, n_cap, dtype=words.dtype)
    step = max(1, DEFAULT_MAX_ELEMENTS // max(1, n_img))
    spans = [(s, min(n_cap, s + step)) for s in range(0, n_cap, step)]
    outs = [torch.empty(n_img, e - s, dtype=regions.dtype) for s, e in spans]
    parts = [txt_t[:, s:e] for s, e in spans]

    def run() -> None:
        for part, out in zip(parts, outs, strict=True):
            torch.mm(img, part, out=out)

    return run


def _bn(x: torch.Tensor, bn, axes: tuple[int, ...], channel: int) -> torch.Tensor:
    """BatchNorm written out: ``channel`` is the axis of ``x`` its parameters run along."""
    shape = [1] * x.dim()
    shape[channel] = x.shape[channel]
    if bn.training:
        mean = x.mean(dim=axes, keepdim=True)
        var = (x - mean).pow(2).mean(dim=axes, keepdim=True)
    else:
        mean = bn.running_mean.double().view(shape)
        var = bn.running_var.double().view(shape)
    return (x - mean) / torch.sqrt(var + BN_EPS) * bn.weight.double().view(
        shape
    ) + bn.bias.double().view(shape)


def _lin(layer, x: torch.Tensor) -> torch.Tensor:
    return x @ layer.weight.double().t() + layer.bias.double()


def _table(model) -> torch.Tensor:
    gcn = model.gcn
    a = gcn.adj_all.double()
    d = torch.pow(a.sum(1), -0.5)
    adj = torch.matmul(torch.matmul(a, torch.diag(d)).t(), torch.diag(d))  # gen_adj
    x = adj @ (gcn.vectors.double() @ gcn.gc1.double())
    x = F.leaky_relu(x, 0.2)
    return _l2n(adj @ (x @ gcn.gc2.double()))


def _consensus(module, inst: torch.Tensor, table: torch.Tensor, labels=None):
    e1 = torch.tanh(_bn(_lin(module.fc1, table), module.bn1, (0,), 1))
    e2 = torch.tanh(_bn(_lin(module.fc2, inst), module.bn2, (0,), 1))
    rows = []
    for b in range(inst.shape[0]):  # fc3(embedding_1(C) * embedding_2(x)[b]) per sample
        rows.append(_lin(module.fc3, e1 * e2[b]).squeeze(-1))
    w = torch.softmax(module.temperature * torch.stack(rows), dim=1)
    if labels is not None:
        prior = torch.softmax(module.temperature * labels.double(), dim=1)
        w = module.label_ratio * prior + (1 - module.label_ratio) * w
    cons = torch.stack([_l2n((w[b, :, None] * _l2n(table)).sum(0)) for b in range(w.shape[0])])
    return cons, w


def reference_levels(model, side: str, *inputs) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rows (N, 3, D), weights (N, C))`` in float64 for ``side`` ``"image"`` (inputs:
    features) or ``"text"`` (inputs: captions, lengths). Dropout must be off (p = 0 or eval)."""
    alpha = model.fuse_train if model.training else model.fuse_eval
    table = _table(model)
    if side == "image":
        (features,) = inputs
        fc = model.image_encoder.fc
        v = _l2n(features.double() @ fc.weight.double().t() + fc.bias.double())  # (N, R, D)
        sa = model.visual_attention
        w_v = torch.tanh(_bn(_lin(sa.fc1, v), sa.bn1, (0, 2), 1))
        w_m = torch.tanh(_bn(_lin(sa.fc2, v.mean(1)), sa.bn2, (0,), 1))
        inst = []
        for b in range(v.shape[0]):
            a = torch.softmax(_lin(sa.fc3, w_v[b] * w_m[b]).squeeze(-1), dim=0)
            inst.append(_l2n((a[:, None] * v[b]).sum(0)))
        instance = torch.stack(inst)
        cons, weights = _consensus(model.visual_consensus, instance, table)
    else:
        captions, lengths = inputs
        width = int(lengths.max())
        words = []
        for b in range(captions.shape[0]):  # each caption alone, then zero-padded to the batch
            n = int(lengths[b])
            u = model.text_encoder(captions[b : b + 1, :n], lengths[b : b + 1]).double()[0]
            words.append(torch.cat([u, u.new_zeros(width - n, u.shape[1])]))
        u = torch.stack(words)
        sa = model.text_attention
        mean = _l2n(u.mean(1))  # over every padded position, as the release
        inst = []
        for b in range(u.shape[0]):
            w_u = torch.tanh(_lin(sa.fc1, u[b]))
            w_m = torch.tanh(_lin(sa.fc2, mean[b]))
            a = torch.softmax(_lin(sa.fc3, w_u * w_m).squeeze(-1), dim=0)  # unmasked
            inst.append(_l2n((a[:, None] * u[b]).sum(0)))
        instance = torch.stack(inst)
        labels = torch.zeros(captions.shape[0], model.num_concepts, dtype=torch.float64)
        for b in range(captions.shape[0]):
            for t in range(int(lengths[b])):
                c = int(model.concept_of_id[int(captions[b, t])])
                if c >= 0:
                    labels[b, c] = 1.0
        cons, weights = _consensus(model.text_consensus, instance, table, labels)
    fused = _l2n(alpha * instance + (1 - alpha) * cons)
    return torch.stack((instance, cons, fused), dim=1), weights


def _bench(args: argparse.Namespace) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import machine

    torch.manual_seed(0)
    d = args.dim
    regions = F.normalize(torch.randn(args.images, 3, d), dim=-1)
    words = F.normalize(torch.randn(args.captions, 3, d), dim=-1)
    lengths = torch.full((args.captions,), 3)

    class _Weights:
        weight_fused = 0.95

    from vlret.models.matchers.cvse import CVSE

    score = CVSE.score.__get__(_Weights())  # the scorer's method on the weight alone
    print(f"load: {machine.load_average()}; threads {torch.get_num_threads()}")
    got = score(regions, words, lengths)
    want = reference_scores(_Weights(), regions, words, lengths)
    print(f"max |block - reference| {float((got.double() - want).abs().max()):.2e}")
    bound = gemm_bound(_Weights(), regions, words, lengths)
    times = {}
    for name, fn in (
        ("reference", lambda: reference_scores(_Weights(), regions, words, lengths)),
        ("block", lambda: score(regions, words, lengths)),
        ("bound", bound),
    ):
        best = float("inf")
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            fn()
            best = min(best, time.perf_counter() - t0)
        times[name] = best
    print(
        f"{args.images} images x {args.captions} captions, D={d}: reference "
        f"{times['reference'] * 1e3:.1f} ms, block {times['block'] * 1e3:.2f} ms, bound "
        f"{times['bound'] * 1e3:.2f} ms; reference/block "
        f"{times['reference'] / times['block']:.1f}x, "
        f"block/bound {times['block'] / times['bound']:.2f}x"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=256)
    parser.add_argument("--captions", type=int, default=1280)
    parser.add_argument("--dim", type=int, default=1024)
    parser.add_argument("--repeat", type=int, default=5)
    _bench(parser.parse_args())
