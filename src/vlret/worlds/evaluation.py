"""Reading the side files of a written split and scoring embeddings on it: the standard metrics
beside the relevance-aware ones (R-Precision, mAP@R, clone forced choice, query subsets).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch

from ..metrics import (
    ExtendedMetrics,
    SubsetRecall,
    extended_metrics,
    retrieval_metrics,
    retrieval_ranks,
    subset_recalls,
)
from .relevance import (
    CloneChoice,
    FactSets,
    clone_forced_choice,
    clone_group_images,
    pairs_to_matrix,
    relevance_matrix,
)
from .splits import SyntheticSplit


@dataclass
class SyntheticAnnotations:
    """The side files of one written split (see :func:`load_synthetic`)."""

    root: Path
    split: str
    image_facts: FactSets
    caption_facts: FactSets
    txt_to_img: np.ndarray
    groups: np.ndarray
    scenes: np.ndarray
    caption_form: np.ndarray
    edit_kind: np.ndarray
    edit_parent: np.ndarray
    clean: np.ndarray | None

    def relevance(self) -> np.ndarray:
        """Dense ``(N_txt, N_img)`` relevance: from ``{split}_relevance.npz`` when written,
        else computed from the facts."""
        path = self.root / f"{self.split}_relevance.npz"
        if path.is_file():
            with np.load(path) as z:
                shape = cast("tuple[int, int]", tuple(int(v) for v in z["shape"]))
                return pairs_to_matrix(z["txt"], z["img"], shape)
        return relevance_matrix(self.caption_facts, self.image_facts)


def load_synthetic(root: str | Path, split: str) -> SyntheticAnnotations:
    """Read the side files of ``split`` written by :func:`write_synthetic`."""
    root = Path(root)
    path = root / f"{split}_synth.npz"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: missing; expected the side file of split {split!r}")
    with np.load(path) as z:
        data = {key: z[key] for key in z.files}
    clean_path = root / "train_clean.npy"
    clean = np.load(clean_path) if split == "train" and clean_path.is_file() else None
    return SyntheticAnnotations(
        root=root,
        split=split,
        image_facts=FactSets(data["image_fact_indptr"], data["image_fact_indices"]),
        caption_facts=FactSets(data["caption_fact_indptr"], data["caption_fact_indices"]),
        txt_to_img=data["txt_to_img"].astype(np.int64),
        groups=np.load(root / f"{split}_groups.npy"),
        scenes=data["scenes"],
        caption_form=data["caption_form"],
        edit_kind=data["edit_kind"],
        edit_parent=data["edit_parent"],
        clean=clean,
    )


def evaluate_synthetic(
    img_emb, txt_emb, annotations: SyntheticAnnotations | SyntheticSplit
) -> dict[str, Any]:
    """Standard metrics beside the relevance-aware ones for embeddings of a split.

    Returns ``{"standard": RetrievalMetrics, "extended": ExtendedMetrics, "clone":
    CloneChoice, "secondary_t2i_r1": float, "subsets": {name: SubsetRecall}}``:
    ``secondary_t2i_r1`` is the text-to-image R@1 of the captions that mention only a secondary
    object (NaN without any); ``subsets`` the standard R@1/5/10 of query subsets
    (:func:`~vlret.metrics.subset_recalls`): ``"secondary"`` (those captions,
    T->I), ``"primary"`` (the captions of the primary object alone, T->I), ``"clone_group"``
    (the images in a clone group of two or more and their captions, both directions) and
    ``"no_clone"`` (the other images and their captions).
    """
    img = torch.as_tensor(img_emb)
    txt = torch.as_tensor(txt_emb)
    t2i = torch.as_tensor(annotations.txt_to_img, dtype=torch.long)
    relevance = annotations.relevance()
    standard = retrieval_metrics(img, txt, t2i)
    extended: ExtendedMetrics = extended_metrics(img, txt, relevance, txt_to_img=t2i)
    clone: CloneChoice = clone_forced_choice(
        img,
        txt,
        txt_to_img=t2i,
        groups=annotations.groups,
        caption_facts=annotations.caption_facts,
        image_facts=annotations.image_facts,
    )
    _, t2i_ranks = retrieval_ranks(img, txt, t2i)
    secondary = torch.as_tensor(np.asarray(annotations.caption_form) == 1)
    sec_r1 = (
        100.0 * float((t2i_ranks[secondary] < 1).to(torch.float64).mean())
        if bool(secondary.any())
        else float("nan")
    )
    form = np.asarray(annotations.caption_form)
    in_group = clone_group_images(annotations.groups)
    cap_in_group = in_group[t2i.numpy()]
    masks = {
        "secondary": (form == 1, None),
        "primary": (form == 0, None),
        "clone_group": (cap_in_group, in_group),
        "no_clone": (~cap_in_group, ~in_group),
    }
    subsets: dict[str, SubsetRecall] = {
        name: subset_recalls(img, txt, txt_to_img=t2i, caption_mask=cap, image_mask=im)
        for name, (cap, im) in masks.items()
    }
    return {
        "standard": standard,
        "extended": extended,
        "clone": clone,
        "secondary_t2i_r1": sec_r1,
        "subsets": subsets,
    }


__all__ = [
    "SyntheticAnnotations",
    "evaluate_synthetic",
    "load_synthetic",
]
