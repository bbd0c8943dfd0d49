"""The caption length cap ``data.max_caption_tokens``: every caption a run encodes, in training
and evaluation, keeps at most N tokens besides its start / end tokens (AdaCL's image-text
matching caps a sentence at 32 words).

The cap is set on the run's caption encoder (:func:`cap_caption_tokens`), so every path that
encodes a caption with it (the datasets, the streamed formats, a checkpoint's evaluation, whose
encoder is capped again from its stored ``[data]`` section) cuts it the same way: vlret's
:class:`~vlret.data.vocab.Vocabulary` keeps the first N words before wrapping them in
``<start>`` ... ``<end>``; a Hugging Face tokenizer (:class:`~vlret.data.vocab.HFTokenizer`)
truncates to N plus its own special tokens (``[CLS]`` / ``[SEP]``, CLIP's start / end), or to
its existing limit (the text model's positions) where that is shorter. Other encoders (CLIP's
byte-level stand-in) are refused.
"""

from __future__ import annotations

from typing import Any

from .vocab import HFTokenizer, Vocabulary


def cap_caption_tokens(encoder: Any, max_tokens: int | None) -> Any:
    """``encoder`` set to cut captions to ``max_tokens`` tokens besides its start / end tokens
    (changed in place and returned); None leaves it as it is.

    Args:
        encoder: The run's caption encoder.
        max_tokens: ``data.max_caption_tokens``.

    Returns:
        ``encoder``.

    Raises:
        ValueError: ``max_tokens`` is not a positive int, or the encoder cannot cut captions.
    """
    if max_tokens is None:
        return encoder
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise ValueError(f"expected a positive number of tokens, got {max_tokens!r}")
    if isinstance(encoder, Vocabulary):
        encoder.max_tokens = max_tokens
        return encoder
    if isinstance(encoder, HFTokenizer):
        specials = len(encoder.tokenizer("")["input_ids"])  # [CLS] [SEP], CLIP's start / end
        limit = max_tokens + specials
        current = encoder.max_length
        encoder.max_length = limit if current is None else min(int(current), limit)
        return encoder
    raise ValueError(
        f"the {type(encoder).__name__} caption encoder cannot cut captions (a vlret vocabulary "
        "or a Hugging Face tokenizer can)"
    )


__all__ = ["cap_caption_tokens"]
