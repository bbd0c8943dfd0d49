"""The interface of a model that scores (image, caption) pairs itself: SCAN, BFAN, SGRAF, CE
and MMT. The trainer hands such a model's batch score matrix to a loss's ``from_similarity``,
and evaluation scores every pair block by block (:mod:`vlret.eval`); a two-tower model, which
gives one embedding per item, is not one.

:class:`PairScorer` is the interface the harness checks; :class:`PairScoringModel` is the
module base both families (:class:`~vlret.models.cross_model.CrossAttentionModel`,
:class:`~vlret.models.video_experts.MultiExpertModel`) build on: it holds the two encoders and
the config and scores a training batch from the four interface methods.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn

from .text import check_batch, check_captions


@runtime_checkable
class PairScorer(Protocol):
    """Encode each image's and each caption's tokens once, then score pairs of them.

    ``encode_images(features, lengths=None)`` gives ``(N, R, D)`` region (or expert) features,
    ``encode_texts(captions, lengths)`` the ``(N, L, D)`` padded word features, of which
    ``token_lengths(lengths)`` are real rows per caption, and ``score(regions, words, lengths,
    max_elements=None)`` the ``(n_img, n_cap)`` scores of every pair of them. A model declares
    it by deriving from it (as :class:`PairScoringModel` does); any object with these four
    methods also passes ``isinstance(model, PairScorer)``.
    """

    def encode_images(self, features: Any, lengths: Any = None) -> torch.Tensor:
        """The encoded images (or videos), ``(N, R, D)``: one row per region (or expert)."""
        raise NotImplementedError

    def encode_texts(self, captions: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """The encoded captions, ``(N, L, D)``: one row per word (or expert)."""
        raise NotImplementedError

    def token_lengths(self, lengths: torch.Tensor) -> torch.Tensor:
        """The rows :meth:`encode_texts` gives per caption with ``lengths`` tokens."""
        raise NotImplementedError

    def score(
        self,
        regions: torch.Tensor,
        words: torch.Tensor,
        word_lengths: torch.Tensor,
        *,
        max_elements: int | None = None,
    ) -> torch.Tensor:
        """Score encoded images against encoded captions.

        Args:
            regions: ``(n_img, R, D)`` from :meth:`encode_images`.
            words: ``(n_cap, L, D)`` from :meth:`encode_texts`.
            word_lengths: ``(n_cap,)`` real rows per caption (:meth:`token_lengths`).
            max_elements: Bound on the scorer's largest intermediate.

        Returns:
            The ``(n_img, n_cap)`` scores.
        """
        raise NotImplementedError


#: Maps the local ``(text rows, rows per caption)`` to those of the whole distributed batch.
GatherTexts = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


class PairScoringModel(nn.Module, PairScorer):
    """An image (or video) encoder, a caption encoder and a pair score: a :class:`PairScorer`
    whose ``forward(batch)`` gives the ``(B, B)`` scores of every image of a
    :class:`vlret.data.RetrievalBatch` with every caption (row ``i``, column ``i``: item
    ``i``'s pair).

    It declares :class:`PairScorer`; subclasses implement its four methods (each raises
    ``NotImplementedError`` until then), and ``forward`` is written once here on top of them,
    so training and evaluation encode and score through the same calls.

    Args:
        image_encoder: The image (region, or video expert) encoder.
        text_encoder: The caption encoder.
        config: The resolved config the model was built from (kept as ``model.config``).
    """

    #: Kept for code that reads it; the harness checks ``isinstance(model, PairScorer)``.
    scores_pairs = True
    #: The config entries that are not the scorer's own settings, left out of ``repr``.
    config_sections: tuple[str, ...] = ("kind", "image", "text")

    def __init__(
        self,
        image_encoder: nn.Module,
        text_encoder: nn.Module,
        *,
        config: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.image_encoder = image_encoder
        self.text_encoder = text_encoder
        self.config = copy.deepcopy(dict(config)) if config is not None else None

    def forward(self, batch: Any, *, gather_texts: GatherTexts | None = None) -> torch.Tensor:
        """Score every image (or video) of a batch against every caption.

        Args:
            batch: A :class:`vlret.data.RetrievalBatch` (for CE / MMT its ``features`` is an
                ExpertBatch).
            gather_texts: Maps the local encoded captions and their rows per caption to those
                of the whole distributed batch (the trainer's, under torchrun), so the result
                is ``(B_local, B_global)``.

        Returns:
            The ``(B_images, B_texts)`` score matrix; item ``i``'s pair at ``(i, i)``.

        Raises:
            ValueError: ``batch`` lacks ``features``, ``captions`` or ``lengths``.
        """
        check_batch(batch)
        images = self.encode_images(batch.features)
        captions, lengths = check_captions(batch.captions, batch.lengths)
        texts = self.encode_texts(captions, lengths)
        rows = self.token_lengths(lengths).to(texts.device)
        if gather_texts is not None:
            texts, rows = gather_texts(texts, rows)
        return self.score(images, texts, rows)

    def extra_repr(self) -> str:
        config = self.config or {}
        keys = [k for k in config if k not in self.config_sections]
        return ", ".join(f"{k}={config[k]!r}" for k in keys)


__all__ = ["GatherTexts", "PairScorer", "PairScoringModel"]
