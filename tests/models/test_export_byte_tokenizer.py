"""vlret's byte tokenizer as a ``tokenizer.json``: saved by ``save_pretrained``, loaded by
``transformers``' ``AutoTokenizer``, it gives :class:`CLIPByteTokenizer`'s ids on every
character Python lower-cases, every character ``str.split`` splits on, the final sigma in
its contexts, truncation inside a multi-byte character, and random text."""

from __future__ import annotations

import random

import pytest

pytest.importorskip("transformers")

from tokenizers import pre_tokenizers  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

from vlret.models.clip import CLIPByteTokenizer  # noqa: E402
from vlret.models.export.byte_tokenizer import (  # noqa: E402
    byte_characters,
    byte_tokenizer_for_transformers,
    python_lowercase,
    python_whitespace,
)


@pytest.fixture(scope="module", params=[(49406, 49407, 77), (300, 257, 16)])
def pair(request, tmp_path_factory):
    """(vlret's tokenizer, the saved-and-reloaded transformers one)."""
    bos, eos, length = request.param
    ours = CLIPByteTokenizer(bos_id=bos, eos_id=eos, context_length=length)
    folder = tmp_path_factory.mktemp("tok")
    byte_tokenizer_for_transformers(ours).save_pretrained(str(folder))
    return ours, AutoTokenizer.from_pretrained(str(folder))


def _same(pair, texts):
    ours, theirs = pair
    got = theirs(list(texts), truncation=True)["input_ids"]
    wrong = [t for t, ids in zip(texts, got, strict=True) if ids != ours.encode(t)]
    assert not wrong, [ascii(t) for t in wrong[:5]]


def test_every_character_python_lower_cases(pair):
    chars = [c for c, _ in python_lowercase()]
    assert len(chars) > 1000
    _same(pair, [c for c in chars] + ["".join(chars[i : i + 5]) for i in range(0, len(chars), 5)])


def test_every_whitespace_python_splits_on(pair):
    spaces = python_whitespace()
    assert "\x1c" in spaces and "\u3000" in spaces and "\u200b" not in spaces
    _same(pair, [f"{s}a{s}{s}b{t}" for s in spaces for t in spaces[::5]] + ["\u200ba b\u200b"])


def test_the_final_sigma_in_its_contexts(pair):
    cases = [
        "ΟΔΟΣ", "ΟΔΟΣ ΣΑΣ", "Σ", "ΣΑ", "ΑΣΑ", "Α'Σ", "Α'Σ'", "ΑΣ'Β", "ΑΣ.", "1Σ", "aΣ\u0345",
        "x\u0345Σ", "\u0345Σ", "ΑΣ\u0345", "ΑΣ\u0345Β", "σ Σ", "ΑΣ\u00adΒ", "Ϊ́Σ",
    ]  # fmt: skip
    assert "\u039f\u03a3".lower() == "\u03bf\u03c2"  # Python writes the final sigma
    assert "\u03a3\u0391".lower() == "\u03c3\u03b1"  # and the medial one elsewhere
    _same(pair, cases)


def test_truncation_keeps_the_first_bytes_and_the_end(pair):
    ours, theirs = pair
    long = ["é" * 100, "a" + "é" * 100, "🐕" * 50, "x" * 1000]
    _same(pair, long)
    ids = theirs(long[0], truncation=True)["input_ids"]
    assert len(ids) == ours.context_length and ids[-1] == ours.eos_id


def test_random_text(pair):
    rng = random.Random(0)
    texts = []
    for _ in range(400):
        pick = rng.choice([(0x20, 0x7F), (0, 0x800), (0, 0x3100), (0, 0x110000)])
        text = "".join(chr(rng.randrange(*pick)) for _ in range(rng.randrange(0, 40)))
        texts.append(text.encode("utf-8", "ignore").decode("utf-8"))  # no lone surrogates
    _same(pair, texts)


def test_padding_and_decoding(pair):
    ours, theirs = pair
    batch = theirs(["a b", "longer text"], padding=True, truncation=True)
    assert batch["attention_mask"][0].count(1) == len(ours.encode("a b"))
    pad = len(ours.encode("longer text")) - len(ours.encode("a b"))
    assert batch["input_ids"][0][-pad:] == [ours.eos_id] * pad  # eos pads, masked
    assert theirs.decode(theirs("Héllo  WORLD")["input_ids"], skip_special_tokens=True) == (
        "héllo world"
    )


def test_the_byte_table_is_tokenizers_bytelevel_alphabet():
    table = byte_characters()
    assert sorted(table) == list(range(256)) and len(set(table.values())) == 256
    assert set(table.values()) == set(pre_tokenizers.ByteLevel.alphabet())
    assert table[ord("a")] == "a" and table[ord(" ")] == "Ġ"  # GPT-2's space
