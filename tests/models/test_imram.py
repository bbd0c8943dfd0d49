"""IMRAM (vlret.models.matchers.imram): block scores and gradients against the release's loop.

The oracle is ``benchmarks/ref_imram.py``'s ``reference_scores``: HuiChen24/IMRAM's
per-caption ``xattn_score_Text_IMRAM`` / ``xattn_score_Image_IMRAM`` rewritten step for step
(each caption sliced to its real words, repeated over the images, the attended vectors formed,
the gated memory run through ``torch.cat`` and the two layers), in 128 x 128 shards. Both sides
run in float64, so the scores agree to float64 rounding (a few 1e-15 at these sizes) and the
block scorer's shortcuts (no attended vectors, split layers, the skipped last update) are
checked exactly, not within a loose tolerance.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from bench_modules import benchmark_fixture
from vlret.losses import build_loss
from vlret.models import build_model
from vlret.models.cross_attention import scan_scores
from vlret.models.matchers.imram import IMRAM, IMRAM_DEFAULTS, MEMORY_LAYERS
from vlret.models.matchers.imram_scores import imram_plan, imram_scores

VOCAB, R, IN_DIM, D = 17, 5, 6, 12
BASE = {"kind": "imram", "embed_dim": D, "image": {"in_dim": IN_DIM}, "text": {"word_dim": 7}}
MODES = ("text", "image", "full")
ATOL = 1e-12  # float64: sums of K (2K) cosines, each from a few dozen products


ref = benchmark_fixture("ref_imram")


@pytest.fixture(autouse=True)
def one_thread_float64():
    threads, dtype = torch.get_num_threads(), torch.get_default_dtype()
    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_num_threads(threads)
    torch.set_default_dtype(dtype)


def make(seed: int = 0, **options) -> IMRAM:
    torch.manual_seed(seed)
    model = build_model({**BASE, **options}, vocab_size=VOCAB)
    assert isinstance(model, IMRAM)
    return model


def tokens(n_img=6, n_cap=7, width=6, seed=1, garbage=False):
    """Encoded-like regions and words (unit rows), captions of mixed lengths padded to
    ``width`` with zeros (or random garbage, which must change nothing)."""
    g = torch.Generator().manual_seed(seed)
    regions = F.normalize(torch.randn(n_img, R, D, generator=g), dim=-1)
    words = F.normalize(torch.randn(n_cap, width, D, generator=g), dim=-1)
    lengths = torch.randint(1, width + 1, (n_cap,), generator=g)
    lengths[0], lengths[-1] = width, 1
    pad = torch.arange(width)[None, :, None] >= lengths[:, None, None]
    filler = 50 * torch.randn(words.shape, generator=g) if garbage else torch.zeros(())
    return regions, torch.where(pad, filler, words), lengths


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("renorm", [False, True])
@pytest.mark.parametrize("max_elements", [None, 1, 700, 5000])
def test_scores_match_the_reference_loop(ref, mode, renorm, max_elements):
    model = make(mode=mode, renorm_memory=renorm)
    regions, words, lengths = tokens()
    want = ref.reference_scores(model, regions, words, lengths)
    got = model.score(regions, words, lengths, max_elements=max_elements)
    assert got.dtype == torch.float64 and got.shape == (6, 7)
    torch.testing.assert_close(got, want, rtol=0, atol=ATOL)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("renorm", [False, True])
def test_inference_buffers_give_the_same_scores(ref, mode, renorm):
    """Without autograd the update runs in reused buffers (two memories alternating): the
    scores are the reference's, as with autograd, whatever the blocks."""
    model = make(mode=mode, renorm_memory=renorm, steps=4, seed=7)
    regions, words, lengths = tokens(n_img=9, n_cap=8, seed=7)
    want = ref.reference_scores(model, regions, words, lengths)
    for budget in (None, 1, 900):
        with torch.no_grad():
            got = model.score(regions, words, lengths, max_elements=budget)
        torch.testing.assert_close(got, want, rtol=0, atol=ATOL)


@pytest.mark.parametrize("mode", MODES)
def test_gradients_match_the_reference_loop(ref, mode):
    model = make(mode=mode, steps=3, seed=2)
    regions, words, lengths = tokens(n_img=4, n_cap=5, seed=3)
    weights = torch.randn(4, 5, generator=torch.Generator().manual_seed(4))
    grads = []
    for fn in (
        lambda r, w: model.score(r, w, lengths, max_elements=300),
        lambda r, w: ref.reference_scores(model, r, w, lengths),
    ):
        model.zero_grad()
        r, w = regions.clone().requires_grad_(), words.clone().requires_grad_()
        (fn(r, w) * weights).sum().backward()
        layer_grads = [getattr(model, n).weight.grad for n in MEMORY_LAYERS]
        grads.append([r.grad, w.grad, *(g if g is not None else 0 * r.sum() for g in layer_grads)])
    for got, want in zip(*grads, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=ATOL)
    # the layers of the unused direction get no gradient, as in the release
    if mode == "text":
        assert model.linear_i2t.weight.grad is None


def test_many_blocks_and_shards_match_the_reference(ref):
    """More than one 128 x 128 shard on the reference side, many blocks on ours."""
    model = make(mode="full", seed=5)
    regions, words, lengths = tokens(n_img=130, n_cap=9, seed=6)
    want = ref.reference_scores(model, regions, words, lengths)
    for budget in (None, 4000):
        torch.testing.assert_close(
            model.score(regions, words, lengths, max_elements=budget), want, rtol=0, atol=ATOL
        )


@pytest.mark.parametrize("mode", MODES)
def test_padding_garbage_changes_nothing(mode):
    model = make(mode=mode)
    regions, words, lengths = tokens()
    _, dirty, _ = tokens(garbage=True)
    torch.testing.assert_close(
        model.score(regions, dirty, lengths), model.score(regions, words, lengths),
        rtol=0, atol=1e-14,
    )  # fmt: skip
    wider = torch.cat([words, words.new_zeros(7, 3, D)], dim=1)
    torch.testing.assert_close(
        model.score(regions, wider, lengths), model.score(regions, words, lengths),
        rtol=0, atol=1e-14,
    )  # fmt: skip


def test_one_step_is_scan_with_mean_pooling():
    """K = 1: no memory update, so Text-IMRAM is SCAN t2i and Image-IMRAM SCAN i2t, each with
    mean pooling, and Full-IMRAM their sum (vlret's independent SCAN scorer is the oracle)."""
    regions, words, lengths = tokens(seed=8)
    scan = {
        d: scan_scores(regions, words, lengths, direction=d, lambda_softmax=4.0, aggregation="mean")
        for d in ("t2i", "i2t")
    }
    want = {"text": scan["t2i"], "image": scan["i2t"], "full": scan["t2i"] + scan["i2t"]}
    for mode in MODES:
        got = imram_scores(regions, words, lengths, mode=mode, steps=1, lambda_softmax=4.0)
        torch.testing.assert_close(got, want[mode], rtol=0, atol=1e-13)


def test_steps_add_scores_and_memory_matters():
    """Score of K steps minus that of K - 1 is the K-th step's mean cosine: in [-1, 1]; and the
    memory layers change the later steps only."""
    regions, words, lengths = tokens(seed=9)
    model = make(mode="text", seed=9)
    one = imram_scores(regions, words, lengths, mode="text", steps=1, lambda_softmax=9.0)
    two, three = (make(mode="text", steps=k, seed=9).score(regions, words, lengths) for k in (2, 3))
    assert ((two - one).abs() <= 1 + 1e-12).all() and ((three - two).abs() <= 1 + 1e-12).all()
    with torch.no_grad():
        model.linear_t2i.weight.mul_(3.0)
    changed = make(mode="text", seed=9)
    changed.load_state_dict(model.state_dict())
    assert not torch.allclose(changed.score(regions, words, lengths), three)


def test_plan_bounds_every_block():
    lengths = torch.tensor([3, 9, 1, 9, 4, 7, 2, 8])
    for mode in MODES:
        for budget in (1, 2000, 10**5):
            step, order, blocks = imram_plan(11, R, D, lengths, mode=mode, max_elements=budget)
            assert sorted(order.tolist()) == list(range(8))
            covered = [i for start, stop, _ in blocks for i in order[start:stop].tolist()]
            assert covered == order.tolist()
            for start, stop, longest in blocks:
                assert longest == int(lengths[order[start:stop]].max())
                q = {"text": longest, "image": R, "full": max(longest, R)}[mode]
                assert stop - start == 1 or step * (stop - start) * q * 2 * D <= budget


def batch(n=4, seed=1):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([5, 1, 3, 4, 2][:n])
    ids = torch.randint(1, VOCAB, (n, 5), generator=g)
    captions = torch.where(torch.arange(5)[None, :] < lengths[:, None], ids, 0)
    features = torch.randn(n, R, IN_DIM, generator=g)
    return SimpleNamespace(features=features, captions=captions, lengths=lengths)


def test_training_step_through_forward_and_a_loss():
    model = make(mode="full", seed=11).train()
    loss = build_loss("triplet", margin=0.2, hardest=True)
    optim = torch.optim.Adam(model.parameters(), lr=1e-3)
    b = batch()
    sim = model(b)
    assert sim.shape == (4, 4)
    enc = model.encode_texts(b.captions, b.lengths)
    torch.testing.assert_close(
        sim, model.score(model.encode_images(b.features), enc, b.lengths), rtol=0, atol=1e-14
    )
    value = loss.from_similarity(sim)
    value.backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None]
    assert not missing
    before = [p.detach().clone() for p in model.parameters()]
    optim.step()
    assert all(not torch.equal(a, p) for a, p in zip(before, model.parameters(), strict=True))


def test_config_round_trip_and_defaults():
    model = make(seed=3, mode="image", steps=2, lambda_softmax=11.0, renorm_memory=True)
    cfg = model.config
    assert set(cfg) == set(IMRAM_DEFAULTS) and cfg["text"]["vocab_size"] == VOCAB
    assert (model.mode, model.steps, model.lambda_softmax, model.renorm_memory) == (
        "image", 2, 11.0, True,
    )  # fmt: skip
    torch.manual_seed(3)
    again = build_model(cfg)
    assert again.config == cfg and isinstance(again, IMRAM)
    for k, v in again.state_dict().items():
        assert torch.equal(v, model.state_dict()[k]), k
    default = build_model({"kind": "imram", "image": {"in_dim": 4}}, vocab_size=VOCAB)
    assert (default.mode, default.steps, default.lambda_softmax) == ("full", 3, 9.0)
    assert default.renorm_memory is False and default.embed_dim == 1024
    assert default.linear_t2i.weight.shape == (1024, 2048)


@pytest.mark.parametrize(
    ("change", "pattern"),
    [
        ({"mode": "both"}, r"^mode: must be one of \['text', 'image', 'full'\]"),
        ({"steps": 0}, r"^steps: must be a positive int"),
        ({"steps": 2.0}, r"^steps: must be a positive int"),
        ({"lambda_softmax": 0}, r"^lambda_softmax: must be a number > 0"),
        ({"renorm_memory": 1}, r"^renorm_memory: must be true or false"),
        ({"score_scale": "max"}, r"^score_scale: must be one of \['sum', 'mean'\]"),
        ({"embed_dim": 0}, r"^embed_dim: must be a positive int"),
        ({"iteration_step": 3}, r"iteration_step"),
        ({"image": {"in_dim": 0}}, r"^image.in_dim: must be a positive int"),
        ({"image": {"pooling": "max"}}, r"^image.pooling: unknown key"),
        ({"text": {"word_dim": 0}}, r"^text.word_dim: must be a positive int"),
        ({"text": {"dropout": 1.5}}, r"^text.dropout: must be a dropout rate"),
        ({"text": 3}, r"^text: must be a dict"),
    ],
)
def test_bad_configs_name_the_key(change, pattern):
    with pytest.raises(ValueError, match=pattern):
        build_model({**BASE, **change}, vocab_size=VOCAB)


@pytest.mark.parametrize(("mode", "terms"), [("text", 3), ("image", 3), ("full", 6)])
def test_mean_scale_divides_by_the_summed_cosines_and_stays_within_one(mode, terms):
    regions, words, lengths = tokens()
    summed = make(mode=mode, steps=3).score(regions, words, lengths)
    mean_model = make(mode=mode, steps=3, score_scale="mean")
    mean = mean_model.score(regions, words, lengths)
    assert mean_model.config["score_scale"] == "mean"
    torch.testing.assert_close(mean * terms, summed, rtol=0, atol=1e-12)
    assert bool((mean.abs() <= 1 + 1e-12).all())
    # a ranking model: the order of the captions for every image is the same
    assert torch.equal(mean.argsort(dim=1), summed.argsort(dim=1))


def test_adacl_updates_its_margins_on_the_mean_scale_only():
    """AdaCL refuses a margin update when the anchor score is >= 1: on IMRAM's summed scale
    (three cosines of near-identical fragments) it never updates and its loss vanishes."""
    g = torch.Generator().manual_seed(4)
    regions = F.normalize(torch.randn(8, R, D, generator=g) * 0.05 + 1.0, dim=-1)
    words = F.normalize(torch.randn(8, 4, D, generator=g) * 0.05 + 1.0, dim=-1)
    lengths = torch.full((8,), 4)
    for scale, updated in (("sum", False), ("mean", True)):
        loss = build_loss("adacl", m1_init=20.0, m2_init=0.1, p_u=0.03, queue_size=0)
        sim = make(mode="text", steps=3, score_scale=scale).score(regions, words, lengths)
        value = float(loss.from_similarity(sim).detach())
        assert loss.last_stats["updated"] is updated, (scale, loss.last_stats)
        assert (value > 1e-6) is updated, (scale, value)


def test_bad_scorer_inputs_name_the_argument():
    regions, words, lengths = tokens()
    with pytest.raises(ValueError, match="^memory: needs the 't2i' layers"):
        imram_scores(regions, words, lengths, mode="text", steps=2)
    with pytest.raises(ValueError, match="word_lengths must lie in"):
        make().score(regions, words, lengths + 10)
    with pytest.raises(ValueError, match="max_elements"):
        make().score(regions, words, lengths, max_elements=0)


def test_release_checkpoint_layout_loads_after_the_rename():
    """A state dict written by hand with the release's DataParallel key names (model.py
    ``SCAN``: img_enc.fc_local, txt_enc.embed / rnn, the four memory layers) loads 1:1."""
    model = make(seed=12)
    gru = ("weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0")
    release_shapes = {
        "module.img_enc.fc_local.weight": (D, IN_DIM),
        "module.img_enc.fc_local.bias": (D,),
        "module.txt_enc.embed.weight": (VOCAB, 7),
        **{f"module.txt_enc.rnn.{n}{s}": (3 * D, 7 if "ih_l0" in n and "weight" in n else D)
           for n in gru for s in ("", "_reverse")},
        **{f"module.{layer}.weight": (D, 2 * D) for layer in MEMORY_LAYERS},
        **{f"module.{layer}.bias": (D,) for layer in MEMORY_LAYERS},
    }  # fmt: skip
    for key in list(release_shapes):
        if "bias" in key and "rnn" in key:
            release_shapes[key] = (3 * D,)
    g = torch.Generator().manual_seed(13)
    release = {k: torch.randn(shape, generator=g) for k, shape in release_shapes.items()}
    mapping = model.reference_names()
    assert set(mapping) == set(release) and sorted(mapping.values()) == sorted(model.state_dict())
    model.load_state_dict({mapping[k]: v for k, v in release.items()})
    assert torch.equal(model.image_encoder.fc.weight, release["module.img_enc.fc_local.weight"])
    assert torch.equal(model.gate_i2t.bias, release["module.gate_i2t.bias"])
    assert torch.equal(
        model.text_encoder.rnn.weight_hh_l0_reverse,
        release["module.txt_enc.rnn.weight_hh_l0_reverse"],
    )
