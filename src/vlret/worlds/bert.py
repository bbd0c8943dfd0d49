"""A small randomly initialised BERT for a synthetic world's captions (``vlret synth ...
--random-bert``): MMT's text side is a local Hugging Face BERT, and no pretrained weights can
be had offline, so the synthetic MMT runs train one from scratch on the world's lexicon.

The folder holds what ``BertModel.from_pretrained`` and the tokenizer loader read
(``config.json``, the weights, ``vocab.txt`` and the tokenizer files); its vocabulary is the
special tokens plus every word BERT's own basic tokenizer (lower-cased) finds in the captions,
so no caption word is ``[UNK]``.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

SPECIAL = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


def write_random_bert(
    out_dir: str | Path,
    captions: Iterable[str],
    *,
    hidden: int = 64,
    layers: int = 2,
    heads: int = 2,
    intermediate: int = 128,
    max_positions: int = 64,
    seed: int = 0,
) -> Path:
    """Write a randomly initialised ``BertModel`` and its WordPiece tokenizer to ``out_dir``.

    Args:
        out_dir: The folder (created; an existing ``config.json`` there is refused).
        captions: The texts whose words make the vocabulary.
        hidden: ``hidden_size``; a multiple of ``heads``.
        layers: ``num_hidden_layers``.
        heads: ``num_attention_heads``.
        intermediate: ``intermediate_size``.
        max_positions: ``max_position_embeddings`` (the longest caption in tokens, with
            ``[CLS]`` and ``[SEP]``, must fit).
        seed: Seed of the weights.

    Returns:
        ``out_dir``.

    Raises:
        ImportError: ``transformers`` is not installed (the message names ``vlret[hf]``).
        FileExistsError: ``out_dir`` already holds a model.
        ValueError: Bad sizes, no captions, or a caption longer than ``max_positions``.
    """
    import torch

    from .._extras import require

    for name, value in (("hidden", hidden), ("layers", layers), ("heads", heads)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if hidden % heads:
        raise ValueError(f"hidden ({hidden}) must be a multiple of heads ({heads})")
    transformers = require("transformers", "write_random_bert")
    out = Path(out_dir)
    if (out / "config.json").exists():
        raise FileExistsError(f"{out}: already holds a model (config.json)")
    basic = transformers.BasicTokenizer(do_lower_case=True)
    words: dict[str, None] = {}
    longest = 0
    for text in captions:
        tokens = basic.tokenize(text)
        longest = max(longest, len(tokens))
        words.update(dict.fromkeys(tokens))
    if not words:
        raise ValueError("captions: no words to build a vocabulary from")
    if longest + 2 > max_positions:
        raise ValueError(
            f"max_positions ({max_positions}) is shorter than the longest caption "
            f"({longest} words + [CLS] + [SEP])"
        )
    out.mkdir(parents=True, exist_ok=True)
    vocab = out / "vocab.txt"
    vocab.write_text("\n".join([*SPECIAL, *sorted(words)]) + "\n", encoding="utf-8")
    transformers.BertTokenizer(str(vocab), do_lower_case=True).save_pretrained(str(out))
    config = transformers.BertConfig(
        vocab_size=len(SPECIAL) + len(words),
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=intermediate,
        max_position_embeddings=max_positions,
    )
    state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        # no pooler: vlret's BERT encoders never load it (every parameter gets a gradient)
        transformers.BertModel(config, add_pooling_layer=False).save_pretrained(str(out))
    finally:
        torch.random.set_rng_state(state)
    return out


__all__ = ["write_random_bert"]
