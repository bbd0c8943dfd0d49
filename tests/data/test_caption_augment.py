"""VSE-infinity's caption augmentation (``data.text_augment = "vse_infinity"``): the rates over
many seeded captions within binomial bounds, whole words (all their WordPiece pieces) treated
together, ``[CLS]`` / ``[SEP]`` never touched, the same key the same draw, a naive per-word
oracle written from VSE-infinity's rule, evaluation captions never augmented, and the refusals.
"""

from __future__ import annotations

import math
import pickle
from pathlib import Path

import pytest

from clip_folder_helpers import tiny_clip_parts
from train_helpers import tiny_data, tiny_raw
from vlret.data import load_hf_tokenizer
from vlret.data.caption_augment import (
    AUGMENT_PROB,
    DROP_SHARE,
    MASK_SHARE,
    REPLACE_SHARE,
    VSEInfinityTextAugment,
    build_text_augment,
)
from vlret.data.formats import open_dataset
from vlret.data.vocab import Vocabulary
from vlret.run.config import ConfigError, config_from_dict
from vlret.train import Trainer

transformers = pytest.importorskip("transformers")

SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = [f"w{k}" for k in range(40)]
PIECES = ["horse", "##man", "##ship", "sea", "##side"]
FILLER = [f"zz{k:04d}" for k in range(4000)]  # a large vocabulary: random ids rarely hit a word


@pytest.fixture(scope="module")
def bert_tokenizer(tmp_path_factory) -> Path:
    """A BERT tokenizer as ``BertTokenizer.save_pretrained`` writes it, with WordPiece pieces."""
    folder = tmp_path_factory.mktemp("bert_tok")
    vocab = folder / "vocab.txt"
    vocab.write_text("\n".join([*SPECIAL, *WORDS, *PIECES, ".", *FILLER]) + "\n", encoding="utf-8")
    transformers.BertTokenizer(str(vocab), do_lower_case=True).save_pretrained(str(folder))
    return folder


@pytest.fixture(scope="module")
def augment(bert_tokenizer) -> VSEInfinityTextAugment:
    return VSEInfinityTextAugment(load_hf_tokenizer(bert_tokenizer))


def captions(n: int, words: int = 10) -> list[str]:
    return [" ".join(WORDS[(7 * i + j) % len(WORDS)] for j in range(words)) for i in range(n)]


def within(count: int, n: int, p: float, sds: float = 5.0) -> bool:
    return abs(count - n * p) <= sds * math.sqrt(n * p * (1 - p))


def test_the_rates_are_vse_infinitys():
    assert (AUGMENT_PROB, MASK_SHARE, REPLACE_SHARE) == (0.2, 0.5, 0.1)
    assert DROP_SHARE == pytest.approx(0.4)


def test_masked_replaced_and_dropped_words_within_binomial_bounds(augment):
    enc = augment.encoder.tokenizer
    cls, sep, mask = enc.cls_token_id, enc.sep_token_id, enc.mask_token_id
    texts = captions(2500)  # 25000 words, each a single token, no word twice in a caption
    n = masked = replaced = dropped = 0
    for index, text in enumerate(texts):
        plain = augment.encoder.encode(text)
        out = augment(text, key=(3, 1, index)).tolist()
        assert out[0] == cls and out[-1] == sep  # the special tokens stay where they are
        content, words = out[1:-1], set(plain[1:-1])
        n += len(plain) - 2
        dropped += len(plain) - len(out)  # one token per word: each drop shortens by one
        masked += sum(t == mask for t in content)
        replaced += sum(t != mask and t not in words for t in content)
    assert n == 25000
    assert within(masked, n, AUGMENT_PROB * MASK_SHARE), masked
    assert within(replaced, n, AUGMENT_PROB * REPLACE_SHARE), replaced
    assert within(dropped, n, AUGMENT_PROB * DROP_SHARE), dropped
    # and not the other readings: all pieces of 15% (BERT's MLM) or a per-piece 20%
    assert not within(masked, n, 0.15 * 0.8)


def test_a_word_of_several_pieces_is_augmented_whole(augment):
    enc = augment.encoder.tokenizer
    mask = enc.mask_token_id
    plain = augment.encoder.encode("horsemanship")
    pieces = plain[1:-1]
    assert enc.convert_ids_to_tokens(pieces) == ["horse", "##man", "##ship"]
    outcomes = {"keep": 0, "mask": 0, "replace": 0, "drop": 0}
    for index in range(5000):
        out = augment("horsemanship", key=(0, 0, index)).tolist()
        assert out[0] == plain[0] and out[-1] == plain[-1]
        content = out[1:-1]
        if content == pieces:
            outcomes["keep"] += 1
        elif content == [mask] * 3:
            outcomes["mask"] += 1
        elif content == []:
            outcomes["drop"] += 1
        else:  # three random pieces, never part of the word kept or masked
            assert len(content) == 3 and not set(content) & {*pieces, mask}, content
            outcomes["replace"] += 1
    assert within(outcomes["mask"], 5000, 0.1) and within(outcomes["drop"], 5000, 0.08)
    assert within(outcomes["replace"], 5000, 0.02)
    # words of 3, 2 and 2 pieces: a length that no whole-word outcome gives never appears
    text = "horsemanship seaside horseman"
    lengths = {len(augment(text, key=(1, 0, i))) - 2 for i in range(3000)}
    assert lengths == {0, 2, 3, 4, 5, 7}


def naive(augment: VSEInfinityTextAugment, text: str, key) -> list[int]:
    """VSE-infinity's rule written per word of BERT's basic tokenizer, from the same draws:
    one uniform number per word; below 0.2 it is rescaled and picks mask (< 0.5), random
    pieces (< 0.6) or removal."""
    tok = augment.encoder.tokenizer
    rng = augment.generator(key)
    out: list[int] = []
    for word in transformers.BasicTokenizer(do_lower_case=True).tokenize(text):
        pieces = tok.convert_tokens_to_ids(tok.tokenize(word))
        u = rng.random()
        if u >= 0.2:
            out += pieces
        elif u / 0.2 < 0.5:
            out += [tok.mask_token_id] * len(pieces)
        elif u / 0.2 < 0.6:
            out += rng.integers(0, len(tok), size=len(pieces)).tolist()
    return [tok.cls_token_id, *out, tok.sep_token_id]


def test_equals_a_naive_per_word_implementation(augment):
    texts = ["A horseman, on the seaside. w1 w2!", *captions(300, 7), "horsemanship"]
    for index, text in enumerate(texts):
        for epoch in (0, 5):
            key = (11, epoch, index)
            assert augment(text, key=key).tolist() == naive(augment, text, key)


def test_same_key_same_output_and_keys_differ(augment):
    text = captions(1, 12)[0]
    a = [augment(text, key=(0, 2, 7)).tolist() for _ in range(3)]
    assert a[0] == a[1] == a[2]
    again = pickle.loads(pickle.dumps(augment))  # a DataLoader worker's copy
    assert again(text, key=(0, 2, 7)).tolist() == a[0]
    others = {tuple(augment(text, key=k).tolist()) for k in [(1, 2, 7), (0, 3, 7), (0, 2, 8)]}
    others.add(tuple(a[0]))
    assert len(others) > 2


def test_truncation_keeps_sep_and_matches_the_encoder(bert_tokenizer):
    encoder = load_hf_tokenizer(bert_tokenizer, max_length=6)
    aug = VSEInfinityTextAugment(encoder, prob=0.0)  # nothing augmented: the encoder's own ids
    for text in captions(20, 9):
        assert aug(text, key=(0, 0, 0)).tolist() == encoder.encode(text)
    dropping = VSEInfinityTextAugment(encoder, prob=1.0, mask=0.0, replace=0.0)
    assert dropping(captions(1)[0], key=(0, 0, 0)).tolist() == encoder.encode("")
    masking = VSEInfinityTextAugment(encoder, prob=1.0, mask=1.0, replace=0.0)
    tok = encoder.tokenizer
    assert masking("w1 w2 w3 w4 w5 w6", key=(0, 0, 0)).tolist() == [
        tok.cls_token_id,
        *[tok.mask_token_id] * 4,
        tok.sep_token_id,
    ]


def test_training_items_are_augmented_and_evaluation_captions_never(tmp_path, bert_tokenizer):
    data = tiny_data(tmp_path / "data")
    encoder = load_hf_tokenizer(bert_tokenizer)
    raw = tiny_raw(data, tmp_path / "run")
    raw["data"].update(tokenizer=str(bert_tokenizer), text_augment="vse_infinity")
    config = config_from_dict(raw)
    train = open_dataset(config.data, "train", encoder=encoder)
    train.set_text_augment(build_text_augment(config.data, encoder), seed=4)
    train.captions = captions(len(train.captions), 10)  # long captions: every item draws
    plain = [train.caption(i).tolist() for i in range(len(train))]
    items = [train[i].caption.tolist() for i in range(len(train))]
    assert items != plain and sum(a == b for a, b in zip(items, plain, strict=True)) > 0
    assert [c.tolist() for c, _ in train.texts()] == plain  # the evaluation view: never
    train.set_epoch(1)
    assert [train[i].caption.tolist() for i in range(len(train))] != items
    resumed = open_dataset(config.data, "train", encoder=encoder)  # a resumed run's fresh set
    resumed.captions = train.captions
    resumed.set_text_augment(build_text_augment(config.data, encoder), seed=4)
    resumed.set_epoch(1)
    assert [resumed[i].caption.tolist() for i in range(len(train))] == [
        train[i].caption.tolist() for i in range(len(train))
    ]
    plain_config = config_from_dict(tiny_raw(data, tmp_path / "r"))  # text_augment "none"
    assert build_text_augment(plain_config.data, encoder) is None


def test_the_trainer_augments_the_training_split_only(tmp_path, bert_tokenizer):
    data = tiny_data(tmp_path / "data")
    raw = tiny_raw(data, tmp_path / "run")
    raw["data"].update(tokenizer=str(bert_tokenizer), text_augment="vse_infinity")
    size = len([*SPECIAL, *WORDS, *PIECES, ".", *FILLER])
    raw["model"]["text"] = {"kind": "gru", "word_dim": 8, "pooling": "last", "vocab_size": size}
    trainer = Trainer(config_from_dict(raw), print_fn=None, check=True)
    assert isinstance(trainer.train_set.text_augment, VSEInfinityTextAugment)
    assert trainer.dev_set is not None and trainer.dev_set.text_augment is None


def test_a_non_bert_tokenizer_is_refused_in_one_line(tmp_path):
    data = tiny_data(tmp_path / "data")
    raw = tiny_raw(data, tmp_path / "run")
    raw["data"]["text_augment"] = "vse_infinity"  # the GRU's vlret vocabulary
    with pytest.raises(ConfigError, match=r'data\.text_augment: "vse_infinity" needs a BERT'):
        Trainer(config_from_dict(raw), print_fn=None, check=True)
    with pytest.raises(ValueError, match="encoded by Vocabulary"):
        VSEInfinityTextAugment(Vocabulary(["<pad>", "<start>", "<end>", "<unk>", "a"]))
    (tmp_path / "clip").mkdir()
    _, clip_tokenizer, _ = tiny_clip_parts(tmp_path / "clip")
    clip_tokenizer.save_pretrained(str(tmp_path / "clip_tok"))
    with pytest.raises(ValueError, match=r"WordPiece\) tokenizer; the captions are encoded by CLI"):
        VSEInfinityTextAugment(load_hf_tokenizer(tmp_path / "clip_tok"))
    with pytest.raises(ConfigError, match="data.text_augment: expected one of none, vse_infinity"):
        config_from_dict({**raw, "data": {**raw["data"], "text_augment": "eda"}})
