"""CVSE's transductive test protocol: caption concept labels completed from nearest neighbours
over the whole test gallery, then the captions encoded again (the authors' ``evaluation.py``
``label_complete`` and ``encode_data_KNN_rerank``, in the version with the boundary guard).

Pass 1 encodes every image and caption (evaluation mode) and labels each caption from its own
tokens. For each caption ``i``:

* ``a``: the ``k_captions`` (10) captions most similar to it by their fused vectors (the
  release's ``construct_H_with_KNN``: the cosine matrix with its diagonal set to 0, sorted
  descending, so a caption may count itself when its other similarities are negative);
* ``b``: three captions around ``i`` in the ranking of every caption by its best image ``j*``
  (``argmax_j`` of the image-caption scores of the fused vectors): with ``p`` the position of
  ``i`` in that ranking and ``n`` the caption count, ranks ``p-1..p+1`` when ``1 < p < n-3``,
  the first three when ``p <= 1``, the last three otherwise (``construct_N_with_KNN``);
* the neighbours: the members of ``a`` that are in ``b`` (in ``a``'s order); when fewer than 3,
  ``a[:3] + b`` (F30K) or ``a[:2] + b[:1]`` (COCO) instead, and ``i`` itself.

The completed labels are the union of the neighbours' labels; pass 2 encodes the captions again
with them (the images are unchanged) and scores every pair. vlret's own labels are surface
matches (:mod:`vlret.models.matchers.cvse`), the release's WordNet lemmas, so the completed
labels are those of vlret's labelling, not of the release's. ``vlret eval`` scores a CVSE model
inductively (each caption's own labels); this module is the release's protocol for a caller
that holds the whole test split (:func:`two_pass_scores`).
"""

from __future__ import annotations

from typing import Any

import torch

#: ``protocol`` values: the two fallbacks of the release's ``label_complete``.
PROTOCOLS = ("f30k", "coco")


def caption_neighbours(
    img_fused: torch.Tensor,
    cap_fused: torch.Tensor,
    *,
    protocol: str = "f30k",
    k_captions: int = 10,
) -> list[list[int]]:
    """Each caption's neighbours (itself last), as the release's ``label_complete`` picks them.

    Args:
        img_fused: ``(n_img, D)`` the images' fused vectors.
        cap_fused: ``(n_cap, D)`` the captions' fused vectors (``n_cap >= 4``).
        protocol: ``"f30k"`` or ``"coco"`` (the fallback when ``a`` and ``b`` share < 3).
        k_captions: Size of ``a``.

    Returns:
        Per caption the caption indices whose labels it takes.

    Raises:
        ValueError: An unknown protocol or too few captions.
    """
    if protocol not in PROTOCOLS:
        raise ValueError(f"protocol: must be one of {list(PROTOCOLS)}, got {protocol!r}")
    n = cap_fused.shape[0]
    if n < max(4, k_captions):
        raise ValueError(
            f"cap_fused: {n} captions; the KNN completion needs at least {max(4, k_captions)}"
        )
    cap = cap_fused.double()
    sim = cap @ cap.t()
    sim = torch.maximum(sim, sim.t())
    sim.fill_diagonal_(0.0)
    a = torch.sort(sim, dim=1, descending=True, stable=True).indices[:, :k_captions]
    scores = img_fused.double() @ cap.t()  # (n_img, n_cap)
    best = scores.argmax(dim=0)
    order = torch.sort(scores, dim=1, descending=True, stable=True).indices  # per image
    position = torch.empty_like(order)
    position.scatter_(1, order, torch.arange(n).expand_as(order).contiguous())
    out = []
    for i in range(n):
        ranking = order[best[i]]
        p = int(position[best[i], i])
        if p < n - 3:
            near = ranking[p - 1 : p + 2] if p > 1 else ranking[:3]
        else:
            near = ranking[-3:]
        b = near.tolist()
        a_i = a[i].tolist()
        common = [x for x in a_i if x in b]
        if len(common) < 3:
            common = a_i[:3] + b[:4] if protocol == "f30k" else a_i[:2] + b[:1]
        out.append(common + [i])
    return out


def complete_labels(labels: torch.Tensor, neighbours: list[list[int]]) -> torch.Tensor:
    """``(n_cap, C)``: per caption the union (element-wise max) of its neighbours' labels."""
    return torch.stack([labels[idx].amax(dim=0) for idx in neighbours])


@torch.no_grad()
def two_pass_scores(
    model: Any,
    features: torch.Tensor,
    captions: torch.Tensor,
    lengths: torch.Tensor,
    *,
    protocol: str = "f30k",
    batch_size: int = 128,
) -> torch.Tensor:
    """The release's transductive ``(n_img, n_cap)`` scores of a CVSE model (module docstring).

    Args:
        model: A :class:`~vlret.models.matchers.cvse.CVSE` (put in evaluation mode here, its
            mode restored after).
        features: ``(n_img, R, in_dim)`` the test images' regions.
        captions: ``(n_cap, L)`` the test captions' ids.
        lengths: ``(n_cap,)`` their lengths.
        protocol: ``"f30k"`` or ``"coco"``.
        batch_size: Items encoded at once.

    Returns:
        The scores after the label completion.
    """
    was = model.training
    model.eval()
    try:

        def chunks(n: int) -> list[slice]:
            return [slice(s, min(n, s + batch_size)) for s in range(0, n, batch_size)]

        images = torch.cat([model.encode_images(features[s]) for s in chunks(len(features))])
        first = [model.text_levels(captions[s], lengths[s]) for s in chunks(len(captions))]
        raw = torch.cat(
            [model.caption_labels(captions[s], lengths[s]) for s in chunks(len(captions))]
        )
        cap_fused = torch.cat([lv.fused for lv in first])
        neighbours = caption_neighbours(images[:, 2], cap_fused, protocol=protocol)
        done = complete_labels(raw, neighbours)
        texts = torch.cat(
            [
                model.text_levels(captions[s], lengths[s], labels=done[s]).rows()
                for s in chunks(len(captions))
            ]
        )
        return model.score(images, texts, model.token_lengths(lengths))
    finally:
        model.train(was)


__all__ = ["PROTOCOLS", "caption_neighbours", "complete_labels", "two_pass_scores"]
