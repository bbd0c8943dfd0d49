"""DIME (vlret.models.matchers.dime) against the release's per-caption loop in float64.

The oracle is ``benchmarks/ref_dime.py`` (LgQu/DIME's ``calItr`` shards through the cells'
own loops, rewritten step by step); the text side is a tiny random ``BertModel`` written by
``transformers``' ``save_pretrained``.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from bench_modules import benchmark_fixture, one_thread_fixture
from bert_helpers import BERT_WORDS, write_tiny_bert
from vlret.losses import build_loss
from vlret.models import build_model
from vlret.models.matchers.dime import DIME, DIME_DEFAULTS

WORDS = BERT_WORDS
IN_DIM, R, D, MAX_WORDS = 10, 5, 16, 8


_one_thread = one_thread_fixture()


ref = benchmark_fixture("ref_dime")


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory):
    pytest.importorskip("transformers")
    return write_tiny_bert(tmp_path_factory.mktemp("dime_bert"))


def make(bert_dir, direction="i2t", seed=0, **extra) -> DIME:
    torch.manual_seed(seed)
    cfg = {
        "kind": "dime",
        "embed_dim": D,
        "direction": direction,
        "lambda_softmax": 4.0 if direction == "i2t" else 9.0,
        "max_words": MAX_WORDS,
        "router_hidden": 8,
        "imrc_hidden": 20,
        "imrc_heads": 4,
        "image": {"in_dim": IN_DIM},
        "text": {"path": str(bert_dir)},
        **extra,
    }
    model = build_model(cfg)
    assert isinstance(model, DIME)
    with torch.no_grad():  # running statistics other than the identity
        for bn in (model.interaction.bn, model.image_encoder.bn):
            bn.running_mean.normal_(0, 0.3)
            bn.running_var.uniform_(0.5, 2.0)
    return model


def captions(lengths, seed=1):
    gen = torch.Generator().manual_seed(seed)
    width = max(lengths) + 2
    caps = torch.randint(5, len(WORDS), (len(lengths), width), generator=gen)
    caps[:, 0] = 2
    for i, n in enumerate(lengths):
        caps[i, n - 1] = 3
        caps[i, n:] = torch.randint(0, len(WORDS), (width - n,), generator=gen)  # junk padding
    return caps, torch.tensor(lengths)


LENGTHS = [3, 11, 5, 8, 2, 6, 4]  # 11 > MAX_WORDS: cut to [CLS] + 6 pieces + [SEP]


def encoded(model, n_img=5, lengths=LENGTHS):
    gen = torch.Generator().manual_seed(7)
    feats = torch.randn(n_img, R, IN_DIM, generator=gen, dtype=torch.float64)
    caps, lens = captions(lengths)
    return model.encode_images(feats), model.encode_texts(caps, lens), model.token_lengths(lens)


@pytest.mark.parametrize("direction", ["i2t", "t2i"])
@pytest.mark.parametrize("max_elements", [1, 3000, None])
def test_eval_scores_and_gradients_match_the_release_loop(bert_dir, ref, direction, max_elements):
    model = make(bert_dir, direction).double().eval()
    regions, words, rows = encoded(model)
    regions = regions.detach().requires_grad_(True)
    words = words.detach().requires_grad_(True)
    weights = torch.randn(regions.shape[0], words.shape[0], dtype=torch.float64)
    params = [p for p in model.interaction.parameters()]

    def grads(fn):
        scores = fn()
        return scores, torch.autograd.grad((scores * weights).sum(), [regions, words, *params])

    got, g_got = grads(lambda: model.score(regions, words, rows, max_elements=max_elements))
    want, g_want = grads(lambda: ref.reference_scores(model, regions, words, rows, shard=3))
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    for a, b in zip(g_got, g_want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)
    if direction == "i2t":  # rows past a caption's tokens are never read
        cut = words.detach().clone()
        for j, n in enumerate(rows.tolist()):
            cut[j, n:] = 123.0
        torch.testing.assert_close(model.score(regions, cut, rows), got, rtol=0, atol=1e-14)


@pytest.mark.parametrize("direction", ["i2t", "t2i"])
def test_train_mode_batch_statistics_match_the_release(bert_dir, ref, direction):
    model = make(bert_dir, direction).double()
    regions, words, rows = encoded(model.eval())
    model.train()
    bn = model.interaction.bn
    before = bn.running_mean.clone()
    got = model.score(regions, words, rows, max_elements=2000)
    after = bn.running_mean.clone()
    want = ref.reference_scores(model, regions, words, rows)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    assert not torch.equal(before, after)  # one BatchNorm update per call
    # a training score depends on the batch it is computed with (the release's BatchNorm)
    part = model.score(regions[:2], words[:3], rows[:3])
    assert (part - got[:2, :3]).abs().max() > 1e-6


def test_silent_routers_leave_the_rectified_locals(bert_dir):
    """All router outputs 0: layers 0 and 1 fall back to RIC on every path, layer 2 (every
    gate open) averages its inputs, so Z = ReLU(regions) and the score is the pooled
    BatchNorm of it against the sentence vector (an independent value)."""
    model = make(bert_dir, "i2t").double().eval()
    with torch.no_grad():
        for layer in model.interaction.layers:
            for cell in ("ric", "glgc", "imrc", "cmrc"):
                mlp = getattr(layer, cell).router.mlp
                mlp[2].weight.zero_()
                mlp[2].bias.fill_(-3.0)
    regions, words, rows = encoded(model)
    bn = model.interaction.bn
    z = F.relu(regions[:, 1:])
    z = (z - bn.running_mean) / torch.sqrt(bn.running_var + bn.eps) * bn.weight + bn.bias
    pooled = F.normalize(z.mean(1) + z.amax(1), dim=-1)
    want = pooled @ words[:, 0].t()
    torch.testing.assert_close(model.score(regions, words, rows), want, rtol=0, atol=1e-12)


def test_router_starts_at_tanh_of_its_bias(bert_dir):
    model = make(bert_dir, "t2i")
    router = model.interaction.dynamic_itr_l1.cmrc.router
    assert torch.equal(router.mlp[2].bias, torch.full((4,), 1.5))
    with torch.no_grad():
        router.mlp[2].weight.zero_()
    p = router(torch.randn(3, 2, 7, D))
    assert p.shape == (3, 2, 4)
    torch.testing.assert_close(p, torch.full_like(p, torch.tanh(torch.tensor(1.5)).item()))


def test_glgc_normalises_across_the_locals(bert_dir):
    """n = fc_1(x) * g normalised over the local axis: a positive per-feature scale of the
    guide changes nothing, a sign flip does."""
    model = make(bert_dir, "i2t").double()
    itr, layer = model.interaction, model.interaction.dynamic_itr_l1
    x = torch.randn(2, 3, R, D, dtype=torch.float64)
    g = torch.randn(1, 3, 1, D, dtype=torch.float64)
    base = itr._glgc(layer, x, g)
    scale = torch.rand(1, 1, 1, D, dtype=torch.float64) * 5 + 0.1
    torch.testing.assert_close(itr._glgc(layer, x, g * scale), base, rtol=1e-12, atol=1e-12)
    assert (itr._glgc(layer, x, -g) - base).abs().max() > 1e-3


def test_text_side_cuts_pads_and_ignores_padding_ids(bert_dir):
    model = make(bert_dir, "t2i").eval()
    caps, lens = captions([11, 4])
    ids, n = model.text_encoder.token_ids(caps, lens)
    assert n.tolist() == [MAX_WORDS, 4]
    assert ids[0].tolist() == [*caps[0, : MAX_WORDS - 1].tolist(), 3]  # [SEP] kept
    assert ids[1, 4:].eq(0).all()
    other = caps.clone()
    other[1, 4:] = 7
    torch.testing.assert_close(model.encode_texts(other, lens), model.encode_texts(caps, lens))
    assert model.token_lengths(lens).tolist() == [1 + MAX_WORDS] * 2
    assert make(bert_dir, "i2t").token_lengths(lens).tolist() == [1 + MAX_WORDS, 5]
    assert all(not p.requires_grad for p in model.text_encoder.bert.parameters())


def test_t2i_refuses_trimmed_captions(bert_dir):
    model = make(bert_dir, "t2i").eval()
    regions, words, rows = encoded(model)
    with pytest.raises(ValueError, match="word_lengths"):
        model.score(regions, words[:, :5], rows.clamp(max=5))


def test_training_step_through_forward_and_a_loss(bert_dir):
    model = make(bert_dir, "i2t", seed=4).train()
    caps, lens = captions([4, 7, 3, 9])
    b = SimpleNamespace(features=torch.randn(4, R, IN_DIM), captions=caps, lengths=lens)
    sim = model(b)
    assert sim.shape == (4, 4)
    value = build_loss("triplet", margin=0.2, hardest=True).from_similarity(sim)
    value.backward()
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    missing = [n for n, p in trainable if p.grad is None]
    assert not missing
    assert not any(n.startswith("text_encoder.bert.") for n, _ in trainable)
    optim = torch.optim.Adam([p for _, p in trainable], lr=1e-3)
    before = [p.detach().clone() for _, p in trainable]
    optim.step()
    assert all(not torch.equal(a, p) for a, (_, p) in zip(before, trainable, strict=True))


def test_config_round_trip(bert_dir):
    model = make(bert_dir, "t2i", seed=2).eval()
    again = build_model(model.config)
    again.load_state_dict(model.state_dict())
    again.eval()
    regions, words, rows = encoded(model.double())
    regions2, words2, rows2 = encoded(again.double())
    torch.testing.assert_close(
        again.score(regions2, words2, rows2), model.score(regions, words, rows)
    )
    assert set(model.config) == set(DIME_DEFAULTS)


@pytest.mark.parametrize(
    ("change", "key"),
    [
        ({"colour": 1}, "colour"),
        ({"image": {"in_dim": 10, "size": 3}}, "image.size"),
        ({"text": {"path": "x", "pooling": "cls"}}, "text.pooling"),
        ({"text": {"kind": "gru", "path": "x"}}, "text.kind"),
        ({"text": {}}, "text.path"),
        ({"direction": "both"}, "direction"),
        ({"imrc_heads": 5}, "imrc_heads"),
        ({"max_words": 1}, "max_words"),
        ({"lambda_softmax": 0}, "lambda_softmax"),
        ({"embed_dim": 0}, "embed_dim"),
    ],
)
def test_config_errors_name_the_key(bert_dir, change, key):
    cfg = {"kind": "dime", "embed_dim": D, "imrc_heads": 4, "text": {"path": str(bert_dir)}}
    cfg.update(change)
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        build_model(cfg)


@pytest.mark.parametrize("direction", ["i2t", "t2i"])
def test_path_probabilities_match_the_release(bert_dir, ref, direction):
    model = make(bert_dir, direction, path_hidden=6).double()
    regions, words, rows = encoded(model.eval())
    model.train()
    want = ref.reference_paths(model, regions, words, rows)
    assert want.shape == (regions.shape[0], words.shape[0], 36)
    for max_elements in (1, 5000):
        paths: list[torch.Tensor] = []
        model.score(regions, words, rows, max_elements=max_elements, paths_out=paths)
        torch.testing.assert_close(paths[0], want, rtol=0, atol=1e-13)


@pytest.mark.parametrize("direction", ["i2t", "t2i"])
def test_path_loss_against_a_naive_loop(bert_dir, direction):
    from vlret.train.procedures.dime import path_loss

    model = make(bert_dir, direction, path_hidden=6).double().train()
    caps, lens = captions([4, 7, 3, 9, 5])
    feats = torch.randn(5, R, IN_DIM, dtype=torch.float64)
    texts, labels = model.text_encoder.encode(caps, lens)
    assert not labels.requires_grad and torch.allclose(
        labels.norm(dim=-1), torch.ones(5, dtype=torch.float64)
    )
    paths: list[torch.Tensor] = []
    model.score(model.encode_images(feats), texts, model.token_lengths(lens), paths_out=paths)
    value = path_loss(model.interaction.path_similarity(paths[0]), labels)
    lin = model.interaction.path_mapping
    per = paths[0].mean(dim=1 if direction == "i2t" else 0)
    mapped = [F.normalize(lin.weight @ per[i] + lin.bias, dim=0) for i in range(5)]
    naive = (
        sum(
            (mapped[i] @ mapped[j] - labels[i] @ labels[j]) ** 2 for i in range(5) for j in range(5)
        )
        / 5
    )
    torch.testing.assert_close(value, naive, rtol=1e-12, atol=1e-14)
    value.backward()
    assert lin.weight.grad is not None and lin.weight.grad.abs().sum() > 0
    router = model.interaction.dynamic_itr_l1.glgc.router.mlp[0].weight
    assert router.grad is not None and router.grad.abs().sum() > 0


@pytest.mark.parametrize("direction", ["i2t", "t2i"])
def test_backward_survives_an_in_place_restore_of_the_buffers(bert_dir, direction):
    """pair_bank restores the BatchNorm buffers in place after scoring the bank; the batch's
    own scores, computed before, must still backpropagate."""
    model = make(bert_dir, direction).train()
    feats = torch.randn(3, R, IN_DIM, requires_grad=True)
    caps, lens = captions([4, 6, 3])
    scores = model.score(
        model.encode_images(feats), model.encode_texts(caps, lens), model.token_lengths(lens)
    )
    with torch.no_grad():
        for buf in model.buffers():
            if buf.is_floating_point():
                buf.add_(1.0)
    scores.sum().backward()
    assert feats.grad is not None and feats.grad.abs().sum() > 0
