"""Regex and NLTK tokenisers, vocabulary rules (train + dev only, min count 4), JSON, encoder
states, local HF tokenizers."""

from __future__ import annotations

import importlib.util
import json
import pickle
import sys
import types

import numpy as np
import pytest

from vlret.data import (
    SPECIAL_TOKENS,
    DataFormatError,
    HFTokenizer,
    PrecompDataset,
    Vocabulary,
    build_precomp_vocab,
    build_vocab,
    load_hf_tokenizer,
    tokenize,
)
from vlret.data.vocab import nltk_tokenize
from vlret.data.writers import write_precomp
from vlret.run.builders import encoder_from_state, encoder_state


def test_tokenize():
    assert tokenize("A man with a red helmet on a small moped on a dirt road .") == (
        "a man with a red helmet on a small moped on a dirt road .".split()
    )
    assert tokenize("The man's T-shirt, red!") == ["the", "man", "'s", "t-shirt", ",", "red", "!"]
    assert tokenize("Two dogs (2) play;they run") == [
        "two", "dogs", "(", "2", ")", "play", ";", "they", "run",
    ]  # fmt: skip
    assert tokenize("  ") == []


def test_min_count_and_special_tokens():
    captions = ["cat dog"] * 4 + ["dog bird"] * 3 + ["Fish"] * 4
    vocab = build_vocab(captions)
    # counts: dog 7, cat 4, fish 4, bird 3 (dropped); ties alphabetical
    assert vocab.idx2word == [*SPECIAL_TOKENS, "dog", "cat", "fish"]
    assert [vocab(w) for w in SPECIAL_TOKENS] == [0, 1, 2, 3]
    assert (vocab.pad_id, vocab.start_id, vocab.end_id, vocab.unk_id) == (0, 1, 2, 3)
    assert "bird" not in vocab and vocab("bird") == 3
    assert build_vocab(captions, min_count=3).idx2word[-1] == "bird"
    with pytest.raises(ValueError, match="min_count must be a positive int"):
        build_vocab(captions, min_count=0)


def test_encode_decode():
    vocab = build_vocab(["a dog runs ."] * 4)
    ids = vocab.encode("A dog flies .")
    assert ids == [1, vocab("a"), vocab("dog"), 3, vocab("."), 2]
    assert vocab.encode("a dog", add_special=False) == [vocab("a"), vocab("dog")]
    assert vocab.decode(ids) == "a dog <unk> ."
    assert vocab.decode(ids, skip_special=False) == "<start> a dog <unk> . <end>"


def test_json_round_trip_in_the_vse_layout(tmp_path):
    vocab = build_vocab(["a man rides a horse ."] * 4 + ["a woman"] * 4)
    path = vocab.save(tmp_path / "vocab.json")
    data = json.loads(path.read_text())
    assert set(data) == {"word2idx", "idx2word", "idx"}
    assert data["idx"] == len(vocab) == len(data["word2idx"])
    assert data["idx2word"]["0"] == "<pad>" and data["idx2word"]["3"] == "<unk>"
    assert data["word2idx"]["<start>"] == 1 and data["word2idx"]["<end>"] == 2
    loaded = Vocabulary.load(path)
    assert loaded == vocab and loaded.encode("a man") == vocab.encode("a man")


def _write(tmp_path, data) -> object:
    path = tmp_path / "vocab.json"
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


def test_load_errors_name_the_file_and_the_line(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"vocab\.json: missing; expected a vocabulary"):
        Vocabulary.load(tmp_path / "vocab.json")
    path = _write(tmp_path, '{"word2idx": {},\n "idx2word": {}\n "idx": 4}')
    with pytest.raises(DataFormatError, match=r"vocab\.json, line 3: invalid JSON") as e:
        Vocabulary.load(path)
    assert e.value.line == 3
    _write(tmp_path, {"word2idx": {}, "idx": 0})
    with pytest.raises(DataFormatError, match=r"top level is \['idx', 'word2idx'\]; expected"):
        Vocabulary.load(path)
    good = build_vocab(["x y"] * 4).to_json()
    bad = dict(good, word2idx=dict(good["word2idx"], x=5))
    _write(tmp_path, bad)
    with pytest.raises(DataFormatError, match=r"word2idx\['x'\] is 5, idx2word says 4"):
        Vocabulary.load(path)
    bad = dict(good, idx=7)
    _write(tmp_path, bad)
    with pytest.raises(DataFormatError, match=r"idx is 7 but idx2word has 6"):
        Vocabulary.load(path)
    words = ["<start>", "<pad>", "<end>", "<unk>", "x", "y"]
    swapped = {
        "word2idx": {w: i for i, w in enumerate(words)},
        "idx2word": {str(i): w for i, w in enumerate(words)},
        "idx": 6,
    }
    _write(tmp_path, swapped)
    with pytest.raises(DataFormatError, match=r"idx2word must start with \('<pad>'"):
        Vocabulary.load(path)


def test_precomp_vocab_counts_train_and_dev_never_test(tmp_path):
    feats = np.zeros((1, 4), dtype=np.float32)
    write_precomp(tmp_path, "train", feats, ["a red cat"] * 3 + ["a blue zebu", "a red dog"])
    write_precomp(tmp_path, "dev", feats, ["a blue zebu ."] * 3 + ["a red cat"] * 2)
    write_precomp(tmp_path, "test", feats, ["a giraffe ."] * 5)
    write_precomp(tmp_path, "testall", feats, ["a giraffe ."] * 5)
    vocab = build_precomp_vocab(tmp_path)
    # train + dev counts: red 6, cat 5, blue 4, zebu 4, "." 3, dog 1; test adds giraffe 10, "." 10.
    assert "giraffe" not in vocab
    assert {"a", "red", "cat", "zebu", "blue"} <= set(vocab.idx2word)
    assert "dog" not in vocab  # seen once
    assert "." not in vocab  # three times in dev only; test's five do not count
    for split in ("test", "testall"):
        with pytest.raises(ValueError, match="train and dev splits only"):
            build_precomp_vocab(tmp_path, splits=("train", split))
    # The vocabulary is a caption encoder for the datasets, padding with <pad> = 0.
    ds = PrecompDataset(tmp_path, "train", encoder=vocab)
    batch = ds.collate([ds[0], ds[3]])
    assert batch.captions[0].tolist() == [1, vocab("a"), vocab("red"), vocab("cat"), 2]
    assert batch.lengths.tolist() == [5, 5]


# ----------------------------------------------------------------------------- NLTK tokeniser

# One sentence each (Punkt splits none of them), so word_tokenize(..., preserve_line=True) is
# the reference word_tokenize(caption.lower()) with or without the Punkt data.
ONE_SENTENCE = [
    "A man don't run",
    "I can't believe they're here, we'll see; she'd go and I'm sure you've won't",
    "He cannot swim .",
    'A sign that says "STOP" on a pole.',
    "A man holding 3.5 kg of fish, 1,000 people at 10:30 and $5 tickets",
    "The dog's toy and the dogs' bowls, James's hat",
    "A man ... walking (slowly) -- or not?!",
    "Two T-shirts on a 2-year-old child's bed.",
    "  A  caption with   odd spacing . ",
]
# Several sentences: the reference splits them with Punkt, then tokenises each.
SEVERAL_SENTENCES = [
    ("A kitchen with a stove. There is a sink.", ["a kitchen with a stove.", "there is a sink."]),
    ("I don't know. We can't.", ["i don't know.", "we can't."]),
    ('He said "hi." Then he left!', ['he said "hi."', "then he left!"]),
    ("Is it a cat? No, a dog. A big one", ["is it a cat?", "no, a dog.", "a big one"]),
]


def _punkt_installed(nltk) -> bool:
    try:
        nltk.tokenize.sent_tokenize("a.")
    except LookupError:
        return False
    return True


def test_nltk_tokenizer_is_the_reference_word_tokenize():
    nltk = pytest.importorskip("nltk")
    word_tokenize = nltk.tokenize.word_tokenize
    for caption in ONE_SENTENCE:
        assert nltk_tokenize(caption) == word_tokenize(caption.lower(), preserve_line=True)
    assert nltk_tokenize("A man don't run") == ["a", "man", "do", "n't", "run"]
    assert nltk_tokenize('Says "STOP".') == ["says", "``", "stop", "''", "."]
    assert nltk_tokenize("He cannot, 3.5 kg")[1:4] == ["can", "not", ","]
    for caption, sentences in SEVERAL_SENTENCES:
        expected = [w for s in sentences for w in word_tokenize(s, preserve_line=True)]
        assert nltk_tokenize(caption) == expected, caption
    # Splitting sentences matters: without it a mid-caption period stays on its word.
    assert "stove." in word_tokenize(SEVERAL_SENTENCES[0][0].lower(), preserve_line=True)
    if _punkt_installed(nltk):
        for caption in [*ONE_SENTENCE, *(c for c, _ in SEVERAL_SENTENCES), "Mr. Smith. A dog"]:
            assert nltk_tokenize(caption) == word_tokenize(caption.lower()), caption


def test_nltk_tokenizer_without_the_punkt_data_misses_its_abbreviations():
    nltk = pytest.importorskip("nltk")
    if _punkt_installed(nltk):
        pytest.skip("the Punkt data is installed: nltk_tokenize is word_tokenize exactly")
    # The English Punkt model knows "mr." (the reference keeps "mr." whole); untrained Punkt
    # ends a sentence there (module docstring of vlret.data.vocab).
    assert nltk_tokenize("Mr. Smith. A dog") == ["mr", ".", "smith", ".", "a", "dog"]


def test_nltk_tokenizer_uses_the_punkt_data_when_installed(tmp_path, monkeypatch):
    """A stand-in English Punkt model that knows one abbreviation, "mr": nltk_tokenize is then
    word_tokenize itself, keeping "mr." whole."""
    nltk = pytest.importorskip("nltk")
    punkt_cache = getattr(nltk.tokenize, "_get_punkt_tokenizer", None)
    if not hasattr(punkt_cache, "cache_clear"):
        pytest.skip("this NLTK caches its Punkt model elsewhere")
    model = tmp_path / "tokenizers" / "punkt_tab" / "english"
    model.mkdir(parents=True)
    for name in ("collocations.tab", "sent_starters.txt", "ortho_context.tab"):
        (model / name).write_text("")
    (model / "abbrev_types.txt").write_text("mr\n")
    monkeypatch.setattr(nltk.data, "path", [str(tmp_path), *nltk.data.path])
    vocab_module = sys.modules[Vocabulary.__module__]
    try:
        vocab_module._nltk_pipeline.cache_clear()
        punkt_cache.cache_clear()
        tokens = nltk_tokenize("Mr. Smith. A dog")
        assert tokens == nltk.tokenize.word_tokenize("mr. smith. a dog")
        assert tokens == ["mr.", "smith", ".", "a", "dog"]
    finally:  # forget the stand-in model
        vocab_module._nltk_pipeline.cache_clear()
        punkt_cache.cache_clear()


def test_nltk_vocabulary_encodes_saves_and_compares(tmp_path):
    pytest.importorskip("nltk")
    captions = ["A man don't run.", "A man doesn't swim"] * 4
    vocab = build_vocab(captions, tokenizer="nltk")
    assert vocab.tokenizer == "nltk" and "n't" in vocab and "don't" not in vocab
    assert vocab.encode("A MAN don't run.") == [
        1, *(vocab(w) for w in ["a", "man", "do", "n't", "run", "."]), 2,
    ]  # fmt: skip
    assert repr(vocab) == f"Vocabulary({len(vocab)} words, tokenizer='nltk')"
    path = vocab.save(tmp_path / "vocab.json")
    assert json.loads(path.read_text())["tokenizer"] == "nltk"
    loaded = Vocabulary.load(path)
    assert loaded == vocab and loaded.tokenizer == "nltk"
    assert loaded.encode("a man don't run") == vocab.encode("a man don't run")
    assert pickle.loads(pickle.dumps(vocab)) == vocab  # DataLoader workers receive it pickled
    # Same words, other tokeniser: a different encoder.
    regex = Vocabulary(vocab.idx2word)
    assert regex != vocab and regex.tokenizer == "vlret" and "tokenizer" not in regex.to_json()
    assert regex.encode("a man don't run") != vocab.encode("a man don't run")


def test_unknown_tokenizer_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"tokenizer must be one of \('vlret', 'nltk'\), got 'x'"):
        Vocabulary(list(SPECIAL_TOKENS), tokenizer="x")
    with pytest.raises(ValueError, match=r"got 'spacy'"):
        build_vocab(["a"] * 4, tokenizer="spacy")
    path = _write(tmp_path, dict(build_vocab(["x y"] * 4).to_json(), tokenizer="bpe"))
    with pytest.raises(DataFormatError, match=r"vocab\.json: tokenizer must be one of .* 'bpe'"):
        Vocabulary.load(path)


def test_nltk_tokenizer_without_nltk_says_how_to_install(tmp_path, monkeypatch):
    path = _write(tmp_path, dict(build_vocab(["x y"] * 4).to_json(), tokenizer="nltk"))
    monkeypatch.setitem(sys.modules, "nltk", None)  # import nltk -> ImportError
    install = (
        r"needs the optional package 'nltk' \(pip install nltk, or pip install 'vlret\[nltk\]'"
    )
    with pytest.raises(ImportError, match=install):
        Vocabulary(list(SPECIAL_TOKENS), tokenizer="nltk")
    with pytest.raises(ImportError, match=install):
        Vocabulary.load(path)
    with pytest.raises(ImportError, match=install):
        nltk_tokenize("a man")
    assert Vocabulary(list(SPECIAL_TOKENS)).encode("a man") == [1, 3, 3, 2]


def test_encoder_state_keeps_the_tokenizer():
    words = [*SPECIAL_TOKENS, "a", "man", "do", "n't"]
    # The config only matters for HF tokenizers (their directory).
    state = encoder_state(Vocabulary(words), None)
    assert state == {"kind": "vocab", "idx2word": words, "tokenizer": "vlret"}
    assert encoder_from_state(state) == Vocabulary(words)
    # A checkpoint written before the key existed: the regex tokeniser.
    old = encoder_from_state({"kind": "vocab", "idx2word": words})
    assert old == Vocabulary(words) and old.tokenizer == "vlret"
    for name in ("sentencepiece", None):
        with pytest.raises(ValueError, match=f"encoder state tokenizer {name!r} is unknown"):
            encoder_from_state({"kind": "vocab", "idx2word": words, "tokenizer": name})


def test_encoder_state_of_an_nltk_vocabulary_and_an_imported_checkpoint():
    pytest.importorskip("nltk")
    words = [*SPECIAL_TOKENS, "a", "man", "do", "n't"]
    vocab = Vocabulary(words, tokenizer="nltk")
    state = encoder_state(vocab, None)
    assert state["tokenizer"] == "nltk" and encoder_from_state(state) == vocab
    # What vlret import-checkpoint writes for the reference code's tokenisation.
    imported = encoder_from_state(
        {"kind": "vocab", "idx2word": words, "tokenizer": "nltk_word_tokenize"}
    )
    assert imported == vocab and imported.encode("A man don't") == [1, 4, 5, 6, 7, 2]


# ----------------------------------------------------------------------------- HF tokenizer


def test_hf_tokenizer_needs_a_local_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"nope: missing; expected a local tokenizer"):
        load_hf_tokenizer(tmp_path / "nope")


@pytest.mark.skipif(
    importlib.util.find_spec("transformers") is not None, reason="transformers is installed"
)
def test_hf_tokenizer_without_transformers_says_so(tmp_path):
    with pytest.raises(ImportError, match=r"needs the optional package 'transformers'"):
        load_hf_tokenizer(tmp_path)


class _FakeTokenizer:
    pad_token_id = 7
    model_max_length = 5

    def __call__(self, text, truncation=False, max_length=None):
        ids = [101, *(len(w) for w in text.split()), 102]
        if truncation:
            ids = ids[:max_length]
        return {"input_ids": ids}


def _fake_transformers(calls: list, fail: bool = False) -> types.ModuleType:
    module = types.ModuleType("transformers")

    class AutoTokenizer:
        @staticmethod
        def from_pretrained(path, **kwargs):
            calls.append((path, kwargs))
            if fail:
                raise OSError("no tokenizer.json")
            return _FakeTokenizer()

    module.AutoTokenizer = AutoTokenizer
    return module


def test_hf_tokenizer_loads_locally_and_encodes(tmp_path, monkeypatch):
    calls: list = []
    monkeypatch.setitem(sys.modules, "transformers", _fake_transformers(calls))
    tok = load_hf_tokenizer(tmp_path)
    assert calls == [(str(tmp_path), {"local_files_only": True})]
    assert isinstance(tok, HFTokenizer) and tok.pad_id == 7
    assert tok.encode("aa b") == [101, 2, 1, 102]
    assert tok.encode("a b c d e f") == [101, 1, 1, 1, 1]  # model_max_length 5
    assert load_hf_tokenizer(tmp_path, max_length=3).encode("a b c") == [101, 1, 1]


def test_hf_tokenizer_load_failure_names_the_directory(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", _fake_transformers([], fail=True))
    with pytest.raises(DataFormatError, match=r"could not load a tokenizer \(no tokenizer\.json\)"):
        load_hf_tokenizer(tmp_path)


def test_hf_tokenizer_without_pad_or_limit():
    class Bare:
        model_max_length = int(1e30)

        def __call__(self, text, **kwargs):
            assert not kwargs  # no truncation for an unlimited tokenizer
            return {"input_ids": [1] * len(text)}

    tok = HFTokenizer(Bare())
    assert tok.pad_id == 0 and tok.max_length is None and tok.encode("abc") == [1, 1, 1]
