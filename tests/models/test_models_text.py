"""Text encoders: (bi-)GRU against hand-written GRU recurrences, padding, a tiny local BERT."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from vlret.data import load_hf_tokenizer, pad_captions
from vlret.models import build_model
from vlret.models.text import (
    BertTextEncoder,
    GRUTextEncoder,
    check_batch,
    import_transformers,
    resolve_vocab_size,
)

VOCAB, WORD, EMB = 20, 7, 5


def gru_steps(gru: torch.nn.GRU, words: torch.Tensor, suffix: str) -> torch.Tensor:
    """The GRU recurrence written out (PyTorch's gate order r, z, n) over ``words`` (T, W)."""
    w_ih, w_hh = getattr(gru, "weight_ih_l0" + suffix), getattr(gru, "weight_hh_l0" + suffix)
    b_ih, b_hh = getattr(gru, "bias_ih_l0" + suffix), getattr(gru, "bias_hh_l0" + suffix)
    h = torch.zeros(gru.hidden_size)
    states = []
    for x in words:
        gi, gh = w_ih @ x + b_ih, w_hh @ h + b_hh
        ir, iz, in_ = gi.chunk(3)
        hr, hz, hn = gh.chunk(3)
        r, z = torch.sigmoid(ir + hr), torch.sigmoid(iz + hz)
        n = torch.tanh(in_ + r * hn)
        h = (1 - z) * n + z * h
        states.append(h)
    return torch.stack(states)


def manual_outputs(enc: GRUTextEncoder, ids: torch.Tensor) -> torch.Tensor:
    """Per-word outputs of the valid ids ``(T,)``: forward, or the average of both directions."""
    words = enc.embed.weight[ids]
    fwd = gru_steps(enc.gru, words, "")
    if not enc.bidirectional:
        return fwd
    bwd = gru_steps(enc.gru, words.flip(0), "_reverse").flip(0)
    return (fwd + bwd) / 2


def batch(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([6, 2, 4, 1])
    caps = [torch.randint(1, VOCAB, (int(n),), generator=g) for n in lengths]
    ids, lens = pad_captions(caps)
    return caps, ids, lens


@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("pooling", ["last", "mean", "max"])
def test_gru_equals_hand_written_recurrence(bidirectional, pooling):
    torch.manual_seed(0)
    enc = GRUTextEncoder(
        VOCAB, word_dim=WORD, embed_dim=EMB, bidirectional=bidirectional, pooling=pooling
    )
    caps, ids, lens = batch()
    with torch.no_grad():
        got = enc(ids, lens)
        assert got.shape == (4, EMB)
        for i, cap in enumerate(caps):
            words = enc.embed.weight[cap]
            if pooling == "last":
                fwd_last = gru_steps(enc.gru, words, "")[-1]
                if bidirectional:
                    bwd_last = gru_steps(enc.gru, words.flip(0), "_reverse")[-1]
                    expected = (fwd_last + bwd_last) / 2
                else:
                    expected = fwd_last
            else:
                out = manual_outputs(enc, cap)
                expected = out.mean(0) if pooling == "mean" else out.amax(0)
            assert torch.allclose(got[i], expected, atol=1e-5), (i, pooling)


@pytest.mark.parametrize("pooling", ["last", "mean", "max", "gpo"])
def test_padding_words_never_change_the_output(pooling):
    torch.manual_seed(1)
    enc = GRUTextEncoder(VOCAB, word_dim=WORD, embed_dim=EMB, bidirectional=True, pooling=pooling)
    caps, ids, lens = batch(1)
    with torch.no_grad():
        got = enc(ids, lens)
        noisy = ids.clone()
        for i, n in enumerate(lens.tolist()):
            noisy[i, n:] = torch.randint(0, VOCAB, (ids.shape[1] - n,))
        wider = torch.cat([noisy, torch.randint(0, VOCAB, (4, 3))], dim=1)
        assert torch.allclose(enc(wider, lens), got, atol=1e-6)
        for i, cap in enumerate(caps):
            alone = enc(cap.unsqueeze(0), torch.tensor([len(cap)]))
            assert torch.allclose(alone[0], got[i], atol=1e-5)


def test_lengths_default_to_full_width_and_gradients_flow():
    torch.manual_seed(2)
    enc = GRUTextEncoder(VOCAB, word_dim=WORD, embed_dim=EMB, bidirectional=True, pooling="gpo")
    _, ids, lens = batch(2)
    full = torch.randint(1, VOCAB, (3, 5))
    assert torch.allclose(enc(full), enc(full, torch.tensor([5, 5, 5])))
    enc(ids, lens).pow(2).sum().backward()
    for name, p in enc.named_parameters():
        assert p.grad is not None and float(p.grad.abs().sum()) > 0, name


def test_gru_bad_inputs_raise():
    enc = GRUTextEncoder(VOCAB, word_dim=WORD, embed_dim=EMB)
    ids = torch.randint(1, VOCAB, (2, 4))
    with pytest.raises(ValueError, match="lengths"):
        enc(ids, torch.tensor([0, 4]))
    with pytest.raises(ValueError, match="lengths"):
        enc(ids, torch.tensor([5, 4]))
    with pytest.raises(ValueError, match="vocab_size"):
        enc(ids + VOCAB, torch.tensor([4, 4]))
    with pytest.raises(ValueError, match="encoder"):
        enc(["a dog", "a cat"], None)
    with pytest.raises(ValueError, match="pooling"):
        GRUTextEncoder(VOCAB, pooling="cls")


BERT_WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "man", "dog", "red", "runs", "."]


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory):
    transformers = pytest.importorskip("transformers")
    path = tmp_path_factory.mktemp("tiny_bert")
    vocab = path / "vocab.txt"
    vocab.write_text("\n".join(BERT_WORDS) + "\n", encoding="utf-8")
    transformers.BertTokenizer(str(vocab)).save_pretrained(str(path))
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


@pytest.mark.parametrize("pooling", ["cls", "mean", "gpo"])
def test_bert_from_local_dir_with_offline_tokenizer(bert_dir, pooling):
    tok = load_hf_tokenizer(bert_dir)
    texts = ["a man runs .", "a red dog", "dog"]
    caps = [torch.tensor(tok.encode(t)) for t in texts]
    assert caps[2].tolist() == [2, 7, 3]  # [CLS] dog [SEP]
    ids, lens = pad_captions(caps, pad_id=tok.pad_id)
    enc = BertTextEncoder(bert_dir, embed_dim=EMB, pooling=pooling).eval()
    with torch.no_grad():
        got = enc(ids, lens)
        assert got.shape == (3, EMB)
        for i, cap in enumerate(caps):
            hidden = enc.bert(input_ids=cap.unsqueeze(0)).last_hidden_state[0]
            if pooling == "cls":
                expected = enc.proj(hidden[0])
            elif pooling == "mean":
                expected = enc.proj(hidden).mean(0)
            else:
                expected = enc(cap.unsqueeze(0))[0]
            assert torch.allclose(got[i], expected, atol=1e-5), (pooling, i)
            noisy = ids.clone()
            noisy[:, int(lens[i]) :] = 9
            assert torch.allclose(enc(noisy, lens)[i], got[i], atol=1e-5)


def test_bert_gradients_reach_every_parameter(bert_dir):
    enc = BertTextEncoder(bert_dir, embed_dim=EMB)
    assert enc.bert.pooler is None  # unused parameters would stall DistributedDataParallel
    assert all(p.dtype == torch.float32 for p in enc.parameters())
    ids = torch.tensor([[2, 5, 6, 9, 3], [2, 7, 3, 0, 0]])
    enc(ids, torch.tensor([5, 3])).pow(2).sum().backward()
    missing = [n for n, p in enc.named_parameters() if p.grad is None]
    assert not missing


def test_bert_missing_dir_and_missing_transformers(tmp_path, monkeypatch):
    with pytest.raises(FileNotFoundError, match="never downloads"):
        BertTextEncoder(tmp_path / "nope")
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(ImportError, match=r"pip install vlret\[hf\]"):
        import_transformers("BERT")
    with pytest.raises(ImportError, match=r"vlret\[hf\]"):
        BertTextEncoder(tmp_path)


def test_resolve_vocab_size_agrees_or_names_the_key():
    """One of config / argument is enough, both must agree, and the size is a positive int."""
    assert resolve_vocab_size(None, 7, "x") == resolve_vocab_size(7, None, "x") == 7
    assert (
        resolve_vocab_size(7, np.int64(7), "x") == 7
        and type(resolve_vocab_size(None, np.int64(7), "x")) is int
    )
    with pytest.raises(
        ValueError, match=r"^text\.vocab_size: 5 in the config disagrees with vocab_size=7"
    ):
        resolve_vocab_size(5, 7, "x")
    with pytest.raises(ValueError, match=r"^text\.vocab_size: the GRU needs the vocabulary size"):
        resolve_vocab_size(None, None, "the GRU")
    for bad in (0, 2.5, True):
        with pytest.raises(ValueError, match=r"^text\.vocab_size: must be a positive int"):
            resolve_vocab_size(bad, None, "x")
    # Every word-id model family resolves it through here: the GRU embedding model's message.
    with pytest.raises(ValueError, match=r"^text\.vocab_size: the GRU text encoder needs"):
        build_model({"image": {"kind": "precomp", "in_dim": 4}, "text": {"kind": "gru"}})


def test_check_batch_names_the_first_missing_field():
    class Partial:
        features = captions = None

    with pytest.raises(ValueError, match=r"batch has no 'lengths'.*got Partial"):
        check_batch(Partial())
    with pytest.raises(ValueError, match=r"batch has no 'features'.*got tuple"):
        check_batch((1, 2))
    Partial.lengths = None
    check_batch(Partial())
