"""``write_random_bert`` (``vlret synth ... --random-bert``): a local BERT whose tokenizer knows
every word of the world's captions, loadable offline by MMT's text encoder."""

from __future__ import annotations

import pytest
import torch

from vlret.cli import main
from vlret.data import load_hf_tokenizer
from vlret.worlds.bert import SPECIAL, write_random_bert

transformers = pytest.importorskip("transformers")

CAPTIONS = ["A red cube, left of a Blue sphere.", "two small spheres", "a cube"]


def test_every_caption_word_is_in_the_vocabulary_and_the_model_loads(tmp_path):
    out = write_random_bert(tmp_path / "bert", CAPTIONS, hidden=8, heads=2, layers=1)
    vocab = (out / "vocab.txt").read_text(encoding="utf-8").split("\n")[:-1]
    assert tuple(vocab[: len(SPECIAL)]) == SPECIAL
    assert set(vocab[len(SPECIAL) :]) == {
        "a", "red", "cube", ",", "left", "of", "blue", "sphere", ".", "two", "small", "spheres"
    }  # fmt: skip
    tok = load_hf_tokenizer(out)
    unk = vocab.index("[UNK]")
    for text in CAPTIONS:
        ids = tok.encode(text)
        assert unk not in ids and ids[0] == vocab.index("[CLS]") and ids[-1] == vocab.index("[SEP]")
    model = transformers.BertModel.from_pretrained(str(out), local_files_only=True)
    assert model.config.vocab_size == len(vocab) and model.config.hidden_size == 8


def test_the_weights_follow_the_seed_and_leave_the_global_rng_alone(tmp_path):
    before = torch.random.get_rng_state()
    a = write_random_bert(tmp_path / "a", CAPTIONS, hidden=8, heads=2, layers=1, seed=1)
    assert torch.equal(torch.random.get_rng_state(), before)
    b = write_random_bert(tmp_path / "b", CAPTIONS, hidden=8, heads=2, layers=1, seed=1)
    c = write_random_bert(tmp_path / "c", CAPTIONS, hidden=8, heads=2, layers=1, seed=2)
    load = transformers.BertModel.from_pretrained
    wa, wb, wc = (load(str(p)).embeddings.word_embeddings.weight for p in (a, b, c))
    assert torch.equal(wa, wb) and not torch.equal(wa, wc)


def test_bad_arguments_and_an_existing_model_are_refused(tmp_path):
    write_random_bert(tmp_path / "bert", CAPTIONS, hidden=8, heads=2, layers=1)
    with pytest.raises(FileExistsError, match="config.json"):
        write_random_bert(tmp_path / "bert", CAPTIONS)
    with pytest.raises(ValueError, match="multiple of heads"):
        write_random_bert(tmp_path / "x", CAPTIONS, hidden=9, heads=2)
    with pytest.raises(ValueError, match="no words"):
        write_random_bert(tmp_path / "x", ["", "  "])
    with pytest.raises(ValueError, match="max_positions"):
        write_random_bert(tmp_path / "x", CAPTIONS, max_positions=5)


def test_synth_random_bert_needs_an_msrvtt_or_precomp_world(tmp_path, capsys):
    args = ["synth", "tiny", "--out", str(tmp_path / "w"), "--random-bert", "--format", "karpathy"]
    assert main(args) == 2
    assert "--random-bert needs an MSR-VTT-format world" in capsys.readouterr().err


def test_synth_random_bert_on_a_precomp_world_knows_every_caption_word(tmp_path):
    # the BERT text sides of DIME, CHAN and USER on the f30k-like feature worlds
    out = tmp_path / "w"
    assert main(["synth", "tiny", "--out", str(out), "--random-bert"]) == 0
    tokenizer = transformers.BertTokenizer.from_pretrained(str(out / "random-bert"))
    lines = [
        line for caps in out.glob("*_caps.txt") for line in caps.read_text("utf-8").splitlines()
    ]
    assert len(lines) > 100
    pieces = {p for line in lines for p in tokenizer.tokenize(line)}
    assert pieces and tokenizer.unk_token not in pieces
    assert not (out / "synthetic.unfinished").exists()


def test_without_transformers_the_error_names_the_extra(tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers -> ImportError
    with pytest.raises(ImportError, match=r"write_random_bert needs transformers: .*vlret\[hf\]"):
        write_random_bert(tmp_path / "bert", CAPTIONS)
    assert not (tmp_path / "bert").exists()
