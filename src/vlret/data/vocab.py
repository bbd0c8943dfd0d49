"""Offline tokenisation: a word tokeniser with a JSON vocabulary, or a local HF tokenizer.

Nothing here downloads anything. A :class:`Vocabulary` tokenises with one of two word
tokenisers, named by its ``tokenizer`` (kept in its JSON and in checkpoints):

- ``"vlret"`` (default, no dependency): a regular expression. Lower-cased words (hyphenated
  words kept whole, e.g. ``t-shirt``), English clitics split off (``man's`` -> ``man``,
  ``'s``) and every punctuation mark a token of its own. On pre-tokenised precomp captions it
  gives NLTK's tokens, except where the Treebank rules differ: ``don't`` -> ``don ' t`` here,
  ``do n't`` in NLTK; ``"`` -> ``` `` ``` / ``''``; ``cannot`` -> ``can not``; ``3.5``,
  ``1,000``, ``10:30`` and ``mrs.`` kept whole; only a caption's final period split off.
- ``"nltk"`` (optional package ``nltk``, ``pip install 'vlret[nltk]'``): the tokenisation of
  the VSE lineage's reference code (SCAN, Lee et al. ECCV 2018, ``data.py``; BFAN, SGRAF),
  ``nltk.tokenize.word_tokenize(caption.lower())``, for their released vocabularies
  (:func:`nltk_tokenize`).

The vocabulary JSON is the VSE-infinity layout ``{"word2idx": {...}, "idx2word": {"0":
"<pad>", ...}, "idx": N}`` with ``<pad>``=0, ``<start>``=1, ``<end>``=2, ``<unk>``=3, plus
``"tokenizer": "nltk"`` for an NLTK vocabulary (a file without the key is ``"vlret"``). It is
built from train + dev captions only, keeping words seen at least 4 times (one public
vocabulary also counted the test captions, a leak; the builders here refuse test splits).
"""

from __future__ import annotations

import functools
import importlib
import json
import re
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from .._files import atomic_write_text
from .checks import DataFormatError, read_json

PAD, START, END, UNK = "<pad>", "<start>", "<end>", "<unk>"
SPECIAL_TOKENS = (PAD, START, END, UNK)
DEFAULT_MIN_COUNT = 4

_TOKEN = re.compile(r"'(?:s|re|ve|ll|d|m|t)\b|\w+(?:-\w+)*|[^\w\s]")


def tokenize(text: str) -> list[str]:
    """The ``"vlret"`` word tokeniser (the module docstring gives its rules).

    Args:
        text: A caption.

    Returns:
        Its lower-cased tokens: ``"A man's T-shirt, red."`` -> ``a man 's t-shirt , red .``.
    """
    return _TOKEN.findall(text.lower())


def nltk_tokenize(text: str) -> list[str]:
    """The ``"nltk"`` word tokeniser: ``nltk.tokenize.word_tokenize(text.lower())``, the
    reference code's tokens.

    ``word_tokenize`` splits sentences with NLTK's Punkt model, then applies the Treebank
    rules (``NLTKWordTokenizer``) to each sentence. The Punkt model is a data file
    (``punkt_tab``) that is not part of the ``nltk`` package. With it installed this is
    ``word_tokenize`` exactly; without it the sentences come from Punkt with no trained
    parameters (``PunktSentenceTokenizer()``, which needs no data). On lower-cased text the
    two split alike except after the English model's known abbreviations and collocations:
    ``"mr. smith. a dog"`` is ``mr. smith . a dog`` with the model, ``mr . smith . a dog``
    without. (``word_tokenize(text, preserve_line=True)``, no sentence splitting, would instead
    keep every mid-caption sentence end on its word: ``"a stove. a sink."`` -> ``stove.``.)

    Args:
        text: A caption.

    Returns:
        Its tokens.

    Raises:
        ImportError: The ``nltk`` package is not installed (the message names the install).
    """
    return _nltk_tokenizer()(text)


def _nltk_tokenizer() -> Callable[[str], list[str]]:
    try:
        nltk = importlib.import_module("nltk")
    except ImportError:
        raise ImportError(
            "tokenizer='nltk' needs the optional package 'nltk' (pip install nltk, or pip "
            "install 'vlret[nltk]'); tokenizer='vlret' needs nothing"
        ) from None
    return _nltk_pipeline(nltk)


@functools.cache
def _nltk_pipeline(nltk: Any) -> Callable[[str], list[str]]:
    """``word_tokenize`` if the Punkt data is installed, else the data-free equivalent."""
    try:
        nltk.tokenize.sent_tokenize("a.")
    except LookupError:
        sentences = nltk.tokenize.punkt.PunktSentenceTokenizer().tokenize
        words = nltk.tokenize.NLTKWordTokenizer().tokenize
        return lambda text: [w for s in sentences(text.lower()) for w in words(s)]
    return lambda text: nltk.tokenize.word_tokenize(text.lower())


TOKENIZERS = ("vlret", "nltk")


def word_tokenizer(name: str) -> Callable[[str], list[str]]:
    """Look up a word tokeniser by name.

    Args:
        name: ``"vlret"`` (:func:`tokenize`) or ``"nltk"`` (:func:`nltk_tokenize`).

    Returns:
        The tokeniser, a module-level function (a vocabulary holding it stays picklable).

    Raises:
        ValueError: Another name.
        ImportError: ``"nltk"`` without the ``nltk`` package (raised here, not at the first
            caption).
    """
    if name == "vlret":
        return tokenize
    if name == "nltk":
        _nltk_tokenizer()  # ImportError now, not at the first caption
        return nltk_tokenize  # a module function: a Vocabulary stays picklable (DataLoader)
    raise ValueError(f"tokenizer must be one of {TOKENIZERS}, got {name!r}")


#: Splits whose captions may build a vocabulary (never a test split).
VOCAB_SPLITS = ("train", "dev")


def check_vocab_splits(splits: Sequence[str]) -> None:
    """Refuse test splits: a vocabulary counted over test captions leaks them into training.

    Args:
        splits: The split names a vocabulary would be counted over.

    Raises:
        ValueError: A split outside ``VOCAB_SPLITS`` (``train`` and ``dev``).
    """
    bad = [s for s in splits if s not in VOCAB_SPLITS]
    if bad:
        raise ValueError(
            f"a vocabulary is built from the train and dev splits only {VOCAB_SPLITS}, got {bad}"
        )


class Vocabulary:
    """Word <-> index map whose first four entries are ``<pad> <start> <end> <unk>``.

    :meth:`encode` tokenises, maps unknown words to ``<unk>`` and wraps the ids in ``<start>``
    ... ``<end>``: a :class:`vlret.data.dataset.CaptionEncoder`. Two vocabularies are equal
    when their words and tokenisers are.

    Args:
        idx2word: The words in index order, starting with ``SPECIAL_TOKENS``.
        tokenizer: ``"vlret"`` or ``"nltk"`` (the module docstring).

    Raises:
        ValueError: ``idx2word`` does not start with the special tokens or repeats a word, or
            an unknown ``tokenizer``.
        ImportError: ``tokenizer="nltk"`` without the ``nltk`` package.
    """

    def __init__(self, idx2word: Sequence[str], *, tokenizer: str = "vlret"):
        words = list(idx2word)
        if tuple(words[:4]) != SPECIAL_TOKENS:
            raise ValueError(f"idx2word must start with {SPECIAL_TOKENS}, got {words[:4]}")
        word2idx: dict[str, int] = {}
        for i, w in enumerate(words):
            if w in word2idx:
                raise ValueError(f"idx2word repeats {w!r} at indices {word2idx[w]} and {i}")
            word2idx[w] = i
        self._tokenize = word_tokenizer(tokenizer)
        self.idx2word = words
        self.word2idx = word2idx
        self.tokenizer = tokenizer

    pad_id = 0
    start_id = 1
    end_id = 2
    unk_id = 3
    #: :meth:`encode` keeps the first N words of a caption (``data.max_caption_tokens``,
    #: :func:`vlret.data.caption_length.cap_caption_tokens`); None: all.
    max_tokens: int | None = None

    def __len__(self) -> int:
        return len(self.idx2word)

    def __contains__(self, word: object) -> bool:
        return word in self.word2idx

    def __call__(self, word: str) -> int:
        return self.word2idx.get(word, self.unk_id)

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Vocabulary)
            and self.idx2word == other.idx2word
            and self.tokenizer == other.tokenizer
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        shown = "" if self.tokenizer == "vlret" else f", tokenizer={self.tokenizer!r}"
        return f"Vocabulary({len(self)} words{shown})"

    def encode(self, text: str, *, add_special: bool = True) -> list[int]:
        """Token ids of a caption.

        Args:
            text: The caption.
            add_special: Wrap the ids in ``<start>`` ... ``<end>``.

        Returns:
            One id per token, ``<unk>`` for a word not in the vocabulary (the first
            :attr:`max_tokens` tokens where that is set).
        """
        ids = [self.word2idx.get(w, self.unk_id) for w in self._tokenize(text)]
        if self.max_tokens is not None:
            ids = ids[: self.max_tokens]
        return [self.start_id, *ids, self.end_id] if add_special else ids

    def decode(self, ids: Iterable[int], *, skip_special: bool = True) -> str:
        """The words of some ids, joined by spaces.

        Args:
            ids: Token ids (anything ``int()`` accepts, such as a tensor's elements).
            skip_special: Drop ``<pad>``, ``<start>`` and ``<end>`` (``<unk>`` is kept).

        Returns:
            The text.

        Raises:
            IndexError: An id past the vocabulary.
        """
        words = [self.idx2word[int(i)] for i in ids]
        if skip_special:
            words = [w for w in words if w not in SPECIAL_TOKENS or w == UNK]
        return " ".join(words)

    def to_json(self) -> dict[str, Any]:
        """The vocabulary as a JSON-ready dict.

        Returns:
            The VSE-infinity layout: ``word2idx``, ``idx2word`` (string keys), ``idx``; plus
            ``tokenizer`` unless it is the default ``"vlret"``.
        """
        data: dict[str, Any] = {
            "word2idx": dict(self.word2idx),
            "idx2word": {str(i): w for i, w in enumerate(self.idx2word)},
            "idx": len(self.idx2word),
        }
        if self.tokenizer != "vlret":
            data["tokenizer"] = self.tokenizer
        return data

    def save(self, path: str | Path) -> Path:
        """Write :meth:`to_json` atomically (:func:`vlret._files.atomic_write_text`).

        Args:
            path: The JSON file; missing parent folders are created.

        Returns:
            ``path``.
        """
        return atomic_write_text(path, json.dumps(self.to_json(), ensure_ascii=False))

    @classmethod
    def load(cls, path: str | Path) -> Vocabulary:
        """Read and validate a vocabulary JSON.

        A file without ``"tokenizer"`` (any VSE-infinity vocabulary) tokenises with ``"vlret"``.

        Args:
            path: The JSON file.

        Returns:
            The vocabulary.

        Raises:
            FileNotFoundError: The file is missing.
            DataFormatError: Not JSON of the VSE-infinity layout, ``word2idx`` and ``idx2word``
                disagree, or the words are not a valid :class:`Vocabulary` (the message names
                the file and the problem).
            ImportError: A ``"nltk"`` vocabulary without the ``nltk`` package.
        """
        path = Path(path)
        data = read_json(path, 'a vocabulary {"word2idx": ..., "idx2word": ..., "idx": N}')
        expected = 'expected {"word2idx": {word: index}, "idx2word": {"index": word}, "idx": N}'
        if not isinstance(data, dict) or not {"word2idx", "idx2word", "idx"} <= data.keys():
            keys = sorted(data) if isinstance(data, dict) else type(data).__name__
            raise DataFormatError(path, f"top level is {keys}; {expected}")
        w2i, i2w, n = data["word2idx"], data["idx2word"], data["idx"]
        if not isinstance(w2i, dict) or not isinstance(i2w, dict) or not isinstance(n, int):
            raise DataFormatError(path, f"wrong value types; {expected}")
        if len(i2w) != n or len(w2i) != n:
            raise DataFormatError(
                path, f"idx is {n} but idx2word has {len(i2w)} and word2idx {len(w2i)} entries"
            )
        words = []
        for i in range(n):
            word = i2w.get(str(i))
            if not isinstance(word, str):
                raise DataFormatError(
                    path, f'idx2word has no word for "{i}"; expected keys 0..{n - 1}'
                )
            if w2i.get(word) != i:
                raise DataFormatError(
                    path, f"word2idx[{word!r}] is {w2i.get(word)!r}, idx2word says {i}"
                )
            words.append(word)
        try:
            return cls(words, tokenizer=data.get("tokenizer", "vlret"))
        except ValueError as err:
            raise DataFormatError(path, str(err)) from None


def build_vocab(
    captions: Iterable[str],
    *,
    min_count: int = DEFAULT_MIN_COUNT,
    tokenizer: str = "vlret",
) -> Vocabulary:
    """Build a vocabulary of the words seen at least ``min_count`` times.

    Pass train + dev captions only, never test captions.

    Args:
        captions: The captions to count.
        min_count: The least number of occurrences a kept word has.
        tokenizer: ``"vlret"`` or ``"nltk"``.

    Returns:
        The special tokens, then the kept words most frequent first (ties alphabetical).

    Raises:
        ValueError: ``min_count`` is not a positive int, or an unknown ``tokenizer``.
        ImportError: ``tokenizer="nltk"`` without the ``nltk`` package.
    """
    if not isinstance(min_count, int) or min_count < 1:
        raise ValueError(f"min_count must be a positive int, got {min_count!r}")
    split = word_tokenizer(tokenizer)
    counts: Counter[str] = Counter()
    for text in captions:
        counts.update(split(text))
    kept = sorted(
        (w for w, c in counts.items() if c >= min_count and w not in SPECIAL_TOKENS),
        key=lambda w: (-counts[w], w),
    )
    return Vocabulary([*SPECIAL_TOKENS, *kept], tokenizer=tokenizer)


class HFTokenizer:
    """A Hugging Face tokenizer as a :class:`~vlret.data.dataset.CaptionEncoder`.

    ``pad_id`` is the tokenizer's pad token, or 0 if it has none (padded positions lie past
    ``lengths`` and are masked anyway).

    Args:
        tokenizer: A loaded tokenizer (callable, returning ``input_ids``).
        max_length: Truncate to this many ids; ``None`` takes the tokenizer's
            ``model_max_length`` (no truncation when that is unset or a huge sentinel).
        max_positions: The text model's ``max_position_embeddings``, the most ids it can embed:
            where the limit above is larger or unset, captions are truncated to it instead,
            silently, as CLIP's own processor truncates to 77 (a tokenizer saved without
            ``model_max_length`` reports ~1e30; the model would fail on a long caption). A
            smaller limit is kept.
    """

    def __init__(
        self, tokenizer: Any, *, max_length: int | None = None, max_positions: int | None = None
    ) -> None:
        self.tokenizer = tokenizer
        if max_length is None:
            model_max = getattr(tokenizer, "model_max_length", None)
            # Tokenizers without a limit report a huge sentinel (1e30): no truncation then.
            max_length = model_max if isinstance(model_max, int) and model_max < 10**6 else None
        if max_positions is not None and (max_length is None or max_length > max_positions):
            max_length = max_positions
        self.max_length = max_length
        pad = getattr(tokenizer, "pad_token_id", None)
        self.pad_id = int(pad) if pad is not None else 0

    def encode(self, text: str) -> list[int]:
        """The tokenizer's ``input_ids`` of ``text`` (with its own special tokens), truncated
        to ``max_length``."""
        kwargs: dict[str, Any] = {}
        if self.max_length is not None:
            kwargs = {"truncation": True, "max_length": self.max_length}
        return list(self.tokenizer(text, **kwargs)["input_ids"])


def load_hf_tokenizer(
    path: str | Path, *, max_length: int | None = None, max_positions: int | None = None
) -> HFTokenizer:
    """Load ``transformers.AutoTokenizer`` from a local directory (never the Hub).

    ``transformers`` is imported only here.

    Args:
        path: The folder ``tokenizer.save_pretrained`` wrote.
        max_length: As :class:`HFTokenizer`.
        max_positions: As :class:`HFTokenizer` (the text model's ``max_position_embeddings``).

    Returns:
        The wrapped tokenizer.

    Raises:
        FileNotFoundError: ``path`` is not a directory.
        ImportError: The ``transformers`` package is not installed.
        DataFormatError: The folder holds no loadable tokenizer.
    """
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(
            f"{path}: missing; expected a local tokenizer directory (tokenizer.save_pretrained)"
        )
    try:
        transformers = importlib.import_module("transformers")
    except ImportError:
        raise ImportError(
            "load_hf_tokenizer needs the optional package 'transformers' (pip install "
            "transformers); the built-in alternative is vlret.data.vocab.Vocabulary"
        ) from None
    try:
        tok = transformers.AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except (OSError, ValueError) as err:
        raise DataFormatError(
            path,
            f"could not load a tokenizer ({err}); expected the files written by "
            "tokenizer.save_pretrained",
        ) from None
    return HFTokenizer(tok, max_length=max_length, max_positions=max_positions)


__all__ = [
    "VOCAB_SPLITS",
    "SPECIAL_TOKENS",
    "TOKENIZERS",
    "HFTokenizer",
    "Vocabulary",
    "build_vocab",
    "load_hf_tokenizer",
    "nltk_tokenize",
    "tokenize",
    "word_tokenizer",
]
