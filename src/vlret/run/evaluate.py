"""Evaluation of a trained model under the papers' protocols.

The protocols (their data, splits, sizes and folds) are records in a registry,
:mod:`vlret.eval.protocols`; ``vlret protocols`` lists them, one line each. ``vlret eval
--split`` is one of the splits some protocol evaluates (:func:`vlret.eval.eval_splits`), checked
against the protocol and the checkpoint's data format (:func:`check_eval_split`). ``dev``
(precomp dev, Karpathy val, MSR-VTT validate) is for checking model selection; papers report
the test splits. A protocol with folds (``coco1k``) needs a number of images divisible by them.

This module builds the scorer of a checkpoint (or several) and runs the one pipeline
:func:`vlret.eval.evaluate`. A checkpoint is evaluated from its model, encoder and the model's
``scoring`` only, never its loss (:func:`~vlret.run.builders.load_trained_model`).

A two-tower checkpoint goes through :func:`vlret.metrics.retrieval_metrics` (or
:func:`~vlret.metrics.coco_5fold_metrics`) on its embeddings (cosine scores unless its model's
``scoring`` is ``dot``): the
image-to-text rank there is already the rank of an image's best caption, which is the
dual-encoding video-to-text definition of MSR-VTT full. A pair-scoring (cross-attention)
checkpoint (a :class:`~vlret.models.PairScorer`: SCAN, BFAN, SGRAF, CE, MMT) is scored pair
by pair into a score matrix (:mod:`vlret.eval.scores`; COCO 1K: the 5 diagonal fold blocks
only), ranked by :func:`vlret.metrics.retrieval_metrics_from_similarity`.

Several checkpoints (``vlret eval A.pt B.pt``) are an ensemble: the mean of their score matrices
(cosine matrices for two-tower members), each member encoding the split with its own data
settings and vocabulary; they must evaluate the same data format and split (same images and
captions in the same order). A checkpoint that holds two networks (NCR, ``train.procedure =
"ncr"``) is two members (:mod:`.checkpoint_members`).

``shortlist=K`` (``--shortlist K``) is an opt-in, approximate protocol for pair-scoring models:
each query keeps its top ``K`` candidates by a two-tower score, which are re-ranked by the exact
pair scores; every other candidate ranks below them (among themselves by the two-tower score;
:func:`~vlret.eval.shortlist.shortlist_metrics`). The two-tower score is the cosine of a
``shortlist_from`` two-tower checkpoint's embeddings, or by default the cosine of the
pair-scoring model's own mean-pooled region and word features (for an ensemble, the mean of the
members' cosines). Results say "approximate" and report the fraction of queries whose ground
truth was shortlisted, per direction. The default is always the exact protocol.

``model_dir`` (``vlret eval --model-dir DIR``) evaluates a local pretrained Hugging Face CLIP
that vlret never trained, zero-shot (no checkpoint): CLIP's own towers and projections, no
added layer, its own tokenizer and image preprocessing, cosine scores, on Karpathy JSON + image
data (:func:`~vlret.run.builders.load_pretrained_clip`); exclusive with checkpoints.

Person search (``cuhk-pedes``, ``icfg-pedes``, ``rstpreid``; relevance ``same-identity``):
every image of the caption's person is a correct answer; :func:`vlret.eval.evaluate` ranks the
data set's captions against its images (and images against captions) by
:func:`~vlret.metrics.identity_retrieval_metrics` with its ``image_identity``, R@1/5/10, mAP
and mINP per direction. It takes neither ``shortlist`` nor ``rescore``. ICFG-PEDES has no
validation split: checkpoints are selected on its test split only when the user names it
(:func:`vlret.run.config_checks.check_person_search`). A checkpoint trained on other data
(Flickr30K: AdaCL Table 7's domain generalisation) is evaluated on a person-search folder
without fine-tuning: its data config is read as the protocol's format
(:func:`~vlret.run.eval_data.person_search_eval_data`); its caption encoder and image
transform stay its own.

``rescore`` (``--rescore dsl | qbnorm``) is an opt-in, NON-STANDARD re-scoring of the score
matrix (:mod:`vlret.metrics.rescore`, docs/rescoring.md), for two-tower and pair-scoring models
and ensembles (of the mean matrix), not with ``shortlist``. Dual softmax uses the test matrix's
own statistics; QB-Norm re-scores text->image only, with a querybank of ``bank_size`` captions
of the data folder's ``train`` split (fixed seed) scored against the test images. COCO 1K
re-scores each fold's block on its own. Titles and JSON records say NON-STANDARD.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from .._moved import renamed_names
from ..data import RetrievalDataset
from ..eval import (
    EnsembleScorer,
    EnsembleSplit,
    EvalProtocol,
    Evaluation,
    PairModelScorer,
    RescoredScorer,
    Scorer,
    ShortlistScorer,
    encode_dataset,
    eval_splits,
    evaluate,
    format_table,
    get_protocol,
    metrics_record,
    protocol_names,
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
from ..metrics.rescore import Rescoring
from ..models import PairScorer
from .builders import load_pretrained_member, load_trained_model
from .checkpoint_members import checkpoint_members, member_names
from .devices import resolve_device
from .eval_data import STREAM_FORMATS, karpathy_eval_data  # re-exported: their old home
from .eval_members import (
    Member,
    bank_data,
    check_same_split,
    eval_dataset,
    load_member,
    member_scorer,
    shortlist_source,
    with_caption_counts,
)

#: The old private name (tests, ensembles' split check), now :func:`.eval_members.check_same_split`.
_check_same_split = check_same_split

_deprecated = renamed_names(
    __name__,
    {
        "PROTOCOLS": ("vlret.eval.protocol_names()", protocol_names),
        # the per-protocol table of before the registry, rebuilt from it
        "PROTOCOL_SPLITS": (
            "vlret.eval.get_protocol(name).splits",
            lambda: {n: dict(get_protocol(n).splits) for n in protocol_names()},
        ),
    },
)


def __getattr__(name: str) -> Any:
    # read from the registry at each access, so a protocol registered later is included
    if name == "EVAL_SPLITS":
        return eval_splits()
    return _deprecated(name)


def protocol_title(protocol: str, split: str | None, n_images: int, n_texts: int) -> str:
    """The table title: the paper's label only when ``split`` and the sizes are the paper's
    test set; otherwise what was actually scored (:meth:`vlret.eval.EvalProtocol.title_for`)."""
    return get_protocol(protocol).title_for(split, n_images, n_texts)


def check_protocol(protocol: str) -> str:
    """``protocol`` if it is registered (:func:`vlret.eval.get_protocol`), else ``ValueError``."""
    return get_protocol(protocol).name


def check_eval_split(protocol: str, split: str, data_format: str) -> None:
    """Raise ``ValueError`` unless ``protocol`` evaluates ``split`` of ``data_format`` data (a
    run trained on shards or a CSV is evaluated on Karpathy JSON + images,
    :func:`~vlret.run.eval_data.karpathy_eval_data`)."""
    get_protocol(protocol).check_split(
        split, "karpathy" if data_format in STREAM_FORMATS else data_format
    )


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
    if chosen.relevance != "image-of-caption" and chosen.relevance != "any-caption-of-video":
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
    """Everything :func:`run_evaluation` checked and built before scoring: the scorer (models
    loaded, nothing encoded yet), the split it reads, the protocol and split, and each
    member's name and copy of the split. :meth:`run` scores it; ``vlret eval --check`` stops
    here (:func:`prepare_evaluation`)."""

    scorer: Scorer
    data: Any
    protocol: EvalProtocol
    split: str
    members: tuple[str, ...]
    datasets: tuple[RetrievalDataset, ...]

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
    data: str | Path,
    split: str,
    protocol: str | EvalProtocol,
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

    ``checkpoint``: one checkpoint, or several for an ensemble (the mean of their score
    matrices, see the module docstring). ``data`` replaces the training data paths (for
    Karpathy data: the JSON and the image folder under it, see
    :func:`~vlret.run.eval_data.eval_data_config`); a missing folder raises
    ``FileNotFoundError``, a split the protocol does not evaluate ``ValueError``. ``shortlist``
    / ``shortlist_from``: the approximate protocol (module docstring); ``progress``: a tqdm bar
    while pairs are scored; ``rescore``: a NON-STANDARD re-scoring (a method name takes its
    defaults; module docstring). ``captions_per_image`` (precomp, Karpathy) /
    ``captions_per_video`` (MSR-VTT) replace the stored data config's count (a model trained
    on 1 caption per image, evaluated on 5-caption data); ``None`` keeps the stored one.
    ``model_dir``: a local pretrained Hugging Face CLIP evaluated zero-shot instead of
    checkpoints (pass ``checkpoint=None``; module docstring), with ``default_preprocessing``
    (``"openai-clip"``) where its folder holds no image processor file."""
    chosen = get_protocol(protocol)
    splits = eval_splits()
    if split not in splits:
        raise ValueError(f"split must be one of {', '.join(splits)}, got {split!r}")
    if not Path(data).exists():
        raise FileNotFoundError(f"{data}: missing; expected the data folder of the test split")
    if batch_size < 1:
        raise ValueError(f"batch_size: expected a positive integer, got {batch_size!r}")
    if checkpoint is None:
        checkpoints = []
    else:
        checkpoints = [checkpoint] if isinstance(checkpoint, str | Path) else list(checkpoint)
    load: Callable[..., Member] = load_member
    if model_dir is not None:
        if checkpoints:
            raise ValueError(
                "model_dir: evaluates a local pretrained CLIP without a checkpoint; give "
                "checkpoints or model_dir, not both"
            )
        load = partial(load_pretrained_member, default_preprocessing=default_preprocessing)
        checkpoints = [model_dir]
    elif default_preprocessing is not None:
        raise ValueError("default_preprocessing: only with model_dir (a checkpoint keeps its own)")
    if not checkpoints:
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
    if chosen.relevance == "same-identity" and (rescore is not None or shortlist is not None):
        which = "rescore" if rescore is not None else "shortlist"
        raise ValueError(
            f"{which}: protocol {chosen.name} ranks by person identity on the exact scores; "
            f"it does not combine with {which}"
        )
    try:
        dev = resolve_device(device)
    except ValueError as err:
        raise ValueError(f"device: {err}") from None
    counts = {"captions_per_image": captions_per_image, "captions_per_video": captions_per_video}
    for key, value in counts.items():
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or value < 1
        ):
            raise ValueError(f"{key}: expected a positive integer, got {value!r}")
    members: list[Member] = []
    sources: list[str | Path] = []  # each member's checkpoint (NCR's holds two networks)
    named_members: list[str] = []
    for c in checkpoints:
        member = with_caption_counts(load(c, chosen, split, dev), c, counts)
        group = checkpoint_members(c, member) if load is load_member else [member]
        members, sources = members + group, sources + [c] * len(group)
        named_members += member_names(c, len(group))
    names = tuple(named_members)
    formats = {m[1].data.format for m in members}
    if len(formats) > 1:
        named = ", ".join(f"{c} {m[1].data.format}" for c, m in zip(sources, members, strict=True))
        raise ValueError(f"the ensemble's checkpoints were trained on different data: {named}")
    if shortlist is not None and not all(isinstance(m[0], PairScorer) for m in members):
        two_tower = [
            c for c, m in zip(names, members, strict=True) if not isinstance(m[0], PairScorer)
        ]
        raise ValueError(
            f"shortlist re-ranks pair scores; {', '.join(two_tower)} is a two-tower model, "
            "whose exact evaluation is already one matrix product (drop --shortlist)"
        )
    built: dict[str, RetrievalDataset] = {}  # a checkpoint's networks share its copy
    for c, m in zip(sources, members, strict=True):
        if str(c) not in built:
            built[str(c)] = eval_dataset(m, data, split, chosen)
    datasets = [built[str(c)] for c in sources]
    for name, ds in zip(names[1:], datasets[1:], strict=True):
        check_same_split(names[0], datasets[0], name, ds, split)
    split_data: Any = datasets[0] if len(datasets) == 1 else EnsembleSplit(tuple(datasets))
    options: dict[str, Any] = {"batch_size": batch_size, "device": dev, "progress": progress}
    scorers = [member_scorer(m, **options) for m in members]
    scorer: Scorer
    if shortlist is not None:
        source = None
        if shortlist_from is not None:
            source = shortlist_source(
                shortlist_from,
                data,
                formats,
                chosen,
                split,
                (names[0], datasets[0]),
                counts=counts,
                **options,
            )
        pairs = [s for s in scorers if isinstance(s, PairModelScorer)]
        scorer = ShortlistScorer(pairs, shortlist, source, str(shortlist_from), members=names)
    else:
        scorer = scorers[0] if len(scorers) == 1 else EnsembleScorer(scorers, members=names)
        if rescore is not None:
            bank = bank_data(members, datasets, data, chosen, rescore)
            scorer = RescoredScorer(scorer, rescore, bank, members=names)
    scorer.members = names
    return PreparedEvaluation(scorer, split_data, chosen, split, names, tuple(datasets))


def evaluation_title(result: Evaluation, protocol: str, split: str) -> str:
    """:meth:`vlret.eval.Evaluation.title` under ``protocol`` and ``split``."""
    return result.title(protocol=protocol, split=split)


def evaluation_record(result: Evaluation, *, protocol: str, split: str) -> dict[str, Any]:
    """:meth:`vlret.eval.Evaluation.record` under ``protocol`` and ``split``."""
    return result.record(protocol=protocol, split=split)


__all__ = [
    "STREAM_FORMATS",
    "EVAL_SPLITS",  # noqa: F822 (module __getattr__, read from the registry)
    "Evaluation",
    "check_eval_split",
    "check_protocol",
    "dev_metrics",
    "encode_dataset",
    "evaluate_checkpoint",
    "evaluation_record",
    "evaluation_title",
    "format_metrics_table",
    "karpathy_eval_data",
    "load_trained_model",
    "metrics_json",
    "protocol_metrics",
    "protocol_title",
    "PreparedEvaluation",
    "prepare_evaluation",
    "run_evaluation",
]
