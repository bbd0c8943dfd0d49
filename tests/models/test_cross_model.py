"""SCAN, BFAN and SGRAF models (vlret.models.cross_model): encoders, score matrices, configs."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from vlret.models import BFAN, SCAN, SGRAF, CrossAttentionModel, RetrievalModel, build_model
from vlret.models.cross_attention import bfan_scores, scan_scores
from vlret.models.cross_model import RegionEncoder, WordEncoder

VOCAB, R, IN_DIM, D = 13, 4, 6, 8
BASE = {"embed_dim": D, "image": {"in_dim": IN_DIM}, "text": {"word_dim": 5}}
CONFIGS = {
    "scan": {"kind": "scan", **BASE},
    "scan_i2t": {"kind": "scan", "direction": "i2t", "aggregation": "mean", **BASE},
    "bfan": {"kind": "bfan", "focal": "prob", **BASE},
    "sgr": {"kind": "sgraf", "sim_dim": 4, "sgr_steps": 2, "num_regions": R, **BASE},
    "saf": {"kind": "sgraf", "module": "saf", "sim_dim": 4, "num_regions": R, **BASE},
}


@pytest.fixture(autouse=True)
def one_thread_float64():
    """One thread (the 2-core machine is shared) and float64 parameters, so that equalities
    hold to float64 rounding."""
    threads, dtype = torch.get_num_threads(), torch.get_default_dtype()
    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_num_threads(threads)
    torch.set_default_dtype(dtype)


def make(name: str, seed: int = 0) -> CrossAttentionModel:
    torch.manual_seed(seed)
    return build_model(CONFIGS[name], vocab_size=VOCAB)


def batch(n: int = 3, *, seed: int = 1, width: int | None = None, garbage: bool = False):
    """``n`` pairs; captions of lengths 1..5, padded with 0 (or random ids with ``garbage``)
    up to ``width`` (default the longest)."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([5, 1, 3, 4, 2][:n])
    width = width or int(lengths.max())
    features = torch.randn(n, R, IN_DIM, generator=gen)
    ids = torch.randint(1, VOCAB, (n, 9), generator=gen)[:, :width]
    pad = torch.arange(width)[None, :] >= lengths[:, None]
    filler = torch.randint(0, VOCAB, (n, width)) if garbage else torch.zeros(n, width).long()
    captions = torch.where(pad, filler, ids)
    return SimpleNamespace(features=features, captions=captions, lengths=lengths)


def test_kinds_classes_and_the_harness_flag():
    classes = {"scan": SCAN, "scan_i2t": SCAN, "bfan": BFAN, "sgr": SGRAF, "saf": SGRAF}
    for name, cls in classes.items():
        model = make(name)
        assert type(model) is cls and model.scores_pairs is True and model.embed_dim == D
    two_tower = build_model({"embed_dim": D, "image": {"in_dim": IN_DIM}}, vocab_size=VOCAB)
    assert isinstance(two_tower, RetrievalModel)
    assert not getattr(two_tower, "scores_pairs", False)


def test_reference_parameter_names_and_initialisation():
    model = make("scan")
    names = set(dict(model.named_parameters()))
    assert {"image_encoder.fc.weight", "image_encoder.fc.bias", "text_encoder.embed.weight"} <= (
        names
    )
    assert {"text_encoder.rnn.weight_ih_l0", "text_encoder.rnn.weight_hh_l0_reverse"} <= names
    assert len(names) == 3 + 8  # fc (2), embed (1), one bi-GRU layer (2 x 4): nothing else
    bound = math.sqrt(6.0) / math.sqrt(IN_DIM + D)  # Xavier-uniform as the references
    fc = model.image_encoder.fc.requires_grad_(False)
    assert float(fc.weight.abs().max()) <= bound and float(fc.weight.abs().max()) > bound / 2
    assert torch.equal(fc.bias, torch.zeros(D))
    embed = model.text_encoder.embed.weight.detach()
    assert float(embed.abs().max()) <= 0.1 and float(embed[0].abs().max()) > 0  # no pad row
    assert {n.split(".")[0] for n in dict(make("sgr").named_parameters())} == {
        "image_encoder",
        "text_encoder",
        "scorer",
    }


@pytest.mark.parametrize("name", list(CONFIGS))
def test_encoders_shapes_norms_and_zero_padding(name):
    model = make(name).eval()
    b = batch(3, width=7)
    regions = model.encode_images(b.features)
    words = model.encode_texts(b.captions, b.lengths)
    assert regions.shape == (3, R, D) and words.shape == (3, 5, D)  # L = longest caption
    torch.testing.assert_close(regions.norm(dim=-1), torch.ones(3, R))
    real = torch.arange(5)[None, :] < b.lengths[:, None]
    torch.testing.assert_close(words.norm(dim=-1)[real], torch.ones(int(real.sum())))
    assert bool((words[~real] == 0).all())
    assert model(b).shape == (3, 3)


@pytest.mark.parametrize("bidirectional", [True, False])
def test_word_encoder_equals_a_gru_run_on_each_caption_alone(bidirectional):
    """Packing and batching change nothing: each caption's words equal the GRU run on its own
    unpadded ids, a bi-GRU's two directions averaged, each word divided by (norm + 1e-8)."""
    torch.manual_seed(0)
    enc = WordEncoder(VOCAB, word_dim=5, embed_dim=D, bidirectional=bidirectional).eval()
    b = batch(5, width=9, garbage=True)
    words = enc(b.captions, b.lengths)
    for i, n in enumerate(b.lengths.tolist()):
        out, _ = enc.rnn(enc.embed(b.captions[i, :n]).unsqueeze(0))
        out = out[0]
        if bidirectional:
            out = (out[:, :D] + out[:, D:]) / 2
        want = out / (out.norm(dim=-1, keepdim=True) + 1e-8)
        torch.testing.assert_close(words[i, :n], want, rtol=0, atol=1e-14)
        assert bool((words[i, n:] == 0).all())


@pytest.mark.parametrize("name", list(CONFIGS))
def test_scores_ignore_padding_ids_and_width(name):
    model = make(name).eval()
    clean = model(batch(4))
    torch.testing.assert_close(model(batch(4, width=8, garbage=True)), clean, rtol=0, atol=1e-13)


@pytest.mark.parametrize("name", ["scan", "scan_i2t", "bfan", "sgr"])
def test_forward_is_the_scorer_on_the_encoded_batch(name):
    model = make(name).eval()
    b = batch(3)
    regions = model.encode_images(b.features)
    words = model.encode_texts(b.captions, b.lengths)
    cfg = model.config
    if cfg["kind"] == "scan":
        keys = ("direction", "lambda_softmax", "aggregation", "lambda_lse")
        want = scan_scores(regions, words, b.lengths, **{k: cfg[k] for k in keys})
    elif cfg["kind"] == "bfan":
        want = bfan_scores(regions, words, b.lengths, focal="prob", lambda_softmax=20.0)
    else:
        want = model.scorer(regions, words, b.lengths)
    torch.testing.assert_close(model(b), want, rtol=0, atol=0)
    small = model.score(regions, words, b.lengths, max_elements=1)  # one pair per block
    torch.testing.assert_close(small, want, rtol=0, atol=1e-13)


def test_gather_texts_replaces_the_captions_scored():
    """``gather_texts`` (the trainer's, under torchrun) gives the captions every image is
    scored against: here the batch's own captions twice."""
    model = make("scan").eval()
    b = batch(3)
    seen = {}

    def twice(words, lengths):
        seen["shapes"] = (tuple(words.shape), tuple(lengths.shape))
        return torch.cat([words, words]), torch.cat([lengths, lengths])

    sim = model(b, gather_texts=twice)
    assert seen["shapes"] == ((3, 5, D), (3,)) and sim.shape == (3, 6)
    # Other blocks, other summation orders: equal to a few float64 roundings of scores <= 1.
    torch.testing.assert_close(sim, torch.cat([model(b)] * 2, dim=1), rtol=0, atol=1e-14)


def test_gradients_reach_every_parameter():
    for name in CONFIGS:
        model = make(name).train()
        model(batch(3)).sum().backward()
        missing = [n for n, p in model.named_parameters() if p.grad is None]
        assert not missing, (name, missing)


def test_sgraf_text_dropout_follows_the_reference():
    assert make("sgr").text_encoder.dropout.p == 0.4  # SGRAF's EncoderText drops 40%
    assert make("scan").text_encoder.dropout.p == 0.0  # SCAN's and BFAN's have none
    model = make("sgr").eval()
    torch.testing.assert_close(model(batch(3)), model(batch(3)), rtol=0, atol=0)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_config_round_trip(name):
    model = make(name, seed=3)
    cfg = model.config
    assert cfg["text"]["vocab_size"] == VOCAB and cfg["image"] == {"in_dim": IN_DIM}
    again = build_model(cfg)  # vocab_size from the config
    assert again.config == cfg and type(again) is type(model)
    torch.manual_seed(3)
    rebuilt = build_model(cfg)
    want = model.state_dict()
    assert list(rebuilt.state_dict()) == list(want)
    for k, v in rebuilt.state_dict().items():
        assert torch.equal(v, want[k]), k
    assert build_model(cfg, vocab_size=VOCAB).config == cfg


@pytest.mark.parametrize(
    ("config", "kwargs", "pattern"),
    [
        ({"kind": "scan", "direction": "both"}, {}, r"^direction: must be one of"),
        ({"kind": "scan", "aggregation": "avg"}, {}, r"^aggregation: .*'lse'"),
        ({"kind": "scan", "lambda_lse": 0}, {}, r"^lambda_lse: must be a number > 0"),
        ({"kind": "scan", "lambda_softmax": float("inf")}, {}, r"^lambda_softmax: must be finite"),
        ({"kind": "bfan", "focal": "max"}, {}, r"^focal: must be one of \['equal', 'prob'\]"),
        ({"kind": "bfan", "direction": "t2i"}, {}, r"unknown key 'direction' for kind 'bfan'"),
        ({"kind": "sgraf", "module": "ave"}, {}, r"^module: must be one of \['sgr', 'saf'\]"),
        ({"kind": "sgraf", "sim_dim": 0}, {}, r"^sim_dim: must be a positive int"),
        ({"kind": "sgraf", "sgr_steps": 1.5}, {}, r"^sgr_steps: must be a positive int"),
        ({"kind": "sgraf", "dropout": 1.0}, {}, r"^dropout: must be a dropout rate"),
        ({"kind": "scan", "embed_dim": -1}, {}, r"^embed_dim: must be a positive int"),
        ({"kind": "scan", "image": {"pooling": "max"}}, {}, r"^image.pooling: unknown key"),
        ({"kind": "scan", "image": {"in_dim": "2048"}}, {}, r"^image.in_dim: must be a posit"),
        ({"kind": "scan", "image": 5}, {}, r"^image: must be a dict"),
        ({"kind": "scan", "text": {"kind": "gru"}}, {}, r"^text.kind: unknown key"),
        ({"kind": "scan", "text": {"word_dim": 0}}, {}, r"^text.word_dim: must be a positive"),
        ({"kind": "scan", "text": {"bidirectional": 1}}, {}, r"^text.bidirectional: must be tr"),
        ({"kind": "sgraf", "text": {"dropout": -0.1}}, {}, r"^text.dropout: must be a dropout"),
        ({"kind": "scan"}, {"vocab_size": None}, r"^text.vocab_size: .*vocab_size=len"),
        ({"kind": "scan", "text": {"vocab_size": 5}}, {"vocab_size": 6}, r"^text.vocab_size: "),
    ],
)
def test_bad_configs_name_the_key(config, kwargs, pattern):
    kwargs = {"vocab_size": VOCAB, **kwargs}
    with pytest.raises(ValueError, match=pattern):
        build_model({"embed_dim": D, **config}, **kwargs)


def test_bad_inputs_raise():
    model = make("scan")
    with pytest.raises(ValueError, match="region features"):
        model.encode_images(torch.randn(3, IN_DIM))
    with pytest.raises(ValueError, match="in_dim=6"):
        model.encode_images(torch.randn(3, R, IN_DIM + 1))
    with pytest.raises(ValueError, match="lengths: .*variable region counts"):
        model.encode_images(torch.randn(2, R, IN_DIM), torch.tensor([R, 2]))
    with pytest.raises(ValueError, match=r"expected 0\.\.12"):
        model.encode_texts(torch.tensor([[VOCAB]]), torch.tensor([1]))
    with pytest.raises(ValueError, match="lengths must lie in"):
        model.encode_texts(torch.ones(2, 3).long(), torch.tensor([3, 0]))
    with pytest.raises(ValueError, match="batch has no 'captions'"):
        model(SimpleNamespace(features=torch.randn(2, R, IN_DIM)))
    with pytest.raises(ValueError, match="embed_dim"):
        SCAN(RegionEncoder(IN_DIM, D), WordEncoder(VOCAB, embed_dim=D + 1))


def test_half_precision_scores_are_float32_at_least():
    model = make("scan").float().eval()
    regions = model.encode_images(batch(2).features.float())
    words = model.encode_texts(batch(2).captions, batch(2).lengths)
    sim = model.score(regions.half(), words.half(), batch(2).lengths)
    assert sim.dtype == torch.float32
    ref = model.score(regions, words, batch(2).lengths)
    # Half inputs round each unit-vector entry by 2**-11 relative; the scores (cosines) move by
    # a few such units, magnified at most lambda_softmax-fold by the attention weights.
    torch.testing.assert_close(sim, ref, rtol=0, atol=9.0 * 8 * 2**-11)
