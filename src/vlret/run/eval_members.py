"""The members of an evaluation (:func:`vlret.run.evaluate.run_evaluation`): each checkpoint's
model, stored run and caption encoder, the split it reads and the scorer it becomes; the
``shortlist_from`` source and QB-Norm's querybank.

A member is ``(model, stored run, caption encoder)``: a checkpoint rebuilt by
:func:`~vlret.run.builders.load_trained_model` (its data config read as the protocol's
evaluation data, :func:`~vlret.run.eval_data.stored_eval_data`), or a local Hugging Face CLIP
(:func:`~vlret.run.builders.load_pretrained_member`).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import Subset

from ..data import RetrievalDataset, check_features
from ..eval import EnsembleSplit, EvalProtocol, MatrixScorer, PairModelScorer, TwoTowerScorer
from ..metrics.rescore import Rescoring, draw_bank
from ..models import PairScorer
from .builders import StoredRun, build_dataset, load_trained_model
from .eval_data import eval_data_config, stored_eval_data

Member = tuple[nn.Module, StoredRun, Any]


def member_scorer(
    member: Member, *, batch_size: int, device: torch.device, progress: bool
) -> MatrixScorer:
    """A checkpoint's scorer: pair scores, or its embeddings compared by its model's scoring."""
    model, run, _ = member
    if isinstance(model, PairScorer):
        return PairModelScorer(model, batch_size=batch_size, device=device, progress=progress)
    return TwoTowerScorer(
        model, scoring=run.scoring, batch_size=batch_size, device=device, progress=progress
    )


def shortlist_source(
    checkpoint: str | Path,
    data: str | Path,
    formats: set[str],
    protocol: EvalProtocol,
    split: str,
    first: tuple[str, RetrievalDataset],
    counts: dict[str, int | None],
    **options: Any,
) -> tuple[TwoTowerScorer, RetrievalDataset]:
    """The ``shortlist_from`` two-tower checkpoint's scorer and its copy of the split."""
    member = load_member(checkpoint, protocol, split, options["device"])
    member = with_caption_counts(member, checkpoint, counts)
    if isinstance(member[0], PairScorer) or member[1].data.format not in formats:
        raise ValueError(
            f"shortlist_from: {checkpoint} must be a two-tower checkpoint trained on "
            f"{formats.pop()} data"
        )
    ds = eval_dataset(member, data, split, protocol)
    check_same_split(first[0], first[1], str(checkpoint), ds, split)
    scorer = member_scorer(member, **options)
    assert isinstance(scorer, TwoTowerScorer)  # not a PairScorer (checked above)
    return scorer, ds


#: the data formats whose captions each count applies to (:func:`with_caption_counts`)
_COUNT_FORMATS = {"captions_per_image": ("precomp", "karpathy"), "captions_per_video": ("msrvtt",)}


def with_caption_counts(
    member: Member, checkpoint: str | Path, counts: dict[str, int | None]
) -> Member:
    """``member`` with its stored data config's caption counts replaced where given; a count
    of another data format is refused, naming the checkpoint's format."""
    model, run, encoder = member
    given: dict[str, Any] = {k: v for k, v in counts.items() if v is not None}
    for key in given:
        if run.data.format not in _COUNT_FORMATS[key]:
            raise ValueError(
                f"{key}: only used with {' or '.join(_COUNT_FORMATS[key])} data; {checkpoint} "
                f"was trained on {run.data.format} data"
            )
    if not given:
        return member
    return model, dataclasses.replace(run, data=dataclasses.replace(run.data, **given)), encoder


def load_member(
    checkpoint: str | Path, protocol: EvalProtocol, split: str, device: torch.device | str
) -> Member:
    """A checkpoint's member, its data config read as ``protocol``'s evaluation data
    (:func:`~vlret.run.eval_data.stored_eval_data`); ``ValueError`` naming the checkpoint
    when the protocol does not evaluate ``split`` of that data."""
    model, run, encoder = load_trained_model(checkpoint, device=device)
    run = dataclasses.replace(run, data=stored_eval_data(run.data, protocol=protocol))
    try:
        protocol.check_split(split, run.data.format)
    except ValueError as err:
        raise ValueError(f"{checkpoint}: {err}") from None
    return model, run, encoder


def eval_dataset(
    member: Member, data: str | Path, split: str, protocol: EvalProtocol
) -> RetrievalDataset:
    model, run, encoder = member
    transform = getattr(model, "image_transform", None)
    dataset = build_dataset(
        eval_data_config(run.data, data),
        split,
        encoder,
        protocol=protocol.data_protocol,
        image_transform=transform,
    )
    # NaN / inf or another feature size: the file and row now (DataFormatError), as training
    # checks its splits, not "img_emb contains NaN or inf values" after encoding
    in_dim = getattr(getattr(model, "image_encoder", None), "in_dim", None)
    check_features(dataset, in_dim=in_dim if isinstance(in_dim, int) else None)
    return dataset


def check_same_split(name_a: str, a: RetrievalDataset, name_b: str, b: RetrievalDataset, split):
    """Ensemble members must score the same images and captions, in the same order."""
    size_a, size_b = (a.num_images, a.num_captions), (b.num_images, b.num_captions)
    if size_a != size_b:
        raise ValueError(
            f"{name_a} and {name_b} see different {split} splits: {size_a[0]} x {size_a[1]} "
            f"and {size_b[0]} x {size_b[1]} images x texts (check their data settings)"
        )
    same_ids = list(a.image_ids) == list(b.image_ids)
    if not same_ids or not torch.equal(
        torch.as_tensor(a.txt_to_img), torch.as_tensor(b.txt_to_img)
    ):
        raise ValueError(
            f"{name_a} and {name_b} see the {split} split's images or captions in another order"
        )


class _BankView:
    """The test images with the querybank's training captions as texts (for scoring them)."""

    def __init__(self, test: RetrievalDataset, train: RetrievalDataset, index: torch.Tensor):
        self.test, self.captions, self.index = test, train.texts(), index.tolist()

    def images(self):
        return self.test.images()

    def texts(self) -> Subset:
        view = Subset(self.captions, self.index)
        view.collate = self.captions.collate  # type: ignore[attr-defined]
        return view


def bank_data(
    members: list[Member],
    datasets: list[RetrievalDataset],
    data: str | Path,
    protocol: EvalProtocol,
    rescore: Rescoring,
) -> Any:
    """QB-Norm's querybank: ``rescore.bank_size`` captions of the ``train`` split (fixed seed)
    with each member's test images (an :class:`~vlret.eval.EnsembleSplit` for ensembles);
    ``None`` for a re-scoring without a querybank."""
    if not rescore.needs_bank:
        return None
    views, index = [], None
    for member, ds in zip(members, datasets, strict=True):
        try:
            train = eval_dataset(member, data, "train", protocol)
        except (FileNotFoundError, ValueError) as err:
            msg = f"rescore qbnorm: the querybank is the train split's captions: {err}"
            raise ValueError(msg) from None
        if index is None:
            n_train = train.num_captions
            index = draw_bank(n_train, size=rescore.bank_size, seed=rescore.bank_seed)
        elif train.num_captions != n_train:
            raise ValueError("rescore qbnorm: the ensemble's members see different train splits")
        views.append(_BankView(ds, train, index))
    return views[0] if len(views) == 1 else EnsembleSplit(tuple(views))
