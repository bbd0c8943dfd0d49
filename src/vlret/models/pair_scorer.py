"""The interface of a model that scores (image, caption) pairs itself: SCAN, BFAN, SGRAF, CE
and MMT. The trainer hands such a model's batch score matrix to a loss's ``from_similarity``,
and evaluation scores every pair block by block (:mod:`vlret.eval`); a two-tower model, which
gives one embedding per item, is not one."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch


@runtime_checkable
class PairScorer(Protocol):
    """Encode each image's and each caption's tokens once, then score pairs of them.

    ``encode_images(features, lengths=None)`` gives ``(N, R, D)`` region (or expert) features,
    ``encode_texts(captions, lengths)`` the ``(N, L, D)`` padded word features, of which
    ``token_lengths(lengths)`` are real rows per caption, and ``score(regions, words, lengths,
    max_elements=None)`` the ``(n_img, n_cap)`` scores of every pair of them.
    """

    def encode_images(self, features: Any, lengths: Any = None) -> torch.Tensor: ...

    def encode_texts(self, captions: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor: ...

    def token_lengths(self, lengths: torch.Tensor) -> torch.Tensor: ...

    def score(
        self,
        regions: torch.Tensor,
        words: torch.Tensor,
        word_lengths: torch.Tensor,
        *,
        max_elements: int | None = None,
    ) -> torch.Tensor: ...


__all__ = ["PairScorer"]
