"""vlret's byte tokenizer (:class:`~vlret.models.clip.CLIPByteTokenizer`) as a ``tokenizers``
``tokenizer.json`` that ``transformers``' ``AutoTokenizer`` loads and that gives the same ids.

:class:`~vlret.models.clip.CLIPByteTokenizer` lower-cases a caption with Python's
``str.lower``, collapses its whitespace (``" ".join(text.split())``), and writes
``[bos, byte_1, ..., byte_n, eos]`` with byte ``b`` as id ``b``, keeping the first
``context_length - 2`` bytes. :func:`byte_tokenizer_json` builds the same pipeline from the
``tokenizers`` library's parts:

* **normalizer**: the case stage, then the whitespace stage. The case stage is Python's own
  ``str.lower`` table written out: one ``Replace`` for each of the ~1,400 characters it changes
  (:func:`python_lowercase`), not ``tokenizers``' ``Lowercase`` (Rust's table follows another
  Unicode version: some 55 letters lower-case there and not in Python 3.11), preceded by the
  one rule that depends on context: a capital sigma ending a word becomes the final sigma
  (Python follows Unicode's ``Final_Sigma``, written here as an Oniguruma regex with
  look-behind and look-ahead over ``Cased`` and ``Case_Ignorable``). It costs about a
  millisecond per caption. The whitespace stage replaces every run of the characters
  Python's ``str.split`` splits on (``str.isspace``, listed explicitly: Rust's ``\\s``
  differs, e.g. on U+001C..U+001F) by one space and strips both ends.
* **pre-tokenizer**: ``ByteLevel`` without regex splitting or prefix space (every UTF-8 byte
  becomes one printable character, GPT-2's byte-to-character table);
* **model**: a ``BPE`` with no merges whose vocabulary maps the character of byte ``b`` to
  id ``b``, and ``bos`` / ``eos`` to their ids;
* **post-processor**: ``bos $A eos``, so that truncation to ``context_length`` keeps
  ``context_length - 2`` bytes and the ``eos``, as vlret does;
* **decoder**: ``ByteLevel``.

Padding uses the ``eos`` token (as OpenAI's CLIP tokenizer on the Hub does); vlret writes
``pad_id`` there. Padded positions carry attention mask 0 and lie after the ``eos`` that CLIP
pools at, behind a causal mask, so neither id changes an embedding.
"""

from __future__ import annotations

import sys
from functools import cache
from typing import Any

from ..clip import CLIPByteTokenizer

#: The special tokens' strings (OpenAI CLIP's names for its start and end of text).
BOS_TOKEN, EOS_TOKEN = "<|startoftext|>", "<|endoftext|>"
#: Python's Final_Sigma context for U+03A3 (unicodeobject.c's handle_capital_sigma): the
#: nearest character before it that is not case-ignorable is cased, and the nearest after it
#: that is not case-ignorable is not cased (or there is none).
_NOT_IGNORABLE_CASED = r"[\p{Cased}&&\P{Case_Ignorable}]"
FINAL_SIGMA = (
    rf"(?<={_NOT_IGNORABLE_CASED}\p{{Case_Ignorable}}*)\x{{3A3}}"
    rf"(?!\p{{Case_Ignorable}}*{_NOT_IGNORABLE_CASED})"
)
#: Surrogates: not characters a Python str encodes to UTF-8.
_SURROGATES = range(0xD800, 0xE000)


def byte_characters() -> dict[int, str]:
    """GPT-2's byte-to-character table (``tokenizers``' ``ByteLevel``): the printable bytes
    ``!``..``~``, U+00A1..U+00AC and U+00AE..U+00FF stand for themselves; the other 68 bytes,
    in order, for U+0100, U+0101, ..."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table: dict[int, str] = {}
    shifted = 0
    for byte in range(256):
        if byte in printable:
            table[byte] = chr(byte)
        else:
            table[byte] = chr(0x100 + shifted)
            shifted += 1
    return table


def python_whitespace() -> str:
    """Every character ``str.split()`` splits on (``str.isspace``), in code point order."""
    return "".join(chr(c) for c in range(sys.maxunicode + 1) if chr(c).isspace())


@cache
def python_lowercase() -> tuple[tuple[str, str], ...]:
    """``(character, its str.lower)`` for every character ``str.lower`` changes, out of
    context (this interpreter's Unicode table).

    Raises:
        ValueError: A mapping's result would be changed again by another (the ``Replace``
            steps would then depend on their order); Python's table has no such case.
    """
    pairs = tuple(
        (chr(c), chr(c).lower())
        for c in range(sys.maxunicode + 1)
        if c not in _SURROGATES and chr(c).lower() != chr(c)
    )
    unstable = [c for c, low in pairs if low.lower() != low]
    if unstable:
        raise ValueError(f"str.lower is not idempotent on U+{ord(unstable[0]):04X}")
    return pairs


def _case_stage() -> list[Any]:
    from tokenizers import Regex, normalizers

    steps: list[Any] = [normalizers.Replace(Regex(FINAL_SIGMA), "\u03c2")]
    return steps + [normalizers.Replace(c, low) for c, low in python_lowercase()]


def byte_tokenizer_json(tokenizer: CLIPByteTokenizer) -> Any:
    """The ``tokenizers.Tokenizer`` that encodes as ``tokenizer`` does (module docstring).

    Args:
        tokenizer: vlret's byte tokenizer (its ``bos_id``, ``eos_id`` and ``context_length``).

    Returns:
        The ``tokenizers.Tokenizer`` (``.save(path)`` writes ``tokenizer.json``), truncating
        to ``context_length`` ids.

    Raises:
        ImportError: The ``tokenizers`` package (a ``transformers`` dependency) is missing.
    """
    from tokenizers import (
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
    )

    vocab = {char: byte for byte, char in byte_characters().items()}
    vocab[BOS_TOKEN], vocab[EOS_TOKEN] = tokenizer.bos_id, tokenizer.eos_id
    out = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    spaces = "".join(f"\\x{{{ord(c):X}}}" for c in python_whitespace())
    out.normalizer = normalizers.Sequence(
        [
            *_case_stage(),
            normalizers.Replace(Regex(f"[{spaces}]+"), " "),
            normalizers.Strip(),
        ]
    )
    out.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    out.decoder = decoders.ByteLevel()
    out.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in (BOS_TOKEN, EOS_TOKEN)]
    )
    out.post_processor = processors.TemplateProcessing(
        single=f"{BOS_TOKEN} $A {EOS_TOKEN}",
        special_tokens=[(BOS_TOKEN, tokenizer.bos_id), (EOS_TOKEN, tokenizer.eos_id)],
    )
    out.enable_truncation(max_length=tokenizer.context_length)
    return out


def byte_tokenizer_for_transformers(tokenizer: CLIPByteTokenizer) -> Any:
    """``transformers.PreTrainedTokenizerFast`` around :func:`byte_tokenizer_json`, with the
    ``bos`` / ``eos`` tokens, ``eos`` as padding and ``model_max_length = context_length``
    (``save_pretrained`` writes ``tokenizer.json`` and ``tokenizer_config.json``, which
    ``AutoTokenizer`` loads).

    Raises:
        MissingExtra: ``transformers`` is not installed.
    """
    from ..._extras import require

    transformers = require("transformers", "exporting a byte-tokenized CLIP")
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=byte_tokenizer_json(tokenizer),
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        pad_token=EOS_TOKEN,
        model_max_length=tokenizer.context_length,
    )


__all__ = [
    "BOS_TOKEN",
    "EOS_TOKEN",
    "FINAL_SIGMA",
    "byte_characters",
    "byte_tokenizer_for_transformers",
    "byte_tokenizer_json",
    "python_lowercase",
    "python_whitespace",
]
