"""COCO-5K-sized evaluation (5000 images, 25000 texts, D=1024, float32), measured side by side.

Prints the time of vlret's `retrieval_metrics` relative to (i) the bare float32 similarity
matmul and (ii) an evaluation in the style of the VSE-infinity code (float64 numpy similarity,
then a per-query argsort loop in each direction), written here. Targets: <= 1.2x the matmul and
>= 3x faster than the argsort loop.

    python benchmarks/bench_metrics.py [--images 5000] [--per-image 5] [--dim 1024] [--repeats 3]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from vlret.metrics import metrics_from_ranks, retrieval_metrics


def argsort_loop_eval(img: np.ndarray, txt: np.ndarray, txt_to_img: np.ndarray):
    """VSE-infinity style: float64 similarity, then argsort per query, in both directions."""
    sims = img.astype(np.float64) @ txt.astype(np.float64).T
    n_img, n_txt = sims.shape
    captions_of = [np.flatnonzero(txt_to_img == i) for i in range(n_img)]
    i2t = np.zeros(n_img, dtype=np.int64)
    for i in range(n_img):
        inds = np.argsort(sims[i])[::-1]
        i2t[i] = min(np.where(inds == j)[0][0] for j in captions_of[i])
    t2i = np.zeros(n_txt, dtype=np.int64)
    for j in range(n_txt):
        inds = np.argsort(sims[:, j])[::-1]
        t2i[j] = np.where(inds == txt_to_img[j])[0][0]
    return metrics_from_ranks(torch.from_numpy(i2t), torch.from_numpy(t2i))


def best_time(fn, repeats: int) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - start)
    return best, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=5000)
    parser.add_argument("--per-image", type=int, default=5)
    parser.add_argument("--dim", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()

    g = torch.Generator().manual_seed(0)
    img = torch.nn.functional.normalize(torch.randn(args.images, args.dim, generator=g), dim=1)
    txt_to_img = torch.arange(args.images).repeat_interleave(args.per_image)
    noise = torch.randn(len(txt_to_img), args.dim, generator=g) * 8.0 / args.dim**0.5
    txt = torch.nn.functional.normalize(img[txt_to_img] + noise, dim=1)
    dev = torch.device(args.device)
    img_d, txt_d, t2i_d = img.to(dev), txt.to(dev), txt_to_img.to(dev)

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize()

    def matmul():
        s = img_d @ txt_d.t()
        sync()
        return s

    def ours():
        m = retrieval_metrics(img_d, txt_d, t2i_d)
        sync()
        return m

    print(
        f"torch {torch.__version__}, threads {torch.get_num_threads()}, device {dev}, "
        f"{args.images} images x {len(txt_to_img)} texts, D={args.dim}, float32"
    )
    ours()  # warm-up
    t_mm, _ = best_time(matmul, args.repeats)
    t_ours, m_ours = best_time(ours, args.repeats)
    print(f"bare similarity matmul        {t_mm:8.3f} s")
    print(
        f"vlret retrieval_metrics       {t_ours:8.3f} s   ratio to matmul {t_ours / t_mm:5.2f}x"
        "  (target <= 1.2x)"
    )
    start = time.perf_counter()
    m_loop = argsort_loop_eval(img.numpy(), txt.numpy(), txt_to_img.numpy())
    t_loop = time.perf_counter() - start
    print(
        f"VSE-infinity style argsort    {t_loop:8.3f} s   speed-up of vlret {t_loop / t_ours:5.2f}x"
        "  (target >= 3x)"
    )
    same = all(abs(m_ours[k] - m_loop[k]) < 1e-9 for k in m_ours.as_dict())
    print(
        f"metrics agree with the argsort loop: {same}  "
        f"(rsum {m_ours.rsum:.2f} vs {m_loop.rsum:.2f})"
    )


if __name__ == "__main__":
    main()
