"""CHAN (kind ``chan``): the block scorer against the release's shard loop
(``benchmarks/ref_chan.py``) in float64, scores and gradients; the region encoder's dropout
against an encoder that only sees the kept regions; the config schema; a training step; the
BERT side against a folder written by ``transformers``' ``save_pretrained``; the release's
parameter names on a hand-built checkpoint list.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from bench_modules import benchmark_fixture, one_thread_fixture
from vlret.data import RetrievalBatch
from vlret.losses.triplet import TripletLoss
from vlret.models import build_model
from vlret.models.matchers.chan import CHAN, UNUSED_REFERENCE_PREFIXES
from vlret.models.matchers.chan_score import chan_scores

D, R, IN, VOCAB = 12, 5, 10, 30


_one_thread = one_thread_fixture()


ref = benchmark_fixture("ref_chan")


def _model(**top) -> CHAN:
    config = {"kind": "chan", "embed_dim": D, "image": {"in_dim": IN}, "text": {"word_dim": 7}}
    config.update(top)
    model = build_model(config, vocab_size=VOCAB)
    assert isinstance(model, CHAN)
    return model


def _tokens(n_img=7, n_cap=11, width=6, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    regions = nn.functional.normalize(torch.randn(n_img, R, D, generator=g, dtype=dtype), dim=-1)
    words = nn.functional.normalize(torch.randn(n_cap, width, D, generator=g, dtype=dtype), dim=-1)
    lengths = torch.randint(1, width + 1, (n_cap,), generator=g)
    lengths[1], lengths[2] = width, 1
    return regions, words, lengths


def _naive(regions, words, lengths, beta=0.1):
    """Per pair, per word: the best region's cosine, then log sum exp(./beta) (no blocks)."""
    out = torch.empty(regions.shape[0], words.shape[0], dtype=regions.dtype)
    for i in range(regions.shape[0]):
        for c in range(words.shape[0]):
            best = [
                max(float(regions[i, r] @ words[c, w]) for r in range(R)) for w in range(lengths[c])
            ]
            out[i, c] = torch.logsumexp(torch.tensor(best, dtype=regions.dtype) / beta, 0)
    return out


@pytest.mark.parametrize("max_elements", [None, 1, R * 6 * 2, R * 6 * 3 * 4])
@pytest.mark.parametrize("lse_scale", ["release", "cosine"])
def test_scores_and_gradients_match_the_release_loop(ref, max_elements, lse_scale):
    model = _model(lse_scale=lse_scale).double()
    regions, words, lengths = _tokens()
    regions.requires_grad_(True)
    words.requires_grad_(True)
    ours = model.score(regions, words, lengths, max_elements=max_elements)
    want = ref.reference_scores(model, regions, words, lengths)
    torch.testing.assert_close(ours, want, rtol=0, atol=1e-12)
    weights = torch.randn(ours.shape, generator=torch.Generator().manual_seed(1), dtype=ours.dtype)
    g_ours = torch.autograd.grad((ours * weights).sum(), (regions, words))
    g_ref = torch.autograd.grad((want * weights).sum(), (regions, words))
    for a, b in zip(g_ours, g_ref, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    real = torch.arange(words.shape[1]) < lengths[:, None]
    assert bool((g_ours[1][~real] == 0).all())  # padding never receives a gradient


def test_scores_equal_a_naive_loop_and_ignore_padding():
    regions, words, lengths = _tokens(n_img=3, n_cap=5)
    want = _naive(regions, words, lengths)
    torch.testing.assert_close(chan_scores(regions, words, lengths), want, rtol=0, atol=1e-12)
    noisy = words.clone()
    noisy[torch.arange(words.shape[1]) >= lengths[:, None]] = float("nan")
    torch.testing.assert_close(chan_scores(regions, noisy, lengths), want, rtol=0, atol=1e-12)
    # cosine scale: beta * (S - log m), within [mean, max] of the alignments
    cos = chan_scores(regions, words, lengths, lse_scale="cosine")
    torch.testing.assert_close(cos, 0.1 * (want - torch.log(lengths.double())), rtol=0, atol=1e-12)
    assert bool((cos <= 1).all())


def test_float32_scores_without_autograd_equal_float64(ref):
    """The buffered path (no autograd) in float32 against the float64 truth: one GEMM of unit
    vectors in D = 12 (error ~1e-7 per cosine), times 1 / beta = 10."""
    model = _model()
    regions, words, lengths = _tokens(n_img=9, n_cap=13, seed=3)
    want = ref.reference_scores(model, regions, words, lengths)
    with torch.no_grad():
        for max_elements in (None, R * 6, R * 6 * 5):
            got = model.score(regions.float(), words.float(), lengths, max_elements=max_elements)
            assert got.dtype == torch.float32
            torch.testing.assert_close(got.double(), want, rtol=0, atol=1e-5)


def test_bad_inputs_name_the_argument():
    regions, words, lengths = _tokens(n_img=2, n_cap=3)
    with pytest.raises(ValueError, match="beta"):
        chan_scores(regions, words, lengths, beta=0.0)
    with pytest.raises(ValueError, match="lse_scale"):
        chan_scores(regions, words, lengths, lse_scale="mean")
    with pytest.raises(ValueError, match="max_elements"):
        chan_scores(regions, words, lengths, max_elements=0)
    with pytest.raises(ValueError, match="word_lengths"):
        chan_scores(regions, words, lengths + 10)


class _Products(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.seen: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in (torch.ops.aten.mm.default, torch.ops.aten.mm.out):
            self.seen[(args[0].shape[0], args[0].shape[1], args[1].shape[1])] += 1
        return func(*args, **(kwargs or {}))


def test_gemm_bound_runs_the_scorers_products(ref):
    model = _model()
    regions, words, lengths = _tokens(n_img=40, n_cap=300, dtype=torch.float32)
    with torch.no_grad():
        with _Products() as scorer:
            model.score(regions, words, lengths)
        bound = ref.gemm_bound(model, regions, words, lengths)
        with _Products() as floor:
            bound()
    assert scorer.seen == floor.seen and sum(scorer.seen.values()) >= 3


# ----------------------------------------------------------------------------- encoders


def test_region_dropout_equals_encoding_only_the_kept_regions():
    torch.manual_seed(0)
    model = _model(image={"in_dim": IN, "region_dropout": 0.5}).double().train()
    enc = model.image_encoder
    features = torch.randn(6, R, IN, dtype=torch.float64)
    torch.manual_seed(5)
    out = enc(features)
    torch.manual_seed(5)  # the same draw: which regions were kept
    from vlret.models.image import region_dropout_mask

    keep = region_dropout_mask(torch.ones(6, R, dtype=torch.bool), 0.5)
    assert out.shape == (6, R, D) and not bool(keep.all())
    _, words, lengths = _tokens(n_cap=4)
    scores = model.score(out, words, lengths)
    scores.sum().backward(retain_graph=True)  # padded rows are zero features: fc(0) = 0 here
    assert all(bool(torch.isfinite(p.grad).all()) for p in enc.parameters())
    for i in range(6):
        kept = features[i, keep[i]]
        alone = nn.functional.normalize(enc.fc(kept), dim=-1, eps=0)[None]  # no padding at all
        torch.testing.assert_close(scores[i : i + 1], _naive_regions(alone, words, lengths))
        rows = {tuple(r.tolist()) for r in out[i]}
        assert rows == {tuple(r.tolist()) for r in out[i, : int(keep[i].sum())]}
    enc.eval()
    want = enc.fc(features)
    torch.testing.assert_close(enc(features), want / (want.norm(dim=-1, keepdim=True) + 1e-8))


def _naive_regions(regions, words, lengths, beta=0.1):
    out = torch.empty(regions.shape[0], words.shape[0], dtype=regions.dtype)
    for c in range(words.shape[0]):
        best = (regions @ words[c, : lengths[c]].T).amax(dim=1)  # (n_img, m)
        out[:, c] = torch.logsumexp(best / beta, dim=-1)
    return out


def test_self_attention_attends_zero_padding_as_the_release():
    """Variable region counts: the release zero-pads to the batch's longest and calls its
    self-attention without a key mask; padded rows then repeat the first region."""
    torch.manual_seed(1)
    model = _model(image={"in_dim": IN, "self_attention": True, "heads": 3}).double().eval()
    enc = model.image_encoder
    assert enc.feedforward is not None
    features = torch.randn(3, R, IN, dtype=torch.float64)
    lengths = torch.tensor([2, 4, 3])
    out = enc(features, lengths)
    padded = features[:, :4].clone()  # the batch's longest image: 4 regions
    for i, n in enumerate(lengths.tolist()):
        padded[i, n:] = 0.0
    x = enc.fc(padded)
    y = enc.feedforward.ln(x)
    mha = enc.feedforward.attn
    want = x + mha(y, y, y, need_weights=False)[0]
    want = want / (want.norm(dim=-1, keepdim=True) + 1e-8)
    for i, n in enumerate(lengths.tolist()):
        torch.testing.assert_close(out[i, :n], want[i, :n])
        assert torch.equal(out[i, n:], out[i, :1].expand(R - n, -1))
    with pytest.raises(ValueError, match="lengths"):
        enc(features, torch.tensor([1, 2]))


def test_bigru_side_is_vlrets_word_encoder_with_xavier_embeddings():
    model = _model()
    weight = model.text_encoder.embed.weight.detach()
    bound = (6.0 / (VOCAB + 7)) ** 0.5
    assert float(weight.abs().max()) <= bound and float(weight.abs().max()) > 0.1  # not U(-.1,.1)
    captions = torch.randint(1, VOCAB, (4, 6))
    lengths = torch.tensor([6, 2, 4, 1])
    words = model.encode_texts(captions, lengths)
    assert words.shape == (4, 6, D)
    norms = words.norm(dim=-1)
    real = torch.arange(6) < lengths[:, None]
    torch.testing.assert_close(norms[real], torch.ones(int(real.sum())))
    assert bool((norms[~real] == 0).all())


# ----------------------------------------------------------------------------- config


@pytest.mark.parametrize(
    ("change", "key"),
    [
        ({"beta": 0}, "beta"),
        ({"lse_scale": "max"}, "lse_scale"),
        ({"embed_dim": 0}, "embed_dim"),
        ({"image": {"in_dim": IN, "size": 3}}, "image.size"),
        ({"image": {"in_dim": IN, "region_dropout": 1.0}}, "image.region_dropout"),
        ({"image": {"in_dim": IN, "self_attention": 1}}, "image.self_attention"),
        ({"image": {"in_dim": IN, "self_attention": True, "heads": 5}}, "image.heads"),
        ({"text": {"kind": "lstm"}}, "text.kind"),
        ({"text": {"word_dim": 0}}, "text.word_dim"),
        ({"text": {"path": "x"}}, "text.path"),  # a bi-GRU side has no path
        ({"text": {"kind": "bert", "word_dim": 300}}, "text.word_dim"),
        ({"text": {"kind": "bert"}}, "text.path"),
        ({"text": {"vocab_size": VOCAB + 1}}, "text.vocab_size"),
        ({"direction": "t2i"}, "direction"),
    ],
)
def test_config_errors_name_the_key(change, key):
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        _model(**change)


def test_build_model_round_trip_and_a_training_step():
    torch.manual_seed(0)
    model = _model(image={"in_dim": IN, "self_attention": True, "heads": 2, "region_dropout": 0.2})
    again = build_model(model.config)
    assert again.config == model.config and isinstance(again, CHAN)
    again.load_state_dict(model.state_dict())
    assert again.image_encoder.region_dropout == 0.2 and again.image_encoder.feedforward is not None
    batch = RetrievalBatch(
        features=torch.randn(6, R, IN),
        captions=torch.randint(1, VOCAB, (6, 7)),
        lengths=torch.tensor([7, 3, 5, 2, 7, 1]),
        img_index=torch.arange(6),
        cap_index=torch.arange(6),
    )
    model.train()
    sim = model(batch)
    assert sim.shape == (6, 6)
    loss = TripletLoss(margin=0.05).from_similarity(sim)
    loss.backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or not p.grad.any()]
    assert not missing
    model.eval(), again.eval()
    with torch.no_grad():
        torch.testing.assert_close(model(batch), again(batch))


# ----------------------------------------------------------------------------- BERT side

BERT_WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "man", "dog", "red", "runs"]


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory):
    transformers = pytest.importorskip("transformers")
    path = tmp_path_factory.mktemp("chan_bert")
    (path / "vocab.txt").write_text("\n".join(BERT_WORDS) + "\n", encoding="utf-8")
    transformers.BertTokenizer(str(path / "vocab.txt")).save_pretrained(str(path))
    config = transformers.BertConfig(
        vocab_size=len(BERT_WORDS),
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=24,
        max_position_embeddings=32,
    )
    torch.manual_seed(3)
    transformers.BertModel(config).save_pretrained(str(path))
    return path


def test_bert_side_encodes_every_token_and_scores(bert_dir, ref):
    transformers = pytest.importorskip("transformers")
    model = _model(text={"kind": "bert", "path": str(bert_dir)}).eval()
    assert again_config(model) == model.config
    bert = transformers.BertModel.from_pretrained(str(bert_dir)).eval()
    ids = torch.tensor([[2, 5, 6, 9, 3], [2, 7, 3, 0, 0]])
    lengths = torch.tensor([5, 3])
    with torch.no_grad():
        words = model.encode_texts(ids, lengths)
        assert words.shape == (2, 5, D)
        proj = model.text_encoder.proj
        for i, n in enumerate(lengths.tolist()):
            hidden = bert(input_ids=ids[i : i + 1, :n]).last_hidden_state[0]
            want = proj(hidden)
            want = want / (want.norm(dim=-1, keepdim=True) + 1e-8)
            torch.testing.assert_close(words[i, :n], want, rtol=0, atol=1e-5)
        assert bool((words[1, 3:] == 0).all())
        noisy = ids.clone()
        noisy[1, 3:] = 8
        torch.testing.assert_close(model.encode_texts(noisy, lengths), words)
        regions = model.encode_images(torch.randn(3, R, IN))
        got = model.score(regions, words, model.token_lengths(lengths))
        want = ref.reference_scores(model, regions.double(), words.double(), lengths)
        torch.testing.assert_close(got.double(), want, rtol=0, atol=1e-5)
    model.train()
    model.score(
        model.encode_images(torch.randn(2, R, IN)), model.encode_texts(ids, lengths), lengths
    ).sum().backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None]
    assert not missing


def again_config(model):
    return build_model(model.config).config


# ----------------------------------------------------------------------------- release names


def _prefixed(prefix: str, module: nn.Module) -> dict[str, torch.Tensor]:
    return {f"{prefix}{k}": v.clone() for k, v in module.state_dict().items()}


def test_release_parts_load_one_to_one_bigru():
    """A checkpoint list in the release's layout, built from the torch modules its code
    declares (``fc``, ``feedforward.{ln,attn}``; ``embed``, ``rnn``, the unused ``fc``)."""
    torch.manual_seed(2)
    model = _model(image={"in_dim": IN, "self_attention": True, "heads": 2})
    img = {**_prefixed("fc.", nn.Linear(IN, D)), **_prefixed("feedforward.ln.", nn.LayerNorm(D))}
    img.update(_prefixed("feedforward.attn.", nn.MultiheadAttention(D, 2, batch_first=True)))
    txt = {
        **_prefixed("embed.", nn.Embedding(VOCAB, 7)),
        **_prefixed("rnn.", nn.GRU(7, D, 1, batch_first=True, bidirectional=True)),
        **_prefixed("fc.", nn.Linear(D, D)),  # declared, never used: dropped
    }
    names = model.reference_names()
    assert sorted(names.values()) == sorted(model.state_dict())
    assert set(names) == {f"img_enc.{k}" for k in img} | {
        f"txt_enc.{k}" for k in txt if not k.startswith("fc.")
    }
    model.load_reference_parts([img, txt, {}, {}])
    own = model.state_dict()
    for ref_name, name in names.items():
        part, key = ref_name.split(".", 1)
        assert torch.equal(own[name], (img if part == "img_enc" else txt)[key])
    bad = dict(txt)
    bad["rnn.extra"] = torch.zeros(1)
    with pytest.raises(ValueError, match=r"txt_enc\.rnn\.extra"):
        model.load_reference_parts([img, bad, {}, {}])
    del bad["rnn.extra"], bad["embed.weight"]
    with pytest.raises(ValueError, match=r"txt_enc\.embed\.weight is missing"):
        model.load_reference_parts([img, bad, {}, {}])
    with pytest.raises(ValueError, match="shape"):
        model.load_reference_parts([{**img, "fc.bias": torch.zeros(D + 1)}, txt, {}, {}])


def test_release_parts_load_bert_side(bert_dir):
    transformers = pytest.importorskip("transformers")
    model = _model(text={"kind": "bert", "path": str(bert_dir)})
    torch.manual_seed(4)
    config = transformers.BertConfig.from_pretrained(str(bert_dir))
    release_bert = transformers.BertModel(config)  # with its pooler, as the release builds it
    txt = {**_prefixed("bert.", release_bert), **_prefixed("linear.", nn.Linear(16, D))}
    txt["bert.embeddings.position_ids"] = torch.arange(32)[None]  # transformers 4.18 saves it
    img = _prefixed("fc.", nn.Linear(IN, D))
    model.load_reference_parts([img, txt, {}, {}])
    assert torch.equal(model.text_encoder.proj.weight, txt["linear.weight"])
    skipped = [k for k in txt if f"txt_enc.{k}" not in model.reference_names()]
    assert skipped and all(f"txt_enc.{k}".startswith(UNUSED_REFERENCE_PREFIXES) for k in skipped)
    assert any(k.startswith("bert.pooler.") for k in skipped)
    ids = torch.tensor([[2, 5, 6, 3]])
    with torch.no_grad():
        hidden = release_bert.eval()(input_ids=ids).last_hidden_state
        want = nn.functional.linear(hidden, txt["linear.weight"], txt["linear.bias"])
        got = model.eval().encode_texts(ids, torch.tensor([4]))
        torch.testing.assert_close(got, want / (want.norm(dim=-1, keepdim=True) + 1e-8))


def test_bert_side_backpropagates_through_the_pair_bank(bert_dir):
    """AdaCL's memory bank scores the batch against queued entries with the model's buffers
    restored afterwards; restoring BERT's ``position_ids`` (read as an index, saved for the
    backward) in place used to make the backward refuse to run."""
    from vlret.train.procedures.pair_memory import PairMemoryBank, bank_scores

    model = _model(text={"kind": "bert", "path": str(bert_dir)}).train()
    ids = torch.tensor([[2, 5, 6, 9, 3], [2, 7, 3, 0, 0]])
    lengths = torch.tensor([5, 3])
    regions = model.encode_images(torch.randn(2, R, IN))
    words = model.encode_texts(ids, lengths)
    bank = PairMemoryBank(4, regions=R, dim=D, words_max=5)
    with torch.no_grad():
        bank.enqueue(regions.detach(), words.detach(), lengths, torch.tensor([7, 8]))
    to_txt, to_img = bank_scores(model, regions, words, lengths, bank)
    assert to_txt.shape == (2, 2) and to_img.shape == (2, 2)
    (to_txt.sum() + to_img.sum() + model.score(regions, words, lengths).sum()).backward()
    assert model.text_encoder.proj.weight.grad is not None


def test_bfloat16_evaluation_is_within_its_rounding_bound(ref):
    """bfloat16 operands (relative error 2^-9 each) and results (2^-9 of a cosine <= 1): each
    aligned cosine is off by at most 2^-8 + 2^-9, the log-sum-exp by that over beta."""
    model = _model(matmul_precision="bfloat16").eval()
    assert build_model(model.config).matmul_precision == "bfloat16"
    regions, words, lengths = _tokens(n_img=9, n_cap=13, seed=4)
    want = ref.reference_scores(model, regions, words, lengths)
    with torch.no_grad():
        got = model.score(regions.float(), words.float(), lengths)
    bound = (2**-8 + 2**-9) / model.beta
    err = float((got.double() - want).abs().max())
    assert got.dtype == torch.float32 and 1e-6 < err <= bound  # rounded, within the bound
    with pytest.raises(ValueError, match="matmul_precision"):
        _model(matmul_precision="float16")
