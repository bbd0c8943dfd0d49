"""A tiny random Hugging Face BERT folder, written by ``transformers``' own ``save_pretrained``
(model and WordPiece tokenizer), for the tests of BERT text sides."""

from __future__ import annotations

from pathlib import Path

import torch

#: The special tokens (ids 0..4, as in BERT's vocabularies) and a few words.
BERT_WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "man", "dog", "red", "runs", "."]


def write_tiny_bert(
    path: Path, *, hidden: int = 12, layers: int = 1, intermediate: int = 20, seed: int = 5
) -> Path:
    """Write a random ``BertModel`` (2 heads, 40 positions) and its tokenizer over
    :data:`BERT_WORDS` into ``path``; returns ``path``."""
    import transformers

    vocab = path / "vocab.txt"
    vocab.write_text("\n".join(BERT_WORDS) + "\n", encoding="utf-8")
    transformers.BertTokenizer(str(vocab)).save_pretrained(str(path))
    config = transformers.BertConfig(
        vocab_size=len(BERT_WORDS),
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=2,
        intermediate_size=intermediate,
        max_position_embeddings=40,
    )
    torch.manual_seed(seed)
    transformers.BertModel(config).save_pretrained(str(path))
    return path
