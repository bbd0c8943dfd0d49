"""MMT (vlret.models.video_experts.mmt) with a tiny randomly initialised local BERT: absent
experts never contribute, a video without experts gives no NaN, videos never see each other,
gradients reach every parameter, config errors and the pair-scoring evaluation."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from test_models_video_experts import (
    NAMES,
    assert_pair_scoring_matches_score,
    captions,
    make_batch,
    naive_scores,
)

from vlret.models import build_model
from vlret.models.video_experts import MultiModalTransformer
from vlret.run.builders import model_tokenizer_path
from vlret.worlds.bert import write_random_bert

EXPERTS = {"appearance": 6, "audio": 4, "ocr": 5, "face": 3}
CAPTION = "a man runs . a red dog"  # the tiny BERT's whole lexicon: 5 special tokens + 6 words
VOCAB = 11


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory):
    pytest.importorskip("transformers")
    path = tmp_path_factory.mktemp("tiny_bert_mmt") / "bert"
    out = write_random_bert(
        path, [CAPTION], hidden=16, layers=1, heads=2, intermediate=24, max_positions=32, seed=3
    )
    assert len((out / "vocab.txt").read_text(encoding="utf-8").split()) == VOCAB
    return out


def mmt(bert_dir, **kw) -> MultiModalTransformer:
    torch.manual_seed(1)
    cfg = {
        "kind": "mmt",
        "experts": EXPERTS,
        "embed_dim": 8,
        "num_layers": 2,
        "num_heads": 2,
        "ff_dim": 12,
        "max_frames": 4,
        "text": {"path": str(bert_dir)},
        **kw,
    }
    return build_model(cfg)


def ids(n=5, seed=2):
    caps, lens = captions(n, seed)
    return caps % VOCAB, lens


def test_mmt_absent_experts_never_contribute(bert_dir):
    model = mmt(bert_dir).eval()
    caps, lens = ids()
    with torch.no_grad():
        texts = model.encode_texts(caps, lens)
        base = model.encode_images(make_batch(fill=0.0))
        scores = model.score(base, texts)
        assert bool(torch.isfinite(base).all()) and bool(torch.isfinite(scores).all())
        for fill in (float("nan"), float("inf"), -float("inf"), 1e30):
            got = model.encode_images(make_batch(fill=fill))
            assert torch.equal(got, base), fill
            assert torch.equal(model.score(got, texts), scores), fill
    present = base[..., -1] > 0
    assert not bool(present[1].any())  # video 1 has no model expert: no NaN, scores 0
    assert torch.equal(scores[1], torch.zeros_like(scores[1]))
    norms = base[..., :-1][present].norm(dim=-1)
    assert torch.allclose(norms, torch.ones_like(norms), atol=1e-5)


def test_mmt_videos_are_encoded_independently(bert_dir):
    """The transformer attends within a video only: a batch's encodings equal those of each
    video alone (no cross-video statistics)."""
    model = mmt(bert_dir).double().eval()
    batch = make_batch()
    with torch.no_grad():
        whole = model.encode_images(batch)
        for i in range(len(batch)):
            alone = model.encode_images(batch[i : i + 1])
            assert torch.allclose(alone[0], whole[i], atol=1e-12), i


def test_mmt_present_expert_ignores_an_absent_experts_frame_count(bert_dir):
    """Marking an expert absent masks its aggregation token and frames out of the attention:
    the other experts' outputs equal those of the same video whose absent expert claims no
    frames (and the present ones do change when it is present)."""
    model = mmt(bert_dir).double().eval()
    a = make_batch()
    a.present[0, NAMES.index("audio")] = False
    b = make_batch()
    b.present[0, NAMES.index("audio")] = False
    b.frames[0, NAMES.index("audio")] = 0
    c = make_batch()
    with torch.no_grad():
        ea, eb, ec = (model.encode_images(x) for x in (a, b, c))
    assert torch.allclose(ea, eb, atol=1e-12)
    assert not torch.allclose(ea[0, 0], ec[0, 0])


def test_mmt_score_matches_float64_pair_loop(bert_dir):
    model = mmt(bert_dir).double().eval()
    with torch.no_grad():
        videos = model.encode_images(make_batch())
        texts = model.encode_texts(*ids())
    assert texts.shape == (5, 4, 9)
    assert torch.allclose(model.score(videos, texts), naive_scores(videos, texts), atol=1e-12)


def test_mmt_forward_shapes_and_gradients_reach_every_parameter(bert_dir):
    model = mmt(bert_dir).train()
    caps, lens = ids(6)
    batch = SimpleNamespace(features=make_batch(fill=float("nan")), captions=caps, lengths=lens)
    scores = model(batch)
    assert scores.shape == (6, 6) and bool(torch.isfinite(scores).all())
    (scores.diagonal().sum() - scores.sum() / 6).backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and bool(torch.isfinite(p.grad).all()), name
        assert float(p.grad.abs().sum()) > 0, name


def test_mmt_runs_in_the_pair_scoring_evaluation(bert_dir):
    assert_pair_scoring_matches_score(mmt(bert_dir).eval(), *ids(7))


def test_mmt_config_round_trip_and_tokenizer(bert_dir):
    model = mmt(bert_dir)
    assert model.tokenizer_path == str(bert_dir)
    assert model_tokenizer_path(model.config) == str(bert_dir)
    assert model.config["text"] == {"kind": "bert", "path": str(bert_dir), "dropout": 0.1}
    again = build_model(model.config)
    assert again.config == model.config
    default = build_model({"kind": "mmt", "experts": {"a": 3}, "text": {"path": str(bert_dir)}})
    enc = default.image_encoder
    assert (default.embed_dim, len(enc.encoder.layers), enc.max_frames) == (512, 4, 30)
    assert enc.encoder.layers[0].self_attn.num_heads == 4


def test_mmt_too_many_frames_raises(bert_dir):
    model = mmt(bert_dir, max_frames=3)
    with pytest.raises(ValueError, match=r"max_frames: expert 'audio' has 4 frames"):
        model.encode_images(make_batch())


@pytest.mark.parametrize(
    ("change", "error", "match"),
    [
        ({"text": {}}, ValueError, r"^text\.path: required"),
        ({"text": {"kind": "gru", "path": "x"}}, ValueError, r"^text\.kind: MMT's text"),
        ({"text": {"path": "/nonexistent/bert"}}, FileNotFoundError, "nonexistent"),
        ({"num_heads": 3}, ValueError, "^num_heads: 3 does not divide"),
        ({"dropout": 1.5}, ValueError, "^dropout: must be a dropout rate"),
        ({"max_frames": 0}, ValueError, "^max_frames: must be a positive"),
        ({"vlad_clusters": {}}, ValueError, "^vlad_clusters: unknown key"),
    ],
)
def test_mmt_config_errors_name_the_key(bert_dir, change, error, match):
    cfg = {"kind": "mmt", "experts": EXPERTS, "embed_dim": 8, "text": {"path": str(bert_dir)}}
    with pytest.raises(error, match=match):
        build_model({**cfg, **change})
