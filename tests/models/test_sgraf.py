"""SGRAFScorer against a naive per-caption, per-image loop written from the reference algorithm.

The oracle below reads the scorer's weights through ``SGRAFScorer.reference_names`` (so the
reference parameter names are exercised too) and recomputes every pair on its own in float64,
as Paranioar/SGRAF's ``EncoderSimilarity`` does caption by caption.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from vlret.models.sgraf import SGRAFScorer

D, S, R = 12, 8, 5


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny tensors: thread hand-offs would cost more than the work on a loaded CPU."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


EPS = 1e-8  # the reference l2norm / l1norm eps
BN_EPS = 1e-5


def _l2n(x):
    return x / (x.pow(2).sum(-1, keepdim=True).sqrt() + EPS)


def _reference_state(scorer: SGRAFScorer, module: str, steps: int) -> dict[str, torch.Tensor]:
    own = scorer.state_dict()
    return {
        ref: own[ours].double().clone()
        for ref, ours in scorer.reference_names(module, steps).items()
    }


class _BN:
    """BatchNorm in the reference's two modes; training mode records each call's stats."""

    def __init__(self, p, name, training):
        self.p, self.name, self.training = p, name, training
        self.calls: list[tuple[torch.Tensor, torch.Tensor]] = []  # (mean, unbiased var)

    def __call__(self, x):  # x (N, C, *)
        p, n = self.p, self.name
        shape = [1, x.shape[1]] + [1] * (x.dim() - 2)
        if self.training:
            dims = [d for d in range(x.dim()) if d != 1]
            mean, var = x.mean(dims), x.var(dims, unbiased=False)
            count = x.numel() // x.shape[1]
            self.calls.append((mean, var * count / (count - 1)))
        else:
            mean, var = p[n + ".running_mean"], p[n + ".running_var"]
        out = (x - mean.view(shape)) / torch.sqrt(var.view(shape) + BN_EPS)
        return out * p[n + ".weight"].view(shape) + p[n + ".bias"].view(shape)

    def running(self, momentum=0.1):
        mean, var = self.p[self.name + ".running_mean"], self.p[self.name + ".running_var"]
        for m, v in self.calls:  # one update per call, in order
            mean, var = (1 - momentum) * mean + momentum * m, (1 - momentum) * var + momentum * v
        return mean, var


def naive_scores(p, regions, words, lengths, module, steps, lam=9.0, training=False):
    """Per caption, per image, float64, dropout off; returns scores and the BN helpers."""

    def lin(x, name):
        return x @ p[name + ".weight"].T + p[name + ".bias"]

    regions, words = regions.double(), words.double()
    bns = {
        k: _BN(p, k, training)
        for k in ("v_global_w.embedding_local.1", "v_global_w.embedding_global.1", "SAF_module.bn")
    }
    # VisualSA over every image of the call; BatchNorm1d(R) on (N, R, D): channels = regions.
    loc = torch.tanh(
        bns["v_global_w.embedding_local.1"](lin(regions, "v_global_w.embedding_local.0"))
    )
    glo = torch.tanh(
        bns["v_global_w.embedding_global.1"](lin(regions.mean(1), "v_global_w.embedding_global.0"))
    )
    w = torch.softmax(lin(loc * glo[:, None], "v_global_w.embedding_common.0")[..., 0], dim=1)
    img_glo = _l2n((w[..., None] * regions).sum(1))
    out = torch.zeros(regions.shape[0], words.shape[0], dtype=torch.float64)
    for c in range(words.shape[0]):
        cap = words[c, : int(lengths[c])]
        tl = torch.tanh(lin(cap, "t_global_w.embedding_local.0"))
        tg = torch.tanh(lin(cap.mean(0), "t_global_w.embedding_global.0"))
        tw = torch.softmax(lin(tl * tg, "t_global_w.embedding_common.0")[:, 0], dim=0)
        cap_glo = _l2n((tw[:, None] * cap).sum(0))
        embs = []
        for i in range(regions.shape[0]):
            attn = torch.nn.functional.leaky_relu(regions[i] @ cap.T, 0.1)  # (R, n)
            attn = attn / (attn.pow(2).sum(1, keepdim=True).sqrt() + EPS)  # over words
            attn = torch.softmax(lam * attn.T, dim=1)  # (n, R) over regions
            ctx = _l2n(attn @ regions[i])
            sim_loc = _l2n(lin((ctx - cap) ** 2, "sim_tranloc_w"))
            sim_glo = _l2n(lin((img_glo[i] - cap_glo) ** 2, "sim_tranglo_w"))
            embs.append(torch.cat([sim_glo[None], sim_loc], 0))
        emb = torch.stack(embs)  # (n_img, n + 1, S)
        if module == "sgr":
            for k in range(steps):
                q = lin(emb, f"SGR_module.{k}.graph_query_w")
                key = lin(emb, f"SGR_module.{k}.graph_key_w")
                edge = torch.softmax(q @ key.transpose(1, 2), dim=-1)
                emb = torch.relu(lin(edge @ emb, f"SGR_module.{k}.sim_graph_w"))
            vec = emb[:, 0]
        else:
            z = lin(emb, "SAF_module.attn_sim_w").permute(0, 2, 1)  # (n_img, 1, n + 1)
            gate = torch.sigmoid(bns["SAF_module.bn"](z))
            gate = gate / (gate.abs().sum(-1, keepdim=True) + EPS)
            vec = _l2n((gate @ emb)[:, 0])
        out[:, c] = torch.sigmoid(lin(vec, "sim_eval_w"))[:, 0]
    return out, bns


def _randomise(scorer: SGRAFScorer, seed: int = 0) -> SGRAFScorer:
    """Random biases and BatchNorm parameters/statistics, so that every weight matters."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in scorer.modules():
            if isinstance(m, nn.Linear):
                m.bias.copy_(0.3 * torch.randn(m.bias.shape, generator=g))
            elif isinstance(m, nn.BatchNorm1d):
                m.weight.copy_(1 + 0.3 * torch.randn(m.weight.shape, generator=g))
                m.bias.copy_(0.3 * torch.randn(m.bias.shape, generator=g))
                m.running_mean.copy_(0.2 * torch.randn(m.running_mean.shape, generator=g))
                m.running_var.copy_(0.5 + torch.rand(m.running_var.shape, generator=g))
    return scorer


def _tokens(n_img=4, n_cap=5, width=6, seed=1, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    regions = _l2n(torch.randn(n_img, R, D, generator=g, dtype=dtype))
    words = _l2n(torch.randn(n_cap, width, D, generator=g, dtype=dtype))
    lengths = torch.randint(1, width + 1, (n_cap,), generator=g)
    lengths[0] = width
    lengths[-1] = 1
    mask = torch.arange(width)[None] < lengths[:, None]
    words = words * mask[..., None]
    return regions, words, lengths


def _scorer(module="sgr", steps=3, seed=0, dropout=0.4, **kw):
    torch.manual_seed(seed)
    s = SGRAFScorer(D, S, module, steps, dropout=dropout, num_regions=R, **kw)
    return _randomise(s, seed)


@pytest.mark.parametrize("module,steps", [("sgr", 1), ("sgr", 3), ("saf", 3)])
def test_eval_matches_naive_reference(module, steps):
    scorer = _scorer(module, steps).eval()
    regions, words, lengths = _tokens()
    got = scorer(regions.float(), words.float(), lengths)
    want, _ = naive_scores(
        _reference_state(scorer, module, steps), regions, words, lengths, module, steps
    )
    assert got.dtype == torch.float32 and got.shape == want.shape
    # float32 with O(10) roundings per op chain on values in (0, 1).
    assert torch.allclose(got.double(), want, rtol=0, atol=2e-6)
    assert (got > 0).all() and (got < 1).all()
    # float64: the same numbers, and the same gradients as autograd through the naive loop.
    r64, w64 = regions.clone().requires_grad_(), words.clone().requires_grad_()
    got64 = scorer.double()(r64, w64, lengths)
    assert torch.allclose(got64, want, rtol=0, atol=1e-12)
    weights = torch.rand(want.shape, dtype=torch.float64)
    (got64 * weights).sum().backward()
    r_ref, w_ref = regions.clone().requires_grad_(), words.clone().requires_grad_()
    p = _reference_state(scorer, module, steps)
    (naive_scores(p, r_ref, w_ref, lengths, module, steps)[0] * weights).sum().backward()
    assert torch.allclose(r64.grad, r_ref.grad, rtol=0, atol=1e-12)
    assert torch.allclose(w64.grad, w_ref.grad, rtol=0, atol=1e-12)


@pytest.mark.parametrize("chunk_elements", [None, 1])
@pytest.mark.parametrize("module,steps", [("sgr", 1), ("sgr", 3), ("saf", 3)])
def test_eval_without_autograd_matches_naive_reference(module, steps, chunk_elements, monkeypatch):
    """The evaluation path (no autograd: the local projection in chunks of images, reused
    buffers, SGR without the logit offset), whole blocks or one image at a time."""
    import vlret.models.sgraf_ops as ops

    if chunk_elements is not None:
        monkeypatch.setattr(ops, "CPU_BLOCK_ELEMENTS", chunk_elements)
    scorer = _scorer(module, steps).eval()
    regions, words, lengths = _tokens()
    want, _ = naive_scores(
        _reference_state(scorer, module, steps), regions, words, lengths, module, steps
    )
    with torch.no_grad():
        got = scorer(regions.float(), words.float(), lengths)
        got64 = scorer.double()(regions, words, lengths)
    assert got.dtype == torch.float32 and got.shape == want.shape
    assert torch.allclose(got.double(), want, rtol=0, atol=2e-6)
    assert torch.allclose(got64, want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("module", ["sgr", "saf"])
def test_training_mode_batch_statistics_match_reference(module):
    """Dropout 0: image BatchNorms over the call's images; SAF's per caption, in order."""
    scorer = _scorer(module, 2, dropout=0.0).double().train()
    regions, words, lengths = _tokens()
    p = _reference_state(scorer, module, 2)
    want, bns = naive_scores(p, regions, words, lengths, module, 2, training=True)
    got = scorer(regions, words, lengths, max_elements=3 * 6 * D)
    assert torch.allclose(got, want, rtol=0, atol=1e-12)
    names = ["v_global_w.embedding_local.1", "v_global_w.embedding_global.1"]
    names += ["SAF_module.bn"] if module == "saf" else []
    state, mapping = scorer.state_dict(), scorer.reference_names(module, 2)
    for name in names:
        mean, var = bns[name].running()
        assert torch.allclose(state[mapping[name + ".running_mean"]], mean, atol=1e-12)
        assert torch.allclose(state[mapping[name + ".running_var"]], var, atol=1e-12)
        calls = len(bns[name].calls)
        assert int(state[mapping[name + ".num_batches_tracked"]]) == calls
    if module == "saf":
        assert len(bns["SAF_module.bn"].calls) == words.shape[0]  # one update per caption


@pytest.mark.parametrize("module", ["sgr", "saf"])
def test_training_mode_without_autograd_is_the_same(module):
    """Training mode under no_grad takes the evaluation path's kernels; SAF keeps every
    block's nodes for its statistics (not the reused buffer), over several blocks."""
    regions, words, lengths = _tokens(n_img=5, n_cap=7)
    with_grad = _scorer(module, 2, dropout=0.0).double().train()
    without = _scorer(module, 2, dropout=0.0).double().train()
    want = with_grad(regions, words, lengths, max_elements=2 * 6 * D)
    with torch.no_grad():
        got = without(regions, words, lengths, max_elements=2 * 6 * D)
    assert torch.allclose(got, want, rtol=0, atol=1e-12)
    state = without.state_dict()
    for name, value in with_grad.state_dict().items():
        assert torch.allclose(value.double(), state[name].double(), rtol=0, atol=1e-12), name


@pytest.mark.parametrize("module", ["sgr", "saf"])
def test_padding_garbage_changes_nothing(module):
    scorer = _scorer(module).eval()
    regions, words, lengths = _tokens(dtype=torch.float32)
    base = scorer(regions, words, lengths)
    g = torch.Generator().manual_seed(5)
    wide = 100 * torch.randn(words.shape[0], words.shape[1] + 3, D, generator=g)
    mask = torch.arange(words.shape[1])[None] < lengths[:, None]
    wide[:, : words.shape[1]][mask] = words[mask]
    wide[0, -1, 0] = float("nan")  # not even NaN beyond a caption's length takes part
    assert torch.allclose(scorer(regions, wide, lengths), base, rtol=0, atol=1e-6)


@pytest.mark.parametrize("module", ["sgr", "saf"])
def test_blocking_changes_nothing_in_eval_mode(module):
    scorer = _scorer(module).eval()
    regions, words, lengths = _tokens(n_img=5, n_cap=7, dtype=torch.float32)
    base = scorer(regions, words, lengths)
    for max_elements in (1, 2 * 6 * D, 7 * 6 * D + 1):
        got = scorer(regions, words, lengths, max_elements=max_elements)
        assert torch.allclose(got, base, rtol=0, atol=1e-6), max_elements


@pytest.mark.parametrize("module", ["sgr", "saf"])
def test_blocking_changes_nothing_in_training_mode(module):
    """Statistics span the whole call whatever the blocks (dropout off to compare)."""
    regions, words, lengths = _tokens(n_img=5, n_cap=7)
    results = []
    for max_elements in (None, 1, 2 * 6 * D):
        scorer = _scorer(module, dropout=0.0).double().train()
        out = scorer(regions, words, lengths, max_elements=max_elements)
        out.sum().backward()
        grads = torch.cat([p.grad.flatten() for p in scorer.parameters()])
        results.append((out, grads, {k: v.clone() for k, v in scorer.state_dict().items()}))
    for out, grads, state in results[1:]:
        assert torch.allclose(out, results[0][0], rtol=0, atol=1e-12)
        assert torch.allclose(grads, results[0][1], rtol=1e-9, atol=1e-12)
        for k, v in state.items():
            assert torch.allclose(v.double(), results[0][2][k].double(), atol=1e-12), k


def test_reference_names_is_a_bijection_onto_the_state_dict():
    for module, steps in [("sgr", 1), ("sgr", 3), ("sgr", 5), ("saf", 1), ("saf", 3)]:
        scorer = SGRAFScorer(D, S, module, steps, num_regions=R)
        mapping = SGRAFScorer.reference_names(module, steps)
        state = scorer.state_dict()
        assert sorted(mapping.values()) == sorted(state)
        assert len(set(mapping.values())) == len(mapping)
        ref = _reference_skeleton(module, steps).state_dict()
        assert sorted(mapping) == sorted(ref)
        for name, ours in mapping.items():
            assert ref[name].shape == state[ours].shape, name


def _reference_skeleton(module: str, steps: int) -> nn.Module:
    """The reference EncoderSimilarity's module layout (names and shapes only)."""

    def sa(bn: bool) -> nn.Module:
        m = nn.Module()
        loc = [nn.Linear(D, D)] + ([nn.BatchNorm1d(R)] if bn else []) + [nn.Tanh()]
        glo = [nn.Linear(D, D)] + ([nn.BatchNorm1d(D)] if bn else []) + [nn.Tanh()]
        m.embedding_local = nn.Sequential(*loc, nn.Dropout())
        m.embedding_global = nn.Sequential(*glo, nn.Dropout())
        m.embedding_common = nn.Sequential(nn.Linear(D, 1))
        return m

    root = nn.Module()
    root.v_global_w, root.t_global_w = sa(True), sa(False)
    root.sim_tranloc_w, root.sim_tranglo_w = nn.Linear(D, S), nn.Linear(D, S)
    root.sim_eval_w = nn.Linear(S, 1)
    if module == "sgr":
        steps_list = []
        for _ in range(steps):
            g = nn.Module()
            g.graph_query_w, g.graph_key_w = nn.Linear(S, S), nn.Linear(S, S)
            g.sim_graph_w = nn.Linear(S, S)
            steps_list.append(g)
        root.SGR_module = nn.ModuleList(steps_list)
    else:
        root.SAF_module = nn.Module()
        root.SAF_module.attn_sim_w, root.SAF_module.bn = nn.Linear(S, 1), nn.BatchNorm1d(1)
    return root


def test_initialisation_follows_reference():
    scorer = SGRAFScorer(64, 16, "sgr", 2, num_regions=R)
    for name, m in scorer.named_modules():
        if isinstance(m, nn.Linear):
            bound = math.sqrt(6.0 / (m.in_features + m.out_features))
            largest = float(m.weight.detach().abs().max())
            assert 0.8 * bound < largest <= bound, name
            assert torch.count_nonzero(m.bias) == 0, name
        elif isinstance(m, nn.BatchNorm1d):
            assert torch.all(m.weight == 1) and torch.all(m.bias == 0), name


def test_local_projection_gradcheck():
    """The hand-written backward of W (e - l2norm(u))^2 + b against finite differences."""
    from vlret.models.sgraf_ops import LocalProjection

    g = torch.Generator().manual_seed(4)
    args = [
        torch.randn(*shape, generator=g, dtype=torch.float64)
        for shape in [(3, 4, 5), (4, 5), (2, 5), (2,)]
    ]
    assert torch.autograd.gradcheck(LocalProjection.apply, [a.requires_grad_() for a in args])


@pytest.mark.parametrize("module", ["sgr", "saf"])
def test_gradcheck(module):
    torch.manual_seed(0)
    scorer = _randomise(SGRAFScorer(4, 3, module, 2, num_regions=3)).double().eval()
    g = torch.Generator().manual_seed(2)
    regions = torch.randn(2, 3, 4, generator=g, dtype=torch.float64, requires_grad=True)
    words = torch.randn(3, 3, 4, generator=g, dtype=torch.float64, requires_grad=True)
    lengths = torch.tensor([3, 1, 2])

    def f(r, w):
        return scorer(r, w, lengths)

    assert torch.autograd.gradcheck(f, (regions, words), fast_mode=True)
    scorer(regions, words, lengths).sum().backward()
    assert torch.all(words.grad[1, 1:] == 0) and torch.all(words.grad[2, 2:] == 0)


def test_half_inputs_and_autocast_score_in_float32():
    scorer = _scorer("saf").eval()
    regions, words, lengths = _tokens(dtype=torch.float32)
    got = scorer(regions.half(), words.half(), lengths)
    want = scorer(regions.half().float(), words.half().float(), lengths)
    assert got.dtype == torch.float32
    assert torch.allclose(got, want, rtol=0, atol=1e-6)
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
        under_autocast = scorer(regions, words, lengths)
    assert torch.equal(under_autocast, scorer(regions, words, lengths))
    r, w = regions.clone().requires_grad_(), words.clone().requires_grad_()
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
        scores = scorer.train()(r, w, lengths)
    assert scores.dtype == torch.float32
    scores.sum().backward()  # the hand-written backward sees float32 gradients
    assert r.grad.dtype == torch.float32 and torch.isfinite(w.grad).all()


@pytest.mark.parametrize(
    "change,name",
    [
        (lambda r, w, n: (r[0], w, n), "regions"),
        (lambda r, w, n: (r, w[..., :-1], n), "words"),
        (lambda r, w, n: (r, w[0], n), "words"),
        (lambda r, w, n: (r, w, n[:-1]), "word_lengths"),
        (lambda r, w, n: (r, w, n.float()), "word_lengths"),
        (lambda r, w, n: (r, w, torch.where(n == 1, 0, n)), "word_lengths"),
        (lambda r, w, n: (r, w, n + w.shape[1]), "word_lengths"),
        (lambda r, w, n: (r[:, :-1], w, n), "num_regions"),
        (lambda r, w, n: (r.index_fill(0, torch.tensor([1]), float("nan")), w, n), "regions"),
        (lambda r, w, n: (r, w.index_fill(0, torch.tensor([0]), float("nan")), n), "words"),
    ],
)
def test_bad_inputs_name_their_argument(change, name):
    scorer = _scorer().eval()
    regions, words, lengths = _tokens(dtype=torch.float32)
    with pytest.raises(ValueError, match=name):
        scorer(*change(regions, words, lengths))


def test_bad_settings_name_their_argument():
    for kwargs, name in [
        ({"module": "ave"}, "module"),
        ({"embed_dim": 0}, "embed_dim"),
        ({"sim_dim": -1}, "sim_dim"),
        ({"sgr_steps": 0}, "sgr_steps"),
        ({"num_regions": 0}, "num_regions"),
        ({"lambda_softmax": 0.0}, "lambda_softmax"),
        ({"lambda_softmax": float("nan")}, "lambda_softmax"),
        ({"dropout": 1.0}, "dropout"),
    ]:
        with pytest.raises(ValueError, match=name):
            SGRAFScorer(**{"embed_dim": D, "num_regions": R, **kwargs})
    scorer = _scorer().eval()
    regions, words, lengths = _tokens(dtype=torch.float32)
    with pytest.raises(ValueError, match="max_elements"):
        scorer(regions, words, lengths, max_elements=0)
    with pytest.raises(ValueError, match="regions"):
        scorer.train()(regions[:1], words, lengths)
    with pytest.raises(ValueError, match="module"):
        SGRAFScorer.reference_names("ave")


def test_empty_sets():
    scorer = _scorer().eval()
    regions, words, lengths = _tokens(dtype=torch.float32)
    assert scorer(regions[:0], words, lengths).shape == (0, words.shape[0])
    assert scorer(regions, words[:0], lengths[:0]).shape == (regions.shape[0], 0)


@pytest.mark.parametrize("module", ["sgr", "saf"])
def test_caption_order_changes_nothing_but_the_order(module):
    """Captions are scored longest first internally; the columns come back in call order."""
    scorer = _scorer(module).eval()
    regions, words, lengths = _tokens(n_cap=7, dtype=torch.float32)
    base = scorer(regions, words, lengths, max_elements=2 * 6 * D)
    order = torch.argsort(lengths, descending=True)  # sorted: no internal permutation
    got = scorer(regions, words[order], lengths[order], max_elements=2 * 6 * D)
    assert torch.allclose(got, base[:, order], rtol=0, atol=1e-6)


@pytest.mark.parametrize("momentum", [0.1, None])
def test_batch_norm_helpers_match_torch(momentum):
    from vlret.models.sgraf_ops import batch_norm, update_running

    g = torch.Generator().manual_seed(3)
    ours = nn.BatchNorm1d(5, momentum=momentum).double()
    with torch.no_grad():
        ours.running_mean.normal_(generator=g)
        ours.weight.normal_(generator=g)
    ref = nn.BatchNorm1d(5, momentum=momentum).double()
    ref.load_state_dict(ours.state_dict())
    for shape in [(4, 5, 7), (6, 5)]:
        x = torch.randn(*shape, generator=g, dtype=torch.float64)
        assert torch.allclose(batch_norm(x, ours), ref(x), atol=1e-14)
    xs = [torch.randn(6, 5, generator=g, dtype=torch.float64) for _ in range(4)]
    for x in xs:
        ref(x)
    update_running(ours, torch.stack([x.mean(0) for x in xs]), torch.stack([x.var(0) for x in xs]))
    for name, buf in ref.state_dict().items():
        assert torch.allclose(ours.state_dict()[name].double(), buf.double(), atol=1e-14), name
    ours.eval(), ref.eval()
    x = torch.randn(3, 5, generator=g, dtype=torch.float64)
    assert torch.allclose(batch_norm(x, ours), ref(x), atol=1e-14)


def test_backward_after_a_training_call_updates_the_running_statistics():
    """An evaluation-mode graph must not keep the BatchNorm buffers that a later
    training-mode call updates in place (a memory bank's loss backpropagates late)."""
    scorer = _scorer("saf").eval()
    regions, words, lengths = _tokens(dtype=torch.float32)
    regions.requires_grad_()
    early = scorer(regions, words, lengths)
    scorer.train()(regions.detach(), words, lengths)  # updates running_mean in place
    early.sum().backward()
    assert torch.isfinite(regions.grad).all() and regions.grad.abs().sum() > 0
