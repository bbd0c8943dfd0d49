"""Similarity matrices and positive masks.

Rows are images (or videos), columns are texts, everywhere in vlret.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

Ids = torch.Tensor | Sequence


def _as_2d_float(t: torch.Tensor, name: str) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != 2:
        raise ValueError(f"{name} must be 2-D (N, D), got shape {tuple(t.shape)}")
    if not t.dtype.is_floating_point:
        raise ValueError(f"{name} must be floating point, got dtype {t.dtype}")
    return t


def cosine_similarity(img: torch.Tensor, txt: torch.Tensor, *, eps: float = 1e-8) -> torch.Tensor:
    """Cosine similarity of every image with every text.

    ``S = normalize(img) @ normalize(txt).T``: rows are L2-normalised (norms clamped at ``eps``)
    before the product, so the gradient flows through the normalisation as in VSE++ and CLIP.

    Args:
        img: Image (or video) embeddings, ``(N_img, D)``, floating point.
        txt: Text embeddings, ``(N_txt, D)``, same ``D``.
        eps: Lower bound of each row's norm.

    Returns:
        The ``(N_img, N_txt)`` similarity matrix, rows images and columns texts.

    Raises:
        ValueError: An input is not a 2-D floating-point tensor, or the embedding sizes differ.
    """
    _as_2d_float(img, "img")
    _as_2d_float(txt, "txt")
    if img.shape[1] != txt.shape[1]:
        raise ValueError(
            f"img and txt must share the embedding size, got {img.shape[1]} and {txt.shape[1]}"
        )
    return F.normalize(img, dim=1, eps=eps) @ F.normalize(txt, dim=1, eps=eps).t()


def _ids_to_tensor(ids: Ids, name: str, lookup: dict, device: torch.device | None) -> torch.Tensor:
    if isinstance(ids, torch.Tensor):
        if ids.dim() != 1:
            raise ValueError(f"{name} must be 1-D, got shape {tuple(ids.shape)}")
        if ids.dtype.is_floating_point or ids.dtype.is_complex:
            raise ValueError(f"{name} must hold integer ids, got dtype {ids.dtype}")
        return ids.to(device) if device is not None else ids
    if isinstance(ids, str) or not isinstance(ids, Sequence):
        raise ValueError(f"{name} must be a 1-D tensor or a sequence of ids, got {type(ids)}")
    codes = [lookup.setdefault(i, len(lookup)) for i in ids]
    return torch.tensor(codes, dtype=torch.long, device=device)


def positive_mask(img_ids: Ids, txt_ids: Ids) -> torch.Tensor:
    """Mask of the matching (image, text) pairs: True where ``img_ids[i] == txt_ids[j]``.

    Args:
        img_ids: The image id of each row: a 1-D integer tensor or any sequence of hashable ids
            (strings such as ``"video7010"`` work).
        txt_ids: The image id each text describes, of the same kind as ``img_ids``.

    Returns:
        A ``(N_img, N_txt)`` bool tensor (on ``img_ids``' device for tensors).

    Raises:
        ValueError: One argument is a tensor and the other a sequence, a tensor is not 1-D or
            not integer, or a sequence is a string.
    """
    if isinstance(img_ids, torch.Tensor) != isinstance(txt_ids, torch.Tensor):
        raise ValueError("img_ids and txt_ids must both be tensors or both be sequences")
    lookup: dict = {}
    device = img_ids.device if isinstance(img_ids, torch.Tensor) else None
    a = _ids_to_tensor(img_ids, "img_ids", lookup, device)
    b = _ids_to_tensor(txt_ids, "txt_ids", lookup, device)
    return a[:, None] == b[None, :]


__all__ = ["cosine_similarity", "positive_mask"]
