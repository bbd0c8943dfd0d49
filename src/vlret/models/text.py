"""Caption encoders: word embeddings + (bi-)GRU, or a Hugging Face BERT from a local directory.

Both consume the padded id batches of :func:`vlret.data.collate_retrieval`: ``captions``
``(B, L)`` long ids and ``lengths`` ``(B,)``; positions at or past ``lengths[i]`` are padding
and never change the output.
"""

from __future__ import annotations

import importlib
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from .attention import positive_int
from .image import MaskedPooling, lengths_to_mask

GRU_POOLINGS = ("last", "mean", "max", "gpo")
BERT_POOLINGS = ("cls", "mean", "max", "gpo")


def import_transformers(feature: str) -> Any:
    """Import the optional ``transformers`` package.

    Args:
        feature: What needs it, named in the error message.

    Returns:
        The ``transformers`` module.

    Raises:
        ImportError: ``transformers`` is not installed (the message names ``vlret[hf]``).
    """
    try:
        return importlib.import_module("transformers")
    except ImportError:
        raise ImportError(
            f"{feature} needs the optional packages transformers and pillow: pip install vlret[hf]"
        ) from None


def check_local_dir(path: str | Path, what: str) -> Path:
    """Check that pretrained weights are in a local directory (they are never downloaded).

    Args:
        path: The directory.
        what: What it should hold, named in the error message.

    Returns:
        ``path`` as a ``Path``.

    Raises:
        FileNotFoundError: ``path`` is not a directory.
    """
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(
            f"{path}: missing; expected a local directory with {what} (save_pretrained output); "
            "vlret never downloads weights"
        )
    return path


def check_batch(batch: Any) -> None:
    """Refuse a batch that lacks a :class:`vlret.data.RetrievalBatch`'s ``features``,
    ``captions`` or ``lengths`` (every model's ``forward``), naming the first missing one."""
    for name in ("features", "captions", "lengths"):
        if not hasattr(batch, name):
            raise ValueError(
                f"batch has no {name!r}; expected a vlret.data.RetrievalBatch, got "
                f"{type(batch).__name__}"
            )


def resolve_vocab_size(configured: Any, given: Any, encoder: str) -> int:
    """The vocabulary size of a word-id text encoder: ``text.vocab_size`` from the config
    (``configured``) or ``build_model(..., vocab_size=given)``; both given must agree.

    Args:
        configured: ``text.vocab_size`` of the config, or None.
        given: ``build_model``'s ``vocab_size``, or None.
        encoder: What needs it, for the message (``"the GRU text encoder"``).

    Raises:
        ValueError: The two disagree, neither is given, or the size is not a positive int; the
            message names ``text.vocab_size``.
    """
    if given is not None and configured is not None and int(given) != int(configured):
        raise ValueError(
            f"text.vocab_size: {configured} in the config disagrees with vocab_size={given}"
        )
    size = given if given is not None else configured
    if size is None:
        raise ValueError(
            f"text.vocab_size: {encoder} needs the vocabulary size; pass "
            "build_model(config, vocab_size=len(vocabulary)) or set text.vocab_size"
        )
    if isinstance(size, np.integer):  # len() of a numpy vocabulary
        size = int(size)
    return positive_int(size, "text.vocab_size")


def check_captions(
    captions: torch.Tensor, lengths: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Validate a padded caption batch.

    Args:
        captions: ``(B, L)`` integer token ids.
        lengths: ``(B,)`` valid tokens per caption, in ``1..L``; None means all ``L``.

    Returns:
        ``(captions, lengths)`` as ``long`` tensors.

    Raises:
        ValueError: ``captions`` is not a 2-D integer tensor, or ``lengths`` has the wrong
            shape or a value outside ``1..L``.
    """
    if not isinstance(captions, torch.Tensor) or captions.dim() != 2:
        got = tuple(captions.shape) if isinstance(captions, torch.Tensor) else type(captions)
        raise ValueError(
            f"captions must be a (B, L) tensor of token ids, got {got}; raw text batches need "
            "a dataset built with an encoder (Vocabulary or load_hf_tokenizer)"
        )
    if captions.is_floating_point():
        raise ValueError(f"captions must hold integer token ids, got dtype {captions.dtype}")
    b, width = captions.shape
    if lengths is None:
        lengths = torch.full((b,), width, dtype=torch.long)
    lengths = torch.as_tensor(lengths, dtype=torch.long)
    if lengths.shape != (b,):
        raise ValueError(f"lengths must have shape ({b},), got {tuple(lengths.shape)}")
    lengths_to_mask(lengths, width)  # range check
    return captions.long(), lengths


class GRUTextEncoder(nn.Module):
    """Word embeddings (300-d) + GRU or bi-GRU to the joint space (1024-d).

    A bi-GRU's two directions are averaged (SCAN, VSE-infinity), so the embedding keeps
    ``embed_dim`` either way. Sequences are packed with ``pack_padded_sequence``, so the GRU
    never reads padding. ``pooling``:

    * ``"last"``: the final hidden state (VSE++): the forward state after the last valid word,
      averaged with the backward state after the first word for a bi-GRU;
    * ``"mean"`` / ``"max"`` / ``"gpo"``: pooled per-word outputs over the valid words
      (``"gpo"`` is VSE-infinity's text pooling).

    Args:
        vocab_size: Number of word ids.
        word_dim: Size of the word embeddings.
        embed_dim: Size of the joint space (the GRU's hidden size).
        bidirectional: A bi-GRU, its directions averaged.
        num_layers: GRU layers.
        pooling: One of :data:`GRU_POOLINGS`.
        padding_idx: Id of the padding word (its embedding is zero), or None.
        gpo_pe_dim: :class:`~vlret.models.image.GPO`'s ``pe_dim``.
        gpo_hidden: :class:`~vlret.models.image.GPO`'s ``hidden``.
        gpo_temperature: :class:`~vlret.models.image.GPO`'s ``temperature``.

    Raises:
        ValueError: A size is not a positive int or ``pooling`` is unknown.
    """

    def __init__(
        self,
        vocab_size: int,
        *,
        word_dim: int = 300,
        embed_dim: int = 1024,
        bidirectional: bool = False,
        num_layers: int = 1,
        pooling: str = "last",
        padding_idx: int | None = 0,
        gpo_pe_dim: int = 32,
        gpo_hidden: int = 32,
        gpo_temperature: float = 0.1,
    ) -> None:
        super().__init__()
        for name, value in (
            ("vocab_size", vocab_size),
            ("word_dim", word_dim),
            ("embed_dim", embed_dim),
            ("num_layers", num_layers),
        ):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if pooling not in GRU_POOLINGS:
            raise ValueError(f"pooling must be one of {GRU_POOLINGS}, got {pooling!r}")
        self.vocab_size = vocab_size
        self.embed_dim = embed_dim
        self.bidirectional = bool(bidirectional)
        self.pooling = pooling
        self.embed = nn.Embedding(vocab_size, word_dim, padding_idx=padding_idx)
        self.gru = nn.GRU(
            word_dim,
            embed_dim,
            num_layers=num_layers,
            batch_first=True,
            bidirectional=self.bidirectional,
        )
        self.pool = (
            None
            if pooling == "last"
            else MaskedPooling(
                pooling,
                gpo_pe_dim=gpo_pe_dim,
                gpo_hidden=gpo_hidden,
                gpo_temperature=gpo_temperature,
            )
        )
        nn.init.uniform_(self.embed.weight, -0.1, 0.1)  # VSE++ word embedding init
        if padding_idx is not None:
            with torch.no_grad():
                self.embed.weight[padding_idx].zero_()

    def forward(self, captions: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        """Encode a padded caption batch.

        Args:
            captions: ``(B, L)`` word ids.
            lengths: ``(B,)`` valid words per caption; None means all ``L``.

        Returns:
            The ``(B, embed_dim)`` caption embeddings (not normalised).

        Raises:
            ValueError: The batch is malformed (:func:`check_captions`) or an id lies outside
                the vocabulary.
        """
        captions, lengths = check_captions(captions, lengths)
        if int(captions.max()) >= self.vocab_size or int(captions.min()) < 0:
            raise ValueError(
                f"captions hold ids in {int(captions.min())}..{int(captions.max())}; "
                f"expected 0..{self.vocab_size - 1} (vocab_size {self.vocab_size})"
            )
        width = captions.size(1)
        words = self.embed(captions)
        packed = pack_padded_sequence(words, lengths.cpu(), batch_first=True, enforce_sorted=False)
        out, h_n = self.gru(packed)
        if self.pooling == "last":
            last = h_n[-2:] if self.bidirectional else h_n[-1:]
            return last.mean(dim=0)
        out, _ = pad_packed_sequence(out, batch_first=True, total_length=width)
        if self.bidirectional:
            out = (out[..., : self.embed_dim] + out[..., self.embed_dim :]) / 2
        mask = lengths_to_mask(lengths.to(out.device), width)
        assert self.pool is not None  # pooling != "last"
        return self.pool(out, mask)

    def extra_repr(self) -> str:
        return f"pooling={self.pooling!r}"


class BertTextEncoder(nn.Module):
    """Hugging Face ``BertModel`` loaded from a LOCAL directory + a linear projection.

    ``pooling``: ``"cls"`` (the first token's final state), or ``"mean"`` / ``"max"`` /
    ``"gpo"`` over the projected token states of the valid tokens (VSE-infinity's BERT
    variant projects every token and pools with GPO). The pretrained pooler layer is not
    loaded, so every parameter receives a gradient (DistributedDataParallel needs that).

    Args:
        path: Local directory of a ``save_pretrained`` BERT model.
        embed_dim: Size of the joint space.
        pooling: One of :data:`BERT_POOLINGS`.
        gpo_pe_dim: :class:`~vlret.models.image.GPO`'s ``pe_dim``.
        gpo_hidden: :class:`~vlret.models.image.GPO`'s ``hidden``.
        gpo_temperature: :class:`~vlret.models.image.GPO`'s ``temperature``.

    Raises:
        ValueError: ``pooling`` is unknown or ``embed_dim`` is not a positive int.
        ImportError: ``transformers`` is not installed.
        FileNotFoundError: ``path`` is not a directory.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        embed_dim: int = 1024,
        pooling: str = "cls",
        gpo_pe_dim: int = 32,
        gpo_hidden: int = 32,
        gpo_temperature: float = 0.1,
    ) -> None:
        super().__init__()
        if pooling not in BERT_POOLINGS:
            raise ValueError(f"pooling must be one of {BERT_POOLINGS}, got {pooling!r}")
        if not isinstance(embed_dim, int) or isinstance(embed_dim, bool) or embed_dim < 1:
            raise ValueError(f"embed_dim must be a positive int, got {embed_dim!r}")
        transformers = import_transformers("BertTextEncoder")
        self.path = check_local_dir(path, "a BERT model")
        self.bert = transformers.BertModel.from_pretrained(
            str(self.path), local_files_only=True, add_pooling_layer=False
        ).float()
        self.embed_dim = embed_dim
        self.pooling = pooling
        self.proj = nn.Linear(self.bert.config.hidden_size, embed_dim)
        self.pool = (
            None
            if pooling == "cls"
            else MaskedPooling(
                pooling,
                gpo_pe_dim=gpo_pe_dim,
                gpo_hidden=gpo_hidden,
                gpo_temperature=gpo_temperature,
            )
        )
        r = math.sqrt(6.0) / math.sqrt(self.proj.in_features + embed_dim)
        nn.init.uniform_(self.proj.weight, -r, r)
        nn.init.zeros_(self.proj.bias)

    def forward(self, captions: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        """Encode a padded batch of token ids.

        Args:
            captions: ``(B, L)`` token ids of the model's tokenizer.
            lengths: ``(B,)`` valid tokens per caption; None means all ``L``.

        Returns:
            The ``(B, embed_dim)`` caption embeddings (not normalised).

        Raises:
            ValueError: The batch is malformed (:func:`check_captions`).
        """
        captions, lengths = check_captions(captions, lengths)
        mask = lengths_to_mask(lengths.to(captions.device), captions.size(1))
        hidden = self.bert(
            input_ids=captions, attention_mask=mask.long(), return_dict=True
        ).last_hidden_state
        if self.pooling == "cls":
            return self.proj(hidden[:, 0])
        assert self.pool is not None  # pooling != "cls"
        return self.pool(self.proj(hidden), mask)

    def extra_repr(self) -> str:
        return f"path={str(self.path)!r}, pooling={self.pooling!r}"


__all__ = [
    "BERT_POOLINGS",
    "GRU_POOLINGS",
    "BertTextEncoder",
    "GRUTextEncoder",
    "check_captions",
    "import_transformers",
]
