"""Evaluating checkpoints (the path of ``vlret eval``), in phases each visited once:

1. validate the request (the arguments alone, nothing read): :func:`prepare_evaluation`;
2. load the members, each checkpoint read once and each member's data config adapted by one
   function (:func:`~vlret.run.eval_members.load_members`,
   :func:`~vlret.run.eval_data.member_eval_data`);
3. open each split once and check that the members agree (:func:`open_splits`);
4. build the scorer (:func:`build_scorer`);
5. call :func:`vlret.eval.evaluate` (:meth:`PreparedEvaluation.run`).

What each protocol scores, ensembles, the shortlist, re-scoring, person search and
``--model-dir`` are described in docs/evaluation.md ("Evaluating a checkpoint"). A checkpoint
is evaluated from its model, encoder and the model's ``scoring`` only, never its loss.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.data import Subset

from ..data import RetrievalDataset, check_features
from ..data.formats import KARPATHY, get_format, open_dataset
from ..eval import (
    EnsembleScorer,
    EnsembleSplit,
    EvalProtocol,
    Evaluation,
    MatrixScorer,
    PairModelScorer,
    RescoredScorer,
    Scorer,
    ShortlistScorer,
    TwoTowerScorer,
    eval_splits,
    evaluate,
    format_table,
    get_protocol,
    metrics_record,
)
from ..metrics import (
    IDENTITY_PREFIX,
    IdentityMetrics,
    RetrievalMetrics,
    coco_5fold_metrics,
    identity_retrieval_metrics_from_embeddings,
    retrieval_metrics,
    similarity_stats,
)
from ..metrics.rescore import Rescoring, draw_bank
from ..models import PairScorer
from .devices import resolve_device
from .eval_members import Member, Members, load_members


def check_eval_split(protocol: str, split: str, data_format: str) -> None:
    """Raise ``ValueError`` unless ``protocol`` evaluates ``split`` of ``data_format`` data (a
    run trained on shards or a CSV is evaluated on Karpathy JSON + images,
    :func:`~vlret.run.eval_data.karpathy_eval_data`)."""
    get_protocol(protocol).check_split(split, get_format(data_format).evaluated_format)


def dev_metrics(
    img_emb: torch.Tensor,
    txt_emb: torch.Tensor,
    txt_to_img: torch.Tensor,
    *,
    image_identity: torch.Tensor | None = None,
) -> dict[str, float]:
    """Model-selection metrics: the retrieval metrics of the model's own scores, plus
    ``pos_sim``, the mean cosine of the matching (image, caption) pairs, and
    ``hardest_neg_sim``, the mean over every image and caption query of its hardest
    non-matching cosine (Unified Fig. 4; :func:`vlret.metrics.similarity_stats`).

    ``image_identity`` (person search: the dev set's
    :attr:`~vlret.data.dataset.RetrievalDataset.image_identity`) adds the identity-level
    metrics of the person-search protocols, ``identity_t2i_r1`` ... ``identity_i2t_minp``
    (:func:`vlret.metrics.identity_retrieval_metrics`; ``identity_t2i_r1`` is what IRRA
    selects on)."""
    out = retrieval_metrics(img_emb, txt_emb, txt_to_img).as_dict()
    if image_identity is not None:
        img_ids = torch.as_tensor(image_identity, dtype=torch.long)
        txt_ids = img_ids[torch.as_tensor(txt_to_img, dtype=torch.long)]
        for d, (q, g, qi, gi) in {
            "t2i": (txt_emb, img_emb, txt_ids, img_ids),
            "i2t": (img_emb, txt_emb, img_ids, txt_ids),
        }.items():
            found = identity_retrieval_metrics_from_embeddings(q, g, qi, gi)
            out.update({f"{IDENTITY_PREFIX}{d}_{k}": v for k, v in found.items()})
    # Cosines whatever the model's scoring; the scores above are the model's own.
    sim = F.normalize(img_emb.float(), dim=1) @ F.normalize(txt_emb.float(), dim=1).t()
    out.update(similarity_stats(sim, txt_to_img=txt_to_img))
    return out


def protocol_metrics(
    img_emb: torch.Tensor, txt_emb: torch.Tensor, txt_to_img: torch.Tensor, protocol: str
) -> RetrievalMetrics:
    """Metrics of ``protocol`` from a two-tower model's embeddings (its folds averaged); a
    person-search protocol needs the identities, :func:`vlret.eval.evaluate` (a
    ``ValueError`` here)."""
    chosen = get_protocol(protocol)
    if not chosen.relevance_kind.captions:
        raise ValueError(
            f"protocol {chosen.name}: relevance {chosen.relevance!r} is not ranked from "
            "embeddings and txt_to_img alone (use vlret.eval.evaluate on the data set)"
        )
    folds = chosen.folds
    if folds > 1:
        chosen.check_folds(int(img_emb.shape[0]))
        return coco_5fold_metrics(img_emb, txt_emb, txt_to_img, n_folds=folds)
    return retrieval_metrics(img_emb, txt_emb, txt_to_img)


def format_metrics_table(
    metrics: RetrievalMetrics, protocol: str, *, title: str | None = None
) -> str:
    """The paper-style table (:func:`vlret.eval.format_table`)."""
    return format_table(metrics, protocol, title=title)


def metrics_json(
    metrics: RetrievalMetrics, *, protocol: str, split: str, **extra: Any
) -> dict[str, Any]:
    """JSON record (:func:`vlret.eval.metrics_record`)."""
    return metrics_record(metrics, protocol=protocol, split=split, **extra)


def evaluate_checkpoint(
    checkpoint: str | Path | Sequence[str | Path],
    *,
    data: str | Path,
    split: str,
    protocol: str,
    batch_size: int = 256,
    device: str = "auto",
    **options: Any,
) -> RetrievalMetrics | IdentityMetrics:
    """The metrics of :func:`run_evaluation` (``options``: its ``shortlist``, ...); person
    search: an :class:`~vlret.metrics.IdentityMetrics`."""
    return run_evaluation(
        checkpoint,
        data=data,
        split=split,
        protocol=protocol,
        batch_size=batch_size,
        device=device,
        **options,
    ).metrics


@dataclasses.dataclass(frozen=True)
class PreparedEvaluation:
    """Everything :func:`prepare_evaluation` checked and built before scoring: the scorer
    (models loaded, nothing encoded yet), the split it reads (``data``), the protocol and
    split, each member's name and copy of the split, the checkpoints the given paths stood for
    (a run folder: its ``best.pt``), the data folder, and why each default was taken
    (``why``; ``notes``: one line each, what ``vlret eval`` prints). :meth:`run` scores it;
    ``vlret eval --check`` stops before."""

    scorer: Scorer
    data: Any
    protocol: EvalProtocol
    split: str
    members: tuple[str, ...]
    datasets: tuple[RetrievalDataset, ...]
    checkpoints: tuple[Path, ...] = ()
    root: Path | None = None
    why: dict[str, str] = dataclasses.field(default_factory=dict)
    notes: tuple[str, ...] = ()

    @property
    def sizes(self) -> tuple[int, int]:
        """``(images, texts)`` the split scores (videos for MSR-VTT)."""
        first = self.datasets[0]
        return first.num_images, first.num_captions

    def run(self) -> Evaluation:
        """Encode and score: the :class:`~vlret.eval.Evaluation`."""
        return evaluate(self.scorer, self.data, self.protocol, split=self.split)


def run_evaluation(
    checkpoint: str | Path | Sequence[str | Path] | None, **options: Any
) -> Evaluation:
    """Load ``checkpoint``, encode a split and score a protocol: :func:`prepare_evaluation`
    (the arguments, their checks and errors) then :meth:`PreparedEvaluation.run`."""
    return prepare_evaluation(checkpoint, **options).run()


def prepare_evaluation(
    checkpoint: str | Path | Sequence[str | Path] | None,
    *,
    protocol: str | EvalProtocol,
    data: str | Path | None = None,
    split: str | None = None,
    batch_size: int = 256,
    device: str = "auto",
    shortlist: int | None = None,
    shortlist_from: str | Path | None = None,
    progress: bool = False,
    rescore: Rescoring | str | None = None,
    captions_per_image: int | None = None,
    captions_per_video: int | None = None,
    model_dir: str | Path | None = None,
    default_preprocessing: str | None = None,
) -> PreparedEvaluation:
    """Load ``checkpoint`` and read ``split`` of the data folder ``data`` for ``protocol``,
    checking every argument, without encoding anything (:func:`run_evaluation` then scores):
    the checkpoint(s) become a scorer (:mod:`vlret.eval.scorers`) measured by
    :func:`vlret.eval.evaluate`; the :class:`~vlret.eval.Evaluation` carries the protocol and
    split and renders its own table and JSON record.

    ``checkpoint``: a checkpoint or a run folder of ``vlret train`` (its ``best.pt``, else
    ``last.pt``), or several for an ensemble (the mean of their score matrices; a checkpoint
    of NCR holds two networks, two members). ``data`` replaces the training data paths (for
    Karpathy data: the JSON and the image folder under it, see
    :func:`~vlret.run.eval_data.eval_data_config`); ``None``: the first checkpoint's stored
    ``data.root``. ``split``: ``None`` takes the protocol's test split of the data
    (:func:`~vlret.run.eval_data.default_split`). A missing folder raises
    ``FileNotFoundError``, a split the protocol does not evaluate ``ValueError``.
    ``shortlist`` / ``shortlist_from``: the approximate protocol for pair-scoring models
    (each query's top ``shortlist`` candidates by a two-tower score, re-ranked by the exact
    pair scores); ``progress``: a tqdm bar while pairs are scored; ``rescore``: a
    NON-STANDARD re-scoring (a method name takes its defaults). ``captions_per_image``
    (precomp, Karpathy) / ``captions_per_video`` (MSR-VTT) replace the stored data config's
    count (a model trained on 1 caption per image, evaluated on 5-caption data); ``None``
    keeps the stored one. ``model_dir``: a local pretrained Hugging Face CLIP evaluated
    zero-shot instead of checkpoints (pass ``checkpoint=None``; ``data`` is then required),
    with ``default_preprocessing`` (``"openai-clip"``) where its folder holds no image
    processor file. docs/evaluation.md describes each."""
    # 1. The request: the arguments alone, before anything is read.
    chosen = get_protocol(protocol)
    splits = eval_splits()
    if split is not None and split not in splits:
        raise ValueError(f"split must be one of {', '.join(splits)}, got {split!r}")
    if data is not None and not Path(data).exists():
        raise FileNotFoundError(f"{data}: missing; expected the data folder of the test split")
    if batch_size < 1:
        raise ValueError(f"batch_size: expected a positive integer, got {batch_size!r}")
    if checkpoint is None:
        checkpoints = []
    else:
        checkpoints = [checkpoint] if isinstance(checkpoint, str | Path) else list(checkpoint)
    if model_dir is not None:
        if checkpoints:
            raise ValueError(
                "model_dir: evaluates a local pretrained CLIP without a checkpoint; give "
                "checkpoints or model_dir, not both"
            )
        if data is None:
            raise ValueError("--data: required with --model-dir (a CLIP folder holds no data)")
        if split is not None:  # before its weights are read: Karpathy data only
            try:
                chosen.check_split(split, KARPATHY.name)
            except ValueError as err:
                raise ValueError(f"{model_dir} (Karpathy JSON + images): {err}") from None
    elif default_preprocessing is not None:
        raise ValueError("default_preprocessing: only with model_dir (a checkpoint keeps its own)")
    elif not checkpoints:
        raise ValueError("checkpoint: expected at least one checkpoint (or model_dir)")
    if shortlist is not None and (
        isinstance(shortlist, bool) or not isinstance(shortlist, int) or shortlist < 1
    ):
        raise ValueError(f"shortlist: expected a positive number of candidates, got {shortlist!r}")
    if shortlist_from is not None and shortlist is None:
        raise ValueError("shortlist_from: only used with shortlist (the candidates kept, K)")
    if isinstance(rescore, str):
        rescore = Rescoring(rescore)
    if rescore is not None and not isinstance(rescore, Rescoring):
        raise ValueError(f"rescore: expected a Rescoring or a method name, got {rescore!r}")
    if rescore is not None and shortlist is not None:
        raise ValueError(
            "rescore re-scores the full score matrix; it does not combine with shortlist"
        )
    kind = chosen.relevance_kind
    if (rescore is not None and not kind.rescoring) or (
        shortlist is not None and not kind.shortlists
    ):
        which = "rescore" if rescore is not None else "shortlist"
        ranks = "by person identity" if kind.identities else f"by {kind.name} relevance"
        raise ValueError(
            f"{which}: protocol {chosen.name} ranks {ranks} on the exact scores; "
            f"it does not combine with {which}"
        )
    counts = {"captions_per_image": captions_per_image, "captions_per_video": captions_per_video}
    for key, value in counts.items():
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or value < 1
        ):
            raise ValueError(f"{key}: expected a positive integer, got {value!r}")
    try:
        dev = resolve_device(device)
    except ValueError as err:
        raise ValueError(f"device: {err}") from None
    # 2. The members: each checkpoint read once, each data config adapted once.
    loaded = load_members(
        checkpoints,
        protocol=chosen,
        device=dev,
        data=data,
        split=split,
        counts=counts,
        model_dir=model_dir,
        default_preprocessing=default_preprocessing,
        shortlist_from=shortlist_from,
    )
    names = tuple(m.name for m in loaded.members)
    two_tower = [m.name for m in loaded.members if not isinstance(m.model, PairScorer)]
    if shortlist is not None and two_tower:
        raise ValueError(
            f"shortlist re-ranks pair scores; {', '.join(two_tower)} is a two-tower model, "
            "whose exact evaluation is already one matrix product (drop --shortlist)"
        )
    # 3. Each split opened once; the members must see the same one.
    datasets, shortlisted, bank = open_splits(loaded, chosen, rescore)
    # 4. The scorer.
    options: dict[str, Any] = {"batch_size": batch_size, "device": dev, "progress": progress}
    scorer = build_scorer(
        loaded, shortlisted, bank, shortlist=shortlist, rescore=rescore, **options
    )
    split_data: Any = datasets[0] if len(datasets) == 1 else EnsembleSplit(tuple(datasets))
    notes = [
        f"checkpoint: {c} ({loaded.why[str(c)]})"
        for c in loaded.checkpoints
        if str(c) in loaded.why
    ]
    notes += [
        f"{key}: {value} ({loaded.why[key]})"
        for key, value in (("data", loaded.root), ("split", loaded.split))
        if key in loaded.why
    ]
    return PreparedEvaluation(
        scorer,
        split_data,
        chosen,
        loaded.split,
        names,
        tuple(datasets),
        checkpoints=loaded.checkpoints,
        root=loaded.root,
        why=loaded.why,
        notes=tuple(notes),
    )


def open_splits(
    loaded: Members, protocol: EvalProtocol, rescore: Rescoring | None
) -> tuple[list[RetrievalDataset], RetrievalDataset | None, Any]:
    """The split each member reads (a checkpoint's networks share one copy), checked to be the
    same images and captions in the same order; the ``shortlist_from`` member's copy; and
    QB-Norm's querybank: ``rescore.bank_size`` captions of the ``train`` split (fixed seed)
    with each member's test images (``None`` for a re-scoring without one).

    Raises:
        FileNotFoundError: The split is not in the data folder (a split taken by default says
            so).
        ValueError: Members that see different splits, or a querybank that cannot be read.
    """
    split = loaded.split
    opened: dict[str, RetrievalDataset] = {}
    for member in loaded.members + ((loaded.shortlist,) if loaded.shortlist else ()):
        if member.source not in opened:
            try:
                opened[member.source] = _open(member, split, protocol)
            except FileNotFoundError as err:
                if "split" not in loaded.why:
                    raise
                raise FileNotFoundError(
                    f"--split {split} ({loaded.why['split']}, taken as no --split was given) "
                    f"is not in {loaded.root}: {err}"
                ) from None
    datasets = [opened[m.source] for m in loaded.members]
    first = loaded.members[0]
    for member, ds in zip(loaded.members[1:], datasets[1:], strict=True):
        check_same_split(first.name, datasets[0], member.name, ds, split)
    shortlisted = None
    if loaded.shortlist is not None:
        shortlisted = opened[loaded.shortlist.source]
        check_same_split(first.name, datasets[0], loaded.shortlist.name, shortlisted, split)
    bank = None
    if rescore is not None and rescore.needs_bank:
        views, index = [], None
        for member, ds in zip(loaded.members, datasets, strict=True):
            try:
                train = _open(member, "train", protocol)
            except (FileNotFoundError, ValueError) as err:
                msg = f"rescore qbnorm: the querybank is the train split's captions: {err}"
                raise ValueError(msg) from None
            if index is None:
                n_train = train.num_captions
                index = draw_bank(n_train, size=rescore.bank_size, seed=rescore.bank_seed)
            elif train.num_captions != n_train:
                raise ValueError(
                    "rescore qbnorm: the ensemble's members see different train splits"
                )
            views.append(_BankView(ds, train, index))
        bank = views[0] if len(views) == 1 else EnsembleSplit(tuple(views))
    return datasets, shortlisted, bank


def _open(member: Member, split: str, protocol: EvalProtocol) -> RetrievalDataset:
    """``split`` of the member's data, its features checked (NaN / inf or another feature
    size: the file and row now, as training checks its splits, not after encoding)."""
    dataset = open_dataset(
        member.data.config,
        split,
        encoder=member.encoder,
        protocol=protocol.data_protocol,
        image_transform=getattr(member.model, "image_transform", None),
    )
    in_dim = getattr(getattr(member.model, "image_encoder", None), "in_dim", None)
    check_features(dataset, in_dim=in_dim if isinstance(in_dim, int) else None)
    return dataset


def check_same_split(
    name_a: str, a: RetrievalDataset, name_b: str, b: RetrievalDataset, split: str
) -> None:
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


def build_scorer(
    loaded: Members,
    shortlisted: RetrievalDataset | None,
    bank: Any,
    *,
    shortlist: int | None,
    rescore: Rescoring | None,
    batch_size: int,
    device: torch.device,
    progress: bool,
) -> Scorer:
    """The scorer of the members: one member's (pair scores, or its embeddings compared by its
    model's scoring), the mean of several (:class:`~vlret.eval.EnsembleScorer`), the
    shortlist over them (:class:`~vlret.eval.ShortlistScorer`; the two-tower scores of the
    ``shortlist_from`` member and its copy of the split ``shortlisted``, or by default the
    pair-scoring models' own mean-pooled features), or a re-scoring of their matrix
    (:class:`~vlret.eval.RescoredScorer`, with QB-Norm's querybank ``bank``)."""
    options: dict[str, Any] = {"batch_size": batch_size, "device": device, "progress": progress}

    def scorer_of(member: Member) -> MatrixScorer:
        if isinstance(member.model, PairScorer):
            return PairModelScorer(member.model, **options)
        return TwoTowerScorer(member.model, scoring=member.run.scoring, **options)

    names = tuple(m.name for m in loaded.members)
    scorers = [scorer_of(m) for m in loaded.members]
    scorer: Scorer
    if shortlist is not None:
        source = None
        if loaded.shortlist is not None and shortlisted is not None:
            tower = scorer_of(loaded.shortlist)
            assert isinstance(tower, TwoTowerScorer)  # a two-tower member (load_members)
            source = (tower, shortlisted)
        origin = loaded.shortlist.name if loaded.shortlist is not None else "None"
        pairs = [s for s in scorers if isinstance(s, PairModelScorer)]
        scorer = ShortlistScorer(pairs, shortlist, source, origin, members=names)
    else:
        scorer = scorers[0] if len(scorers) == 1 else EnsembleScorer(scorers, members=names)
        if rescore is not None:
            scorer = RescoredScorer(scorer, rescore, bank, members=names)
    scorer.members = names
    return scorer


__all__ = [
    "Evaluation",
    "PreparedEvaluation",
    "build_scorer",
    "check_eval_split",
    "check_same_split",
    "dev_metrics",
    "evaluate_checkpoint",
    "format_metrics_table",
    "metrics_json",
    "open_splits",
    "prepare_evaluation",
    "protocol_metrics",
    "run_evaluation",
]
