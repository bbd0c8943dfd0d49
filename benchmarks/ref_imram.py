"""IMRAM's reference scoring loop and the GEMM bound of vlret's block scorer.

``reference_scores`` is the release's evaluation (HuiChen24/IMRAM ``evaluation.py``
``shard_xattn_*_IMRAM``: 128 x 128 shards) around ``model.py``'s ``xattn_score_Text_IMRAM`` /
``xattn_score_Image_IMRAM`` (one caption at a time, repeated over the shard's images; ``K``
rounds of ``func_attention``, the cosine of the ORIGINAL fragments with the attended context
averaged over the query fragments, then ``gated_memory_t2i`` / ``gated_memory_i2t`` on the
concatenation ``[query; attended]``, renormalised only without ``--no_IMRAM_norm``), rewritten
step for step and run with the weights of a vlret :class:`~vlret.models.matchers.imram.IMRAM`
(read through its ``reference_names``). The per-step matrices are summed as
``forward_score`` sums them (Full-IMRAM: both directions).

``gemm_bound`` times the bare matrix products :func:`~vlret.models.matchers.imram_scores.
imram_scores` must do, at its own block sizes (``imram_plan``), into preallocated outputs.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from reference_loops import _cosine, _l2norm, ref_attention, sharded
from vlret.models.matchers.imram_scores import DIRECTIONS, imram_plan


def _weights(model) -> dict[str, torch.Tensor]:
    ours = {**model.state_dict(), **dict(model.named_parameters())}  # parameters: with grad
    return {
        ref.removeprefix("module."): ours[name] for ref, name in model.reference_names().items()
    }


def _gated_memory(p, direction, query, attended):
    """gated_memory_t2i / gated_memory_i2t."""
    joint = torch.cat([query, attended], -1)
    out = torch.tanh(
        F.linear(joint, p[f"linear_{direction}.weight"], p[f"linear_{direction}.bias"])
    )
    gate = torch.sigmoid(
        F.linear(joint, p[f"gate_{direction}.weight"], p[f"gate_{direction}.bias"])
    )
    return query * gate + out * (1 - gate)


def _imram_shard(model, p, direction, images, captions, lengths):
    """xattn_score_Text_IMRAM (``t2i``) or xattn_score_Image_IMRAM (``i2t``) on one shard:
    the per-step ``(n_images, n_captions)`` matrices."""
    n_image = images.shape[0]
    steps = [[] for _ in range(model.steps)]
    for i in range(captions.shape[0]):
        cap_i = captions[i, : lengths[i], :].unsqueeze(0).contiguous()
        cap_i_expand = cap_i.repeat(n_image, 1, 1)
        original = cap_i_expand if direction == "t2i" else images
        context = images if direction == "t2i" else cap_i_expand
        query = original
        for j in range(model.steps):
            attended = ref_attention(query, context, model.lambda_softmax)
            row_sim = _cosine(original, attended).view(n_image, -1).mean(dim=1, keepdim=True)
            steps[j].append(row_sim)
            query = _gated_memory(p, direction, query, attended)
            if model.renorm_memory:
                query = _l2norm(query, -1)
    return [torch.cat(step, 1) for step in steps]


def reference_scores(model, regions, words, word_lengths) -> torch.Tensor:
    """The release's scores of every (image, caption) pair, ``(n_img, n_cap)``.

    Args:
        model: A vlret ``IMRAM`` (its weights, ``mode``, ``steps``, ``lambda_softmax`` and
            ``renorm_memory``).
        regions: ``(n_img, R, D)`` encoded regions.
        words: ``(n_cap, L, D)`` encoded words.
        word_lengths: ``(n_cap,)`` real words per caption.

    Returns:
        The summed per-step scores, in the inputs' dtype.
    """
    p = {k: v.to(regions.dtype) for k, v in _weights(model).items()}
    total = None
    for direction in DIRECTIONS[model.mode]:

        def shard(images, captions, lengths, direction=direction):
            return sum(_imram_shard(model, p, direction, images, captions, lengths))

        part = sharded(shard, regions, words, torch.as_tensor(word_lengths))
        total = part if total is None else total + part
    assert total is not None
    return total


def _products(model, n_img, n_regions, dim, lengths, max_elements):
    """``(batch, m, k, n)`` of every product ``imram_scores`` runs (``batch`` None: a 2-D
    product)."""
    image_step, order, blocks = imram_plan(
        n_img, n_regions, dim, lengths, mode=model.mode, steps=model.steps,
        max_elements=max_elements,
    )  # fmt: skip
    image_sizes = [len(r) for r in torch.arange(n_img).split(image_step)]
    out = []
    for start, stop, longest in blocks:
        n_c = stop - start
        for n_i in image_sizes:
            for direction in DIRECTIONS[model.mode]:
                if direction == "t2i":
                    n_x, c, n_q, q = n_i, n_regions, n_c, longest
                else:
                    n_x, c, n_q, q = n_c, longest, n_i, n_regions
                out.append((None, n_x * c, dim, n_q * q))  # raw scores of step 1
                out.append((n_x, c, dim, c))  # the context's Gram matrices
                if model.steps > 1:
                    out.append((None, n_x * c, dim, 2 * dim))  # context projection
                    out.append((None, n_q * q, dim, 2 * dim))  # first memory's own term
                for step in range(model.steps):
                    out.append((n_x, n_q * q, c, c))  # A G
                    if step == model.steps - 1:
                        break
                    out.append((n_x, n_q * q, c, 2 * dim))  # A (C W_c^T)
                    if step > 0:
                        out.append((None, n_x * n_q * q, dim, 2 * dim))  # W_x x_k
                    out.append((n_x, n_q * q, dim, c))  # the next raw scores
    return out


def gemm_bound(model, regions, words, word_lengths, *, max_elements=None) -> Callable[[], None]:
    """A closure running only the matrix products of ``model.score`` on these inputs.

    Args:
        model: A vlret ``IMRAM``.
        regions: ``(n_img, R, D)`` encoded regions.
        words: ``(n_cap, L, D)`` encoded words.
        word_lengths: ``(n_cap,)`` real words per caption.
        max_elements: The scorer's bound (its default when None).

    Returns:
        A function that runs every product once, on preallocated operands and outputs.
    """
    n_img, n_regions, dim = regions.shape
    lengths = torch.as_tensor(word_lengths)
    dtype = regions.dtype
    calls, operands = [], {}
    for product in _products(model, n_img, n_regions, dim, lengths, max_elements):
        if product not in operands:  # one set of operands per shape (blocks repeat shapes)
            batch, m, k, n = product
            lead = () if batch is None else (batch,)
            a = torch.randn((*lead, m, k), dtype=dtype)
            b = torch.randn((*lead, n, k), dtype=dtype).transpose(-1, -2)
            operands[product] = (a, b, torch.empty((*lead, m, n), dtype=dtype))
        calls.append(operands[product])

    def run() -> None:
        for a, b, c in calls:
            if a.dim() == 2:
                torch.mm(a, b, out=c)
            else:
                torch.bmm(a, b, out=c)

    return run


def main(argv: list[str] | None = None) -> None:
    """Time the block scorer, the reference loop and the GEMM bound side by side, on random
    unit regions and words (captions of 8..18 words), in one single-threaded process; CPU
    time as well as wall time, since the benchmark machine is shared."""
    import argparse
    import time

    import machine
    from vlret.models import build_model

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--images", type=int, default=256)
    parser.add_argument("--captions", type=int, default=64)
    parser.add_argument("--dim", type=int, default=1024)
    parser.add_argument("--mode", default="text", choices=("text", "image", "full"))
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    print(f"load {machine.load_average()}; {machine.cpu_name()}; 1 thread")
    g = torch.Generator().manual_seed(0)
    regions = F.normalize(torch.randn(args.images, 36, args.dim, generator=g), dim=-1)
    lengths = torch.randint(8, 19, (args.captions,), generator=g)
    words = F.normalize(torch.randn(args.captions, 18, args.dim, generator=g), dim=-1)
    config = {"kind": "imram", "embed_dim": args.dim, "mode": args.mode, "steps": args.steps}
    model = build_model({**config, "image": {"in_dim": 8}}, vocab_size=8).eval()
    bound = gemm_bound(model, regions, words, lengths)
    times = {}
    with torch.no_grad():
        for name, fn in (
            ("block", lambda: model.score(regions, words, lengths)),
            ("bound", bound),
            ("reference", lambda: reference_scores(model, regions, words, lengths)),
        ):
            wall, cpu = time.perf_counter(), time.process_time()
            times[name] = (fn(), time.process_time() - cpu, time.perf_counter() - wall)
            print(f"{name}: {times[name][1]:.2f} s CPU, {times[name][2]:.2f} s wall", flush=True)
    err = (times["block"][0] - times["reference"][0]).abs().max().item()
    ref, block, floor = (times[k][1] for k in ("reference", "block", "bound"))
    print(
        f"{args.mode} {args.images} x {args.captions}, D={args.dim}, K={args.steps}: "
        f"reference / block {ref / block:.2f}x, block / GEMM bound {block / floor:.2f}x "
        f"(CPU time); max |block - reference| {err:.1e}; load {machine.load_average()}"
    )


__all__ = ["gemm_bound", "reference_scores"]

if __name__ == "__main__":
    main()
