"""smooth_rank, visual_semantic_loss and VisualSemanticLoss against naive loops and limits."""

from __future__ import annotations

import math

import pytest
import torch

from vlret.losses import (
    VisualSemanticLoss,
    available_losses,
    build_loss,
    smooth_rank,
    triplet_loss,
    unified_loss,
    visual_semantic_loss,
)
from vlret.semantic import CaptionTfidf
from vlret.similarity import cosine_similarity, positive_mask


def naive_rank(m: torch.Tensor, tau: float, descending: bool = True) -> torch.Tensor:
    """Eq. (4) with k != j, an O(n^3) Python loop with the exponent clamped at +-50."""
    rows, n = m.shape
    out = torch.empty(rows, n, dtype=torch.float64)
    for i in range(rows):
        for j in range(n):
            total = 1.0
            for k in range(n):
                if k != j:
                    x = float(m[i, k] - m[i, j]) if descending else float(m[i, j] - m[i, k])
                    total += 1.0 / (1.0 + math.exp(-max(-50.0, min(50.0, x / tau))))
            out[i, j] = total
    return out


def naive_vsl(sim: torch.Tensor, sem: torch.Tensor, tau: float, descending: bool = True) -> float:
    """Eq. (5) as a double loop over the two naive rank matrices."""
    sr, cr = naive_rank(sim, tau, descending), naive_rank(sem, tau, descending)
    n = sim.shape[0]
    acc = 0.0
    for i in range(n):
        for j in range(n):
            a, b = float(sr[i, j]), float(cr[i, j])
            acc += min(a, b) / max(a, b)
    return 1.0 - acc / n**2


def torch_rank(m: torch.Tensor, tau: float, descending: bool = True) -> torch.Tensor:
    """Differentiable all-at-once Eq. (4) used as the autograd oracle for the custom backward."""
    diff = m[:, None, :] - m[:, :, None]  # [i, j, k] = m_ik - m_ij
    z = (diff if descending else -diff) / tau
    sig = torch.sigmoid(z.clamp(-50, 50))
    off_diag = ~torch.eye(m.shape[1], dtype=torch.bool)
    return 1 + (sig * off_diag).sum(-1)


def near_tie_matrix(rows: int, n: int, seed: int, spread: float = 0.004) -> torch.Tensor:
    """Values a few tau apart, so the tau = 0.001 sigmoids are not all saturated."""
    g = torch.Generator().manual_seed(seed)
    return torch.rand(rows, n, generator=g, dtype=torch.float64) * spread


# -- smooth_rank -------------------------------------------------------------------------------


@pytest.mark.parametrize("descending", [True, False])
@pytest.mark.parametrize("tau", [0.001, 0.05])
def test_smooth_rank_matches_naive_loop(descending, tau):
    m = near_tie_matrix(5, 7, seed=0, spread=10 * tau)
    got = smooth_rank(m, tau=tau, descending=descending)
    torch.testing.assert_close(got, naive_rank(m, tau, descending), rtol=0, atol=1e-12)


@pytest.mark.parametrize("descending", [True, False])
def test_smooth_rank_tends_to_exact_ranks(descending):
    g = torch.Generator().manual_seed(1)
    m = torch.randperm(60, generator=g).reshape(4, 15).double() * 0.01  # distinct, 0.01 apart
    order = torch.argsort(m, dim=1, descending=descending)
    exact = torch.empty_like(m)
    exact.scatter_(1, order, torch.arange(1, 16, dtype=m.dtype).expand(4, 15).contiguous())
    for tau, atol in ((1e-3, 1e-3), (1e-5, 1e-12)):
        got = smooth_rank(m, tau=tau, descending=descending)
        torch.testing.assert_close(got, exact, rtol=0, atol=atol)


def test_orientations_sum_to_n_plus_one_and_ties_split():
    m = near_tie_matrix(3, 9, seed=2)
    total = smooth_rank(m) + smooth_rank(m, descending=False)
    torch.testing.assert_close(total, torch.full_like(m, 10.0))
    tied = torch.tensor([[0.3, 0.3, 0.9]])
    torch.testing.assert_close(smooth_rank(tied), torch.tensor([[2.5, 2.5, 1.0]]))


@pytest.mark.parametrize("rank_block", [1, 3, None])
def test_custom_backward_matches_autograd_oracle(rank_block):
    m = near_tie_matrix(6, 8, seed=3).requires_grad_()
    upstream = torch.randn(6, 8, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    (grad,) = torch.autograd.grad(smooth_rank(m, rank_block=rank_block), m, upstream)
    ref = m.detach().clone().requires_grad_()
    (expected,) = torch.autograd.grad(torch_rank(ref, 0.001), ref, upstream)
    assert expected.abs().max() > 1  # the near ties make the gradient non-trivial
    torch.testing.assert_close(grad, expected, rtol=1e-9, atol=1e-9)


def test_second_backward_through_retained_graph_recomputes():
    m = near_tie_matrix(5, 6, seed=13).requires_grad_()
    ranks = smooth_rank(m)  # one block: the backward consumes the kept sigmoids
    upstream = torch.rand(5, 6, dtype=torch.float64)
    (first,) = torch.autograd.grad(ranks, m, upstream, retain_graph=True)
    (second,) = torch.autograd.grad(ranks, m, upstream)
    torch.testing.assert_close(first, second, rtol=0, atol=0)


def test_gradcheck_both_orientations_and_chunked():
    m = near_tie_matrix(4, 5, seed=5, spread=1.0).requires_grad_()
    for descending in (True, False):
        for rank_block in (None, 1):
            torch.autograd.gradcheck(
                lambda x, d=descending, c=rank_block: smooth_rank(
                    x, tau=0.2, descending=d, rank_block=c
                ),
                (m,),
            )


def test_chunked_forward_equals_single_block():
    m = torch.randn(10, 12, dtype=torch.float64) * 0.01
    whole = smooth_rank(m)
    for rank_block in (1, 4, 100):
        torch.testing.assert_close(smooth_rank(m, rank_block=rank_block), whole)


def test_large_batch_saves_only_quadratic_memory_for_backward():
    n = 200  # n^3 = 8M pairwise terms, more than one block: recomputed in the backward
    m = (torch.randn(n, n) * 0.01).requires_grad_()
    saved: list[int] = []

    def pack(t):
        saved.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        ranks = smooth_rank(m)
    assert sum(saved) <= 2 * n * n
    ranks.sum().backward()
    assert torch.isfinite(m.grad).all()


def test_half_precision_computes_in_float32():
    m = (torch.randn(6, 6) * 0.01).half().requires_grad_()
    ranks = smooth_rank(m)
    assert ranks.dtype == torch.float32
    ranks.sum().backward()
    assert m.grad.dtype == torch.float16 and torch.isfinite(m.grad).all()


def test_smooth_rank_errors():
    with pytest.raises(ValueError, match="m must be a torch.Tensor"):
        smooth_rank([[1.0, 2.0]])
    with pytest.raises(ValueError, match="m must be a non-empty 2-D"):
        smooth_rank(torch.ones(3))
    with pytest.raises(ValueError, match="tau must be a positive"):
        smooth_rank(torch.ones(2, 2), tau=0.0)
    with pytest.raises(ValueError, match=r"rank_block must be >= 1 \(or None\), got 0"):
        smooth_rank(torch.ones(2, 2), rank_block=0)
    with pytest.raises(ValueError, match="m contains NaN"):
        smooth_rank(torch.tensor([[0.0, float("nan")]]))
    with pytest.raises(
        ValueError, match="m must be a floating-point tensor, got dtype torch.int64"
    ):
        smooth_rank(torch.ones(2, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="m must be a floating-point tensor"):
        smooth_rank(torch.ones(2, 2, dtype=torch.bool))


def test_batch_1024_forward_backward_is_chunked(monkeypatch):
    """At B = 1024 no (B, B, B) block (4 GiB in float32) is ever built, forward or backward.

    Every pairwise-sigmoid block goes through ``_pairwise_sigmoids``; the spy records its shape
    and fails (before allocating) on any block over the 4M-element budget. To stay fast it
    does not compute sigmoids: forward blocks are a broadcast constant and backward blocks
    (which the backward overwrites in place) a reused buffer. This test checks the blocking;
    the numerics are covered by the naive-loop tests above. (The PyTorch path: the native
    kernel, which never forms a block, is covered by test_smooth_rank_native.py.)
    """
    import vlret.losses.vsl_rank as rank_module

    n = 1024
    budget = rank_module._BLOCK_ELEMENTS
    buffer = torch.full((budget,), 0.5)
    blocks: dict[str, list[tuple[int, int]]] = {"forward": [], "backward": []}
    phase = "forward"

    def spy(scaled):
        rows, cols = scaled.shape
        blocks[phase].append((rows, cols))
        assert rows < n and rows * cols * cols <= budget, f"unchunked block {rows}x{cols}^2"
        if phase == "forward":
            return torch.tensor(0.5).expand(rows, cols, cols)
        return buffer[: rows * cols * cols].view(rows, cols, cols)

    monkeypatch.setattr(rank_module, "_pairwise_sigmoids", spy)
    sim = torch.zeros(n, n, requires_grad=True)
    saved: list[int] = []

    def pack(t):
        saved.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = visual_semantic_loss(sim, torch.zeros(n, n), kernel="torch")  # both ranks
    assert max(saved) <= n * n  # nothing cubic is kept for the backward
    phase = "backward"
    loss.backward()
    rows_per_block = budget // (n * n)
    assert rows_per_block == 4
    # The two forward rank passes and the backward each cover all n rows in 4-row blocks.
    assert blocks["forward"] == [(rows_per_block, n)] * (2 * n // rows_per_block)
    assert blocks["backward"] == [(rows_per_block, n)] * (n // rows_per_block)
    assert torch.isfinite(sim.grad).all()


# -- visual_semantic_loss ------------------------------------------------------------------------


@pytest.mark.parametrize("descending", [True, False])
def test_loss_matches_naive_eq5(descending):
    sim = near_tie_matrix(6, 6, seed=6, spread=0.01)
    sem = near_tie_matrix(6, 6, seed=7, spread=0.01)
    got = visual_semantic_loss(sim, sem, descending=descending)
    assert got.item() == pytest.approx(naive_vsl(sim, sem, 0.001, descending), abs=1e-12)


def test_loss_zero_when_rankings_agree_positive_when_they_disagree():
    g = torch.Generator().manual_seed(8)
    sem = torch.randperm(64, generator=g).reshape(8, 8).double() * 0.05  # 50 tau apart
    assert visual_semantic_loss(sem, sem).item() == 0.0
    agree = 0.8 * sem - 0.3  # same order in every row, values still 40 tau apart
    assert visual_semantic_loss(agree, sem).item() < 1e-12
    assert visual_semantic_loss(-sem, sem).item() > 0.3


def test_default_orientation_weighs_the_top_of_each_ranking():
    sem = torch.linspace(1.0, 0.1, 10, dtype=torch.float64).expand(10, 10).contiguous()
    top_swapped, bottom_swapped = sem.clone(), sem.clone()
    top_swapped[:, [0, 1]] = sem[:, [1, 0]]
    bottom_swapped[:, [8, 9]] = sem[:, [9, 8]]
    for descending, top_heavier in ((True, True), (False, False)):
        top = visual_semantic_loss(top_swapped, sem, descending=descending).item()
        bottom = visual_semantic_loss(bottom_swapped, sem, descending=descending).item()
        assert (top > 5 * bottom) if top_heavier else (bottom > 5 * top)


def test_text_side_is_eq7_on_the_transpose():
    sim = near_tie_matrix(5, 5, seed=9, spread=0.01)
    sem, txt_sem = near_tie_matrix(5, 5, seed=10), near_tie_matrix(5, 5, seed=11)
    got = visual_semantic_loss(sim, sem, text_semantic_sim=txt_sem)
    expected = naive_vsl(sim, sem, 0.001) + naive_vsl(sim.t(), txt_sem, 0.001)
    assert got.item() == pytest.approx(expected, abs=1e-12)


def test_reductions_and_gradients():
    sim = (torch.rand(12, 12, dtype=torch.float64) * 0.02).requires_grad_()
    sem = torch.rand(12, 12, dtype=torch.float64)
    per_index = visual_semantic_loss(sim, sem, reduction="none")
    assert per_index.shape == (12,)
    mean = visual_semantic_loss(sim, sem)
    torch.testing.assert_close(per_index.mean(), mean)
    torch.testing.assert_close(visual_semantic_loss(sim, sem, reduction="sum"), 12 * mean)
    mean.backward()
    assert torch.isfinite(sim.grad).all() and sim.grad.abs().sum() > 0


def test_semantic_side_gets_no_gradient():
    sim = (torch.rand(5, 5) * 0.01).requires_grad_()
    sem = torch.rand(5, 5, requires_grad=True)
    visual_semantic_loss(sim, sem).backward()
    assert sem.grad is None


def test_loss_errors():
    sim = torch.rand(4, 4)
    with pytest.raises(ValueError, match=r"semantic_sim must have shape \(4, 4\)"):
        visual_semantic_loss(sim, torch.rand(3, 3))
    with pytest.raises(ValueError, match="text_semantic_sim must have shape"):
        visual_semantic_loss(sim, torch.rand(4, 4), text_semantic_sim=torch.rand(4, 5))
    with pytest.raises(ValueError, match="semantic_sim must be a torch.Tensor"):
        visual_semantic_loss(sim, [[0.0] * 4] * 4)
    with pytest.raises(ValueError, match="semantic_sim contains NaN"):
        visual_semantic_loss(sim, torch.full((4, 4), float("nan")))
    with pytest.raises(ValueError, match="sim must be square"):
        visual_semantic_loss(torch.rand(4, 3), torch.rand(4, 3))
    with pytest.raises(ValueError, match="reduction must be one of"):
        visual_semantic_loss(sim, sim, reduction="max")


# -- VisualSemanticLoss --------------------------------------------------------------------------

CORPUS = {
    10: ["a dog runs on the grass", "brown dog playing in a field"],
    11: ["a dog catches a frisbee", "dog jumping on the grass", "puppy with a frisbee"],
    12: ["a red bus on the street"],
    13: ["double decker bus parked on a street", "red bus driving"],
    14: ["a pizza on a table", "cheese pizza and a knife on a table"],
    15: ["kitchen with a table and pizza"],
}


@pytest.fixture(scope="module")
def tfidf() -> CaptionTfidf:
    return CaptionTfidf().fit(CORPUS)


def embeddings(batch: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    img = torch.randn(batch, 16, generator=g)
    txt = img + 0.5 * torch.randn(batch, 16, generator=g)
    return img.requires_grad_(), txt.requires_grad_()


def test_registered_and_default_is_triplet_plus_ten_vsl(tfidf):
    assert "vsl" in available_losses()
    loss = build_loss("vsl", semantic=tfidf)
    assert isinstance(loss, VisualSemanticLoss) and loss.alpha == 1 and loss.beta == 10
    ids = [10, 11, 12, 13, 14, 15, 11]  # image 11 twice: a further positive
    img, txt = embeddings(len(ids))
    got = loss(img, txt, img_ids=ids)
    sim = cosine_similarity(img, txt)
    mask = positive_mask(ids, ids)
    expected = triplet_loss(sim, pos_mask=mask, reduction="sum") + 10 * visual_semantic_loss(
        sim, tfidf.similarity(ids)
    )
    torch.testing.assert_close(got, expected)
    got.backward()
    assert torch.isfinite(img.grad).all() and torch.isfinite(txt.grad).all()


def test_unified_base_and_module_base(tfidf):
    ids = [10, 12, 14, 15]
    img, txt = embeddings(4, seed=1)
    sim = cosine_similarity(img, txt)
    vsl = visual_semantic_loss(sim, tfidf.similarity(ids))
    loss = build_loss("vsl", semantic=tfidf, base="unified", base_params={"gamma": 50.0}, beta=3)
    torch.testing.assert_close(loss(img, txt, ids), unified_loss(sim, gamma=50.0) + 3 * vsl)
    module = VisualSemanticLoss(semantic=tfidf, base=build_loss("infonce"), alpha=0.5)
    from vlret.losses import infonce_loss

    torch.testing.assert_close(module(img, txt, ids), 0.5 * infonce_loss(sim) + 10 * vsl)


def test_from_similarity_with_explicit_matrices_and_text_side(tfidf):
    sim = near_tie_matrix(4, 4, seed=12, spread=0.01)
    sem, txt_sem = torch.rand(4, 4, dtype=torch.float64), torch.rand(4, 4, dtype=torch.float64)
    loss = VisualSemanticLoss(text_side=True, alpha=0.0)
    got = loss.from_similarity(sim, semantic_sim=sem, text_semantic_sim=txt_sem)
    torch.testing.assert_close(got, 10 * visual_semantic_loss(sim, sem, text_semantic_sim=txt_sem))
    captions = ["a dog runs", "red bus", "pizza on a table", "dog on the grass"]
    with_caps = VisualSemanticLoss(semantic=tfidf, text_side=True)
    expected = triplet_loss(sim) + 10 * visual_semantic_loss(
        sim,
        tfidf.similarity([10, 12, 14, 11]),
        text_semantic_sim=tfidf.caption_similarity(captions),
    )
    got = with_caps.from_similarity(sim, img_ids=[10, 12, 14, 11], captions=captions)
    torch.testing.assert_close(got, expected)


def test_reduction_none_per_index(tfidf):
    ids = [10, 11, 12, 13, 14]
    img, txt = embeddings(5, seed=2)
    loss = VisualSemanticLoss(semantic=tfidf, reduction="none", base_params={"reduction": "none"})
    per_index = loss(img, txt, ids)
    sim = cosine_similarity(img, txt)
    expected = triplet_loss(sim, reduction="none") + 10 * visual_semantic_loss(
        sim, tfidf.similarity(ids), reduction="none"
    )
    torch.testing.assert_close(per_index, expected)


def naive_image_similarity(corpus: dict, a, b) -> float:
    """Eq. (3) from scratch: dense TF-IDF of every caption, mean of the Q_a x Q_b cosines."""
    from sklearn.feature_extraction.text import TfidfVectorizer

    texts = [c for caps in corpus.values() for c in caps]
    vec = TfidfVectorizer().fit(texts)
    va, vb = vec.transform(corpus[a]).toarray(), vec.transform(corpus[b]).toarray()
    return float((va @ vb.T).mean())  # rows are L2-normalised: dot products are cosines


@pytest.mark.parametrize("entry", ["forward", "from_similarity"])
def test_semantic_columns_follow_txt_ids(tfidf, entry):
    """C[i, j] compares row i's image with the image of text j, txt_ids[j], not img_ids[j]."""
    img_ids = [10, 12, 14, 11, 13]
    txt_ids = [10, 12, 14, 15, 11]  # texts 3 and 4 describe images 15 and 11
    img, txt = embeddings(5, seed=3)
    sim = cosine_similarity(img, txt)
    sem = torch.tensor(
        [[naive_image_similarity(CORPUS, a, b) for b in txt_ids] for a in img_ids],
        dtype=torch.float64,
    )
    assert not torch.allclose(sem, tfidf.similarity(img_ids, dtype=torch.float64))
    loss = VisualSemanticLoss(semantic=tfidf, alpha=0.0, beta=1.0)
    if entry == "forward":
        got = loss(img.double(), txt.double(), img_ids, txt_ids)
    else:
        got = loss.from_similarity(sim.detach().double(), img_ids=img_ids, txt_ids=txt_ids)
    want = naive_vsl(sim.detach().double(), sem, 0.001)
    assert got.item() == pytest.approx(want, abs=1e-9)
    # With the base term too, the positive mask comes from the same ids.
    full = VisualSemanticLoss(semantic=tfidf)(img, txt, img_ids, txt_ids)
    mask = positive_mask(img_ids, txt_ids)
    expected = triplet_loss(sim, pos_mask=mask, reduction="sum") + 10 * visual_semantic_loss(
        sim, tfidf.similarity(img_ids, txt_ids)
    )
    torch.testing.assert_close(full, expected)


def test_unknown_ids_are_named_as_the_module_argument(tfidf):
    img, txt = embeddings(3)
    loss = VisualSemanticLoss(semantic=tfidf)
    with pytest.raises(ValueError, match=r"^img_ids: 1 id\(s\) are not in the fitted.*\[99\]"):
        loss(img, txt, [10, 11, 99])
    with pytest.raises(ValueError, match=r"^txt_ids: 1 id\(s\) are not in the fitted.*\[98\]"):
        loss(img, txt, [10, 11, 12], [10, 11, 98])
    with pytest.raises(ValueError, match=r"^img_ids must be 1-D"):
        loss.from_similarity(torch.rand(2, 2), img_ids=torch.ones(2, 1, dtype=torch.long))
    with pytest.raises(ValueError, match=r"txt_ids must have one id per column \(3\)"):
        loss.from_similarity(torch.rand(3, 3), img_ids=[10, 11, 12], txt_ids=[10, 11])


def test_module_errors(tfidf):
    img, txt = embeddings(3)
    with pytest.raises(ValueError, match="img_ids is required"):
        VisualSemanticLoss(semantic=tfidf)(img, txt)
    with pytest.raises(ValueError, match="not in the fitted captions"):
        VisualSemanticLoss(semantic=tfidf)(img, txt, [10, 11, 99])
    with pytest.raises(ValueError, match="no semantic similarity"):
        VisualSemanticLoss()(img, txt, [10, 11, 12])
    with pytest.raises(ValueError, match="img_ids must have one id per row"):
        VisualSemanticLoss(semantic=tfidf).from_similarity(torch.rand(3, 3), img_ids=[10, 11])
    with pytest.raises(ValueError, match="text_side=True needs"):
        VisualSemanticLoss(semantic=tfidf, text_side=True)(img, txt, [10, 11, 12])
    with pytest.raises(ValueError, match="semantic must be a fitted CaptionTfidf"):
        VisualSemanticLoss(semantic=CaptionTfidf())
    with pytest.raises(ValueError, match="semantic must be a fitted CaptionTfidf"):
        VisualSemanticLoss(semantic={10: ["a dog"]})
    with pytest.raises(ValueError, match="base must be another loss"):
        VisualSemanticLoss(base="vsl")
    with pytest.raises(ValueError, match="unknown loss"):
        VisualSemanticLoss(base="nope")
    with pytest.raises(ValueError, match="base must be a registered loss name"):
        VisualSemanticLoss(base=torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="reduction='none' must be used by both"):
        VisualSemanticLoss(reduction="none")
    with pytest.raises(ValueError, match="beta must be >= 0"):
        VisualSemanticLoss(beta=-1.0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_loss_on_cuda_matches_cpu(dtype):
    sim = near_tie_matrix(64, 64, seed=14, spread=0.05)
    sem = near_tie_matrix(64, 64, seed=15, spread=0.5)
    s = sim.to("cuda", dtype).requires_grad_()
    out = visual_semantic_loss(s, sem.cuda())
    out.backward()
    ref_in = s.detach().cpu().double().requires_grad_()
    ref = visual_semantic_loss(ref_in, sem)
    ref.backward()
    torch.testing.assert_close(out.double().cpu(), ref, rtol=1e-4, atol=1e-4)
    tol = 1e-4 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(s.grad.double().cpu(), ref_in.grad, rtol=tol, atol=tol)
