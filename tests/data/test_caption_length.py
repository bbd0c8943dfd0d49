"""``data.max_caption_tokens``: every caption a run encodes keeps its first N tokens besides its
start / end tokens: vlret's vocabulary, a BERT and a CLIP tokenizer, the trainer's splits and a
checkpoint's evaluation encoder."""

from __future__ import annotations

from pathlib import Path

import pytest

from clip_folder_helpers import tiny_clip_parts
from train_helpers import tiny_data, tiny_raw
from vlret.data import build_vocab, load_hf_tokenizer
from vlret.data.caption_length import cap_caption_tokens
from vlret.models.clip import CLIPByteTokenizer
from vlret.run.builders import load_trained_model
from vlret.run.config import ConfigError, config_from_dict
from vlret.train import Trainer

transformers = pytest.importorskip("transformers")
TEXTS = ["a man rides a brown horse on the beach", "two dogs run", "", "one"]


def test_the_vocabulary_keeps_the_first_words_inside_start_and_end():
    vocab = build_vocab(TEXTS, min_count=1)
    full = {t: vocab.encode(t) for t in TEXTS}
    assert cap_caption_tokens(vocab, None) is vocab and vocab.max_tokens is None
    assert cap_caption_tokens(vocab, 3) is vocab
    for text in TEXTS:
        words = full[text][1:-1]
        assert vocab.encode(text) == [vocab.start_id, *words[:3], vocab.end_id]
        assert vocab.encode(text, add_special=False) == words[:3]
    assert len(vocab.encode(TEXTS[0])) == 5 and vocab.encode("two dogs run") == full["two dogs run"]


def test_a_bert_tokenizer_truncates_to_n_plus_its_special_tokens(tmp_path):
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "horse", "##man", "a", "man", "the"]
    (tmp_path / "vocab.txt").write_text("\n".join(words) + "\n", encoding="utf-8")
    transformers.BertTokenizer(str(tmp_path / "vocab.txt")).save_pretrained(str(tmp_path))
    tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path), local_files_only=True)
    encoder = cap_caption_tokens(load_hf_tokenizer(tmp_path), 3)
    text = "a horseman the man a man"
    ids = encoder.encode(text)
    full = tok(text)["input_ids"]
    assert ids == [*full[:4], full[-1]]  # [CLS] a horse ##man [SEP]: pieces count as tokens
    assert tok.convert_ids_to_tokens(ids) == ["[CLS]", "a", "horse", "##man", "[SEP]"]
    # a shorter existing limit (the text model's positions) is kept
    short = cap_caption_tokens(load_hf_tokenizer(tmp_path, max_positions=4), 30)
    assert short.max_length == 4 and len(short.encode(text)) == 4


def test_a_clip_tokenizer_and_the_byte_level_stand_in(tmp_path):
    (tmp_path / "clip").mkdir()
    _, tokenizer, _ = tiny_clip_parts(tmp_path / "clip")
    tokenizer.save_pretrained(str(tmp_path / "tok"))
    encoder = cap_caption_tokens(load_hf_tokenizer(tmp_path / "tok"), 2)
    long = "a photo of a cat on a mat " * 3
    ids = encoder.encode(long)
    full = load_hf_tokenizer(tmp_path / "tok").encode(long)
    assert len(full) > 4 and ids == [*full[:3], full[-1]]  # start, 2 tokens, end
    with pytest.raises(ValueError, match="CLIPByteTokenizer caption encoder cannot cut"):
        cap_caption_tokens(CLIPByteTokenizer(bos_id=256, eos_id=257), 32)
    with pytest.raises(ValueError, match="positive number of tokens, got 0"):
        cap_caption_tokens(encoder, 0)


def test_the_trainer_and_a_checkpoint_encode_captions_capped(tmp_path):
    data = tiny_data(tmp_path / "data")
    raw = tiny_raw(data, tmp_path / "run")
    raw["data"]["max_caption_tokens"] = 1
    raw["train"]["epochs"] = 1
    trainer = Trainer(config_from_dict(raw), print_fn=None)
    for split in (trainer.train_set, trainer.dev_set):
        lengths = [len(split[i].caption) for i in range(len(split))]
        assert max(lengths) == 3  # <start> one word <end>
        assert [len(c) for c, _ in split.texts()] == lengths
    plain = {**raw, "output_dir": str(tmp_path / "u"), "data": {**raw["data"]}}
    del plain["data"]["max_caption_tokens"]
    uncapped = Trainer(config_from_dict(plain), print_fn=None)
    assert max(len(c) for c, _ in uncapped.train_set.texts()) > 3  # the data's are longer
    uncapped.close()
    trainer.fit()
    trainer.close()
    _, run, encoder = load_trained_model(Path(raw["output_dir"]) / "last.pt")
    assert run.data.max_caption_tokens == 1 and encoder.max_tokens == 1
    assert len(encoder.encode("a b c d e f")) == 3


def test_a_byte_level_clip_encoder_is_refused_in_one_line(tmp_path, monkeypatch):
    import vlret.train.trainer as trainer_module

    data = tiny_data(tmp_path / "data")
    raw = tiny_raw(data, tmp_path / "run")
    raw["data"]["max_caption_tokens"] = 32
    stand_in = CLIPByteTokenizer(bos_id=256, eos_id=257)
    monkeypatch.setattr(trainer_module, "build_encoder", lambda *a, **k: stand_in)
    with pytest.raises(ConfigError, match=r"data\.max_caption_tokens: the CLIPByteTokenizer"):
        Trainer(config_from_dict(raw), print_fn=None, check=True)
