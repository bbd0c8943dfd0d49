"""VSE-infinity's caption augmentation: training-time masking, replacement and dropping of
BERT tokens (``data.text_augment = "vse_infinity"``).

VSE-infinity (Chen et al., CVPR 2021), whose recipe GOAL's Table 5 keeps, augments every
training caption as its data loader turns the caption into BERT ids: each word of the caption
(a piece of BERT's basic tokenizer, split on spaces and punctuation) is augmented with
probability 0.2; an augmented word is, with probability 0.5, replaced by ``[MASK]`` (one per
WordPiece sub-token), with probability 0.1 replaced by random tokens (one per sub-token, each
drawn uniformly from the whole vocabulary, special tokens included, as VSE-infinity draws from
the tokenizer's vocabulary), and otherwise (0.4) removed with all its sub-tokens. ``[CLS]`` and
``[SEP]`` are added around the result and never touched. Validation and test captions are not
augmented.

Here the words are the tokenizer's own (a fast tokenizer's ``word_ids``: BERT's
pre-tokenizer splits as the basic tokenizer does), and the random numbers of caption ``index``
in ``epoch`` come from a generator keyed ``(train.seed, epoch, index)`` as the image
augmentation's (:func:`vlret.data.transforms.sample_generator`, with a fixed last part that
keeps the two streams apart), so a resumed run draws what the uninterrupted one drew, whatever
the workers and the batch order. A caption longer than the encoder's limit is cut after the
augmentation, keeping its ``[SEP]``, as the tokenizer's own truncation does.
:class:`~vlret.data.dataset.RetrievalDataset` serves training items through
:meth:`~vlret.data.dataset.RetrievalDataset.set_text_augment`.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from .transforms import sample_generator

#: The values of ``data.text_augment``.
TEXT_AUGMENTS = ("none", "vse_infinity")
#: VSE-infinity's rates: a word is augmented with :data:`AUGMENT_PROB`; an augmented word is
#: masked, replaced or dropped with these shares.
AUGMENT_PROB = 0.2
MASK_SHARE = 0.5
REPLACE_SHARE = 0.1
DROP_SHARE = 1.0 - MASK_SHARE - REPLACE_SHARE  # 0.4
#: The last part of the generator key of the caption draws (the image augmentation's keys end
#: in the caption index or an AOQ slot 1 / 2), so captions and images draw independently.
TEXT_STREAM = 0x54455854


class VSEInfinityTextAugment:
    """VSE-infinity's augmentation of a caption's BERT ids (see the module docstring).

    Args:
        encoder: The caption encoder: a :class:`~vlret.data.vocab.HFTokenizer` around a fast
            WordPiece (BERT) tokenizer with a mask token.
        prob: The probability that a word is augmented.
        mask: The share of augmented words replaced by the mask token.
        replace: The share of augmented words replaced by random tokens (the rest is dropped).

    Raises:
        ValueError: The encoder is not a BERT tokenizer, or a rate is outside [0, 1].
    """

    def __init__(
        self,
        encoder: Any,
        *,
        prob: float = AUGMENT_PROB,
        mask: float = MASK_SHARE,
        replace: float = REPLACE_SHARE,
    ) -> None:
        problem = bert_problem(encoder)
        if problem is not None:
            raise ValueError(f'"vse_infinity" needs {problem}')
        for name, value in (("prob", prob), ("mask", mask), ("replace", replace)):
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {value!r}")
        if mask + replace > 1.0:
            raise ValueError(f"mask + replace must be at most 1, got {mask} + {replace}")
        self.encoder = encoder
        self.prob, self.mask, self.replace = float(prob), float(mask), float(replace)
        tokenizer = encoder.tokenizer
        self.mask_id = int(tokenizer.mask_token_id)
        self.vocab_size = len(tokenizer)

    def plan(self, text: str) -> tuple[list[int], list[int | None]]:
        """The caption's ids with the tokenizer's special tokens, untruncated, and the word of
        each (None for ``[CLS]`` / ``[SEP]``)."""
        encoding = self.encoder.tokenizer(text)
        return list(encoding["input_ids"]), list(encoding.word_ids())

    def __call__(self, text: str, *, key: Sequence[int]) -> torch.Tensor:
        """The augmented ids of ``text`` (a long tensor) for the draw keyed ``key``."""
        ids, words = self.plan(text)
        return torch.tensor(self.apply(ids, words, self.generator(key)), dtype=torch.long)

    @staticmethod
    def generator(key: Sequence[int]) -> np.random.Generator:
        """The generator of one caption's draws: ``key`` is ``(seed, epoch, caption index)``."""
        return sample_generator((*key, TEXT_STREAM))

    def apply(
        self, ids: Sequence[int], words: Sequence[int | None], rng: np.random.Generator
    ) -> list[int]:
        """Augment ``ids`` word by word (``words``: each id's word, None for a special token)
        with ``rng``'s draws: one uniform number per word, then one random id per sub-token of
        a word replaced; then cut to the encoder's ``max_length``, keeping the special tokens
        at both ends."""
        content = [k for k, w in enumerate(words) if w is not None]
        if not content:
            return list(ids)
        head, tail = list(ids[: content[0]]), list(ids[content[-1] + 1 :])
        out: list[int] = []
        for word, run in itertools.groupby(
            range(content[0], content[-1] + 1), key=words.__getitem__
        ):
            pieces = [int(ids[k]) for k in run]
            out += pieces if word is None else self._word(pieces, rng)  # None: a special token
        limit = getattr(self.encoder, "max_length", None)
        if limit is not None:
            out = out[: max(int(limit) - len(head) - len(tail), 0)]
        return head + out + tail

    def _word(self, pieces: list[int], rng: np.random.Generator) -> list[int]:
        u = rng.random()
        if u >= self.prob:
            return pieces
        u /= self.prob
        if u < self.mask:
            return [self.mask_id] * len(pieces)
        if u < self.mask + self.replace:
            return [int(i) for i in rng.integers(0, self.vocab_size, size=len(pieces))]
        return []


def bert_problem(encoder: Any) -> str | None:
    """Why ``encoder`` cannot be augmented as VSE-infinity does (None: it can): it must be a
    Hugging Face fast tokenizer with a WordPiece model (BERT's) and a mask token."""
    tokenizer = getattr(encoder, "tokenizer", None)
    if tokenizer is None or not callable(tokenizer):
        return f"a BERT tokenizer; the captions are encoded by {type(encoder).__name__}"
    name = type(tokenizer).__name__
    backend = getattr(tokenizer, "backend_tokenizer", None)
    model = type(getattr(backend, "model", None)).__name__
    if not getattr(tokenizer, "is_fast", False) or model != "WordPiece":
        return f"a BERT (WordPiece) tokenizer; the captions are encoded by {name} ({model})"
    if getattr(tokenizer, "mask_token_id", None) is None:
        return f"a BERT tokenizer with a mask token; {name} has none"
    return None


def build_text_augment(data: Any, encoder: Any) -> VSEInfinityTextAugment | None:
    """The caption augmentation ``data.text_augment`` asks for, on the run's caption
    encoder; None for ``"none"``.

    Raises:
        ValueError: ``vse_infinity`` with an encoder that is not a BERT tokenizer, or an
            unknown value.
    """
    kind = getattr(data, "text_augment", "none")
    if kind == "none":
        return None
    if kind == "vse_infinity":
        return VSEInfinityTextAugment(encoder)
    raise ValueError(f"data.text_augment: expected one of {', '.join(TEXT_AUGMENTS)}, got {kind!r}")


__all__ = [
    "AUGMENT_PROB",
    "DROP_SHARE",
    "MASK_SHARE",
    "REPLACE_SHARE",
    "TEXT_AUGMENTS",
    "TEXT_STREAM",
    "VSEInfinityTextAugment",
    "bert_problem",
    "build_text_augment",
]
