"""The facts of a retrieval report: one evaluation of a checkpoint (or an ensemble) on a split,
every query's rank, and for the reported queries the top-K retrieved items with their scores.

The evaluation is :func:`vlret.run.evaluate.run_evaluation` itself (the numbers ``vlret eval``
prints); the report keeps the split's full ``(N_img, N_txt)`` score matrix (COCO 1K: NaN outside
the fold blocks; COCO 5K is 5000 x 25000 float32, 500 MB).

**Ranks** are 1-based and counted exactly as :mod:`vlret.metrics` counts them: a query's rank is
``1 +`` the number of non-relevant gallery items scoring ``>=`` its best-scoring relevant item
(ties count against the query). For the retrieval protocols the 0-based ranks come from the
metrics code itself, on the same numbers: :func:`~vlret.metrics.retrieval_ranks` of a two-tower
model's embeddings (as its metrics are counted), else
:func:`~vlret.metrics.retrieval_ranks_from_similarity` of the score matrix, fold by fold for
COCO 1K (a query is ranked within its fold). Person search (``same-identity``) ranks the
score matrix's blocks by the ranking core (:func:`~vlret.metrics.rank_queries`) with every
image of the query's person relevant.

**Queries**: per direction, the ``chosen`` queries first (``queries``: the indices asked for, in
the order given; image queries are ``i2t``, caption queries ``t2i``), then ``samples`` queries
drawn without replacement with ``seed`` (numpy's ``default_rng``), and the ``worst`` queries
(highest rank; ties: lower index first). A query in several groups is listed in each. Each
query's ground truths are listed in rank order: by their position in its ranked list
(:class:`GroundTruth`), the best first.

**Persons** (``same-identity`` protocols): :attr:`ReportData.identities` holds the person of
each image (the data set's ``image_identity``, the id its annotation file writes), so the page
names who each query and each retrieved item is (:meth:`ReportData.person`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ...eval import EnsembleSplit, Evaluation, MatrixScorer, embedding_scores, get_protocol
from ...eval.protocols import EvalProtocol, protocol_names
from ...metrics import (
    fold_blocks,
    matrix_blocks,
    rank_blocks,
    rank_queries,
    retrieval_ranks,
    retrieval_ranks_from_similarity,
)

#: the two directions: image -> text (an image queries the captions) and text -> image
DIRECTIONS = ("i2t", "t2i")
#: query groups of the report, in page order
GROUPS = ("chosen", "sampled", "worst")
#: rows of the score matrix compared at once when counting identity ranks
_CHUNK = 256


@dataclass
class RetrievedItem:
    """One item of a query's ranked list (a gallery index and its score)."""

    index: int
    score: float
    #: 1-based position in the query's list (score order; ties by index)
    position: int
    relevant: bool


@dataclass
class GroundTruth:
    """A relevant gallery item of a query, its score, its rank by the metrics' rule (``1 +``
    non-relevant items scoring ``>=`` it; the other ground truths do not count) and its
    ``position`` in the query's ranked list as the top-K list orders it (score, ties by index),
    where the other ground truths above it do count."""

    index: int
    score: float
    rank: int
    position: int = 0


@dataclass
class QueryFacts:
    """What the report shows of one query."""

    direction: str
    group: str
    index: int
    #: 1-based rank of the best ground truth, as the metrics count it
    rank: int
    top: list[RetrievedItem]
    #: in rank order (by position in the ranked list, the best first)
    ground_truth: list[GroundTruth]
    #: pair-scoring models: word attention over regions (:mod:`.attention`), else empty
    attention: list[Any] = field(default_factory=list)
    #: the same query under the compared checkpoint (``vlret report --compare``), else None
    against: QueryFacts | None = None

    @property
    def truths_below(self) -> list[GroundTruth]:
        """The ground truths ranked below the top-K list (the page shows each with its
        picture or caption and its position), in rank order."""
        return [g for g in self.ground_truth if g.position > len(self.top)]


@dataclass
class ReportData:
    """The facts of a report: the evaluation, every query's rank, the reported queries."""

    evaluation: Evaluation
    protocol: EvalProtocol
    split: str
    #: ``(N_img, N_txt)`` float32 scores (NaN outside COCO 1K's fold blocks)
    scores: torch.Tensor
    #: 1-based ranks of every query, per direction (``i2t``: images, ``t2i``: captions)
    ranks: dict[str, torch.Tensor]
    queries: list[QueryFacts]
    top_k: int
    captions: list[str]
    image_ids: list[Any]
    txt_to_img: torch.Tensor
    #: the gallery items relevant to each query are of the same person (person search)
    by_identity: bool = False
    #: person search: the person of each image (``image_identity``); ``None`` otherwise
    identities: torch.Tensor | None = None
    #: the checkpoint(s) scored, as named on the page
    label: str = ""
    #: ``vlret report --compare``: the second checkpoint's facts on the same queries
    compared: ReportData | None = None

    def person(self, kind: str, index: int) -> int | None:
        """The person of image (``kind="image"``) or caption (``"caption"``) ``index`` under
        a same-identity protocol (a caption's is its image's); ``None`` otherwise."""
        if self.identities is None:
            return None
        image = index if kind == "image" else int(self.txt_to_img[index])
        return int(self.identities[image])

    @property
    def dataset(self) -> Any:
        """The split as read by the (first) member."""
        data = self.evaluation.data
        return data.parts[0] if isinstance(data, EnsembleSplit) else data


def choose_protocol(checkpoint: str | Path, split: str) -> str:
    """The protocol of ``split`` for the data the checkpoint was trained on: the format's
    default protocol when it evaluates ``split``, else the first registered one that does."""
    from ...eval import default_protocol
    from ...run.eval_data import stored_eval_data
    from ...run.eval_inputs import stored_data_config

    fmt = stored_eval_data(stored_data_config(checkpoint)).format

    preferred = default_protocol(fmt)
    names = ([preferred.name] if preferred is not None else []) + list(protocol_names())
    for name in names:
        protocol = get_protocol(name)
        if split in protocol.splits.get(fmt, ()):
            return name
    raise ValueError(f"split: no protocol evaluates {split!r} of {fmt} data ({checkpoint})")


def score_matrix_of(evaluation: Evaluation) -> torch.Tensor:
    """The evaluation's ``(N_img, N_txt)`` score matrix: the one it ranked (pair-scoring models,
    ensembles), or the dot products of the two-tower embeddings it ranked."""
    if evaluation.scores is not None:
        return evaluation.scores.float().cpu()
    if evaluation.embeddings is not None:
        img, txt = evaluation.embeddings
        return embedding_scores(img, txt, blocks=_blocks(evaluation))
    scorer = evaluation.scorer
    if isinstance(scorer, MatrixScorer):
        return scorer.scores(evaluation.data, blocks=_blocks(evaluation)).float()
    raise ValueError(f"{type(scorer).__name__} has no score matrix to report")


def _blocks(evaluation: Evaluation) -> list[tuple[int, int, int, int]]:
    assert evaluation.protocol is not None
    folds = evaluation.protocol.folds
    data = evaluation.data
    n_img, n_txt = int(data.num_images), int(data.num_captions)
    if folds == 1:
        return [(0, n_img, 0, n_txt)]
    return fold_blocks(data.txt_to_img, folds, n_images=n_img)


def retrieval_query_ranks(evaluation: Evaluation, scores: torch.Tensor) -> dict[str, torch.Tensor]:
    """1-based ranks of every image (``i2t``) and caption (``t2i``) query, by the metrics'
    own rank functions, fold by fold (module docstring)."""
    t2i = torch.as_tensor(evaluation.data.txt_to_img, dtype=torch.long)
    i2t_ranks = torch.zeros(scores.shape[0], dtype=torch.long)
    t2i_ranks = torch.zeros(scores.shape[1], dtype=torch.long)
    for i0, i1, t0, t1 in _blocks(evaluation):
        own = t2i[t0:t1] - i0
        if evaluation.embeddings is not None:
            img, txt = evaluation.embeddings
            r_i, r_t = retrieval_ranks(img[i0:i1], txt[t0:t1], own)
        else:
            r_i, r_t = retrieval_ranks_from_similarity(scores[i0:i1, t0:t1], own)
        i2t_ranks[i0:i1], t2i_ranks[t0:t1] = r_i + 1, r_t + 1
    return {"i2t": i2t_ranks, "t2i": t2i_ranks}


def counted_ranks(query_scores: torch.Tensor, relevant: torch.Tensor) -> torch.Tensor:
    """1-based rank of each row's best relevant item: ``1 +`` the non-relevant entries of the
    row scoring ``>=`` its best relevant score (rows without a relevant item are refused)."""
    if not bool(relevant.any(dim=1).all()):
        row = int(torch.nonzero(~relevant.any(dim=1))[0])
        raise ValueError(f"query {row} has no relevant gallery item")
    blocks = (
        (r0, query_scores[r0 : r0 + _CHUNK], relevant[r0 : r0 + _CHUNK])
        for r0 in range(0, query_scores.shape[0], _CHUNK)
    )
    return rank_blocks(blocks, n_queries=query_scores.shape[0]).first + 1


def _identities(evaluation: Evaluation) -> tuple[torch.Tensor, torch.Tensor]:
    from ...eval import identity_ids

    assert evaluation.protocol is not None
    return identity_ids(evaluation.data, evaluation.protocol)


def identity_query_ranks(evaluation: Evaluation, scores: torch.Tensor) -> dict[str, torch.Tensor]:
    """1-based ranks of a same-identity protocol: every image of the query's person is
    relevant (the ranking core under the protocol's relevance kind)."""
    txt_ids, img_ids = _identities(evaluation)
    assert evaluation.protocol is not None
    kind = evaluation.protocol.relevance_kind
    labels = {"image_ids": img_ids, "caption_ids": txt_ids}
    ranks = {}
    for direction, query_scores in (("i2t", scores), ("t2i", scores.t())):
        counted = rank_queries(
            matrix_blocks(query_scores, rows=_CHUNK),
            kind,
            labels,
            direction=direction,
            n_queries=query_scores.shape[0],
        )
        ranks[direction] = counted.first + 1
    return ranks


def relevant_items(data: ReportData, direction: str, query: int) -> torch.Tensor:
    """The gallery indices relevant to ``query`` (captions of an image, the image of a
    caption; person search: the gallery items of the same person)."""
    t2i = data.txt_to_img
    if data.by_identity:
        txt_ids, img_ids = _identities(data.evaluation)
        if direction == "i2t":
            return torch.nonzero(txt_ids == img_ids[query]).squeeze(1)
        return torch.nonzero(img_ids == txt_ids[query]).squeeze(1)
    if direction == "i2t":
        return torch.nonzero(t2i == query).squeeze(1)
    return t2i[query : query + 1].clone()


def query_row(data: ReportData, direction: str, query: int) -> torch.Tensor:
    """The query's scores against the gallery (NaN outside its COCO 1K fold)."""
    return data.scores[query] if direction == "i2t" else data.scores[:, query]


def query_facts(data: ReportData, direction: str, query: int, group: str) -> QueryFacts:
    """The top ``data.top_k`` items of one query (score order, ties by index: a stable sort)
    and its ground truths with their ranks."""
    row = query_row(data, direction, query).double()
    inside = ~torch.isnan(row)
    gallery = torch.nonzero(inside).squeeze(1)
    values = row[gallery]
    order = torch.sort(values, descending=True, stable=True).indices
    relevant = relevant_items(data, direction, query)
    rel_set = set(relevant.tolist())
    top = [
        RetrievedItem(int(gallery[o]), float(values[o]), p + 1, int(gallery[o]) in rel_set)
        for p, o in enumerate(order[: data.top_k].tolist())
    ]
    irrelevant = inside.clone()
    irrelevant[relevant] = False
    where = {int(gallery[o]): p + 1 for p, o in enumerate(order.tolist())}
    truths = [
        GroundTruth(
            int(g), float(row[g]), int((row[irrelevant] >= row[g]).sum()) + 1, where[int(g)]
        )
        for g in relevant.tolist()
    ]
    truths.sort(key=lambda t: t.position)  # rank order; positions are distinct
    rank = int(data.ranks[direction][query])
    return QueryFacts(direction, group, query, rank, top, truths)


def pick_queries(
    ranks: torch.Tensor, *, samples: int, worst: int, seed: int
) -> dict[str, list[int]]:
    """``sampled``: ``samples`` query indices drawn without replacement (sorted); ``worst``:
    the ``worst`` highest ranks, worst first (ties: lower index first)."""
    n = int(ranks.numel())
    rng = np.random.default_rng(seed)
    sampled = sorted(int(i) for i in rng.choice(n, size=min(samples, n), replace=False))
    order = np.lexsort((np.arange(n), -ranks.numpy()))  # rank descending, then index
    return {"sampled": sampled, "worst": [int(i) for i in order[: min(worst, n)]]}


def check_queries(queries: Mapping[str, Sequence[int]], *, n_images: int, n_captions: int) -> None:
    """Refuse, in one line naming it, a chosen query of no direction or out of range: image
    queries (``i2t``) index the split's images, caption queries (``t2i``) its captions."""
    sizes = {"i2t": (n_images, "images"), "t2i": (n_captions, "captions")}
    for direction, indices in queries.items():
        if direction not in sizes:
            raise ValueError(f"queries: direction {direction!r} is not one of i2t, t2i")
        n, noun = sizes[direction]
        for q in indices:
            if isinstance(q, bool) or not isinstance(q, int) or not 0 <= q < n:
                raise ValueError(
                    f"queries: {direction} query {q!r} is out of range (the split has {n} "
                    f"{noun}, indices 0-{n - 1})"
                )


def collect_report(
    checkpoints: Sequence[str | Path],
    *,
    data: str | Path,
    split: str,
    protocol: str | None = None,
    queries: Mapping[str, Sequence[int]] | None = None,
    top_k: int = 5,
    samples: int = 20,
    worst: int = 20,
    seed: int = 0,
    batch_size: int = 256,
    device: str = "auto",
    progress: bool = False,
) -> ReportData:
    """Evaluate ``checkpoints`` (several: an ensemble, the mean of their score matrices) on
    ``split`` of the data folder ``data`` under ``protocol`` (default:
    :func:`choose_protocol`) with :func:`~vlret.run.evaluate.run_evaluation`, and gather
    the report's facts (module docstring); ``queries``: the chosen queries per direction
    (:func:`check_queries`)."""
    from ...run.evaluate import run_evaluation

    for name, value, low in (("top_k", top_k, 1), ("samples", samples, 0), ("worst", worst, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            which = "a positive integer" if low else "an integer >= 0"
            raise ValueError(f"{name}: expected {which}, got {value!r}")
    paths = [Path(c) for c in checkpoints]
    if not paths:
        raise ValueError("checkpoint: expected at least one checkpoint")
    for path in paths:
        if not path.is_file():
            raise FileNotFoundError(f"checkpoint {path}: missing")
    chosen = get_protocol(protocol if protocol is not None else choose_protocol(paths[0], split))
    evaluation = run_evaluation(
        [str(p) for p in paths] if len(paths) > 1 else str(paths[0]),
        data=data,
        split=split,
        protocol=chosen,
        batch_size=batch_size,
        device=device,
        progress=progress,
    )
    scores = score_matrix_of(evaluation)
    by_identity = chosen.relevance_kind.identities
    if by_identity:
        ranks = identity_query_ranks(evaluation, scores)
    else:
        ranks = retrieval_query_ranks(evaluation, scores)
    first = evaluation.data.parts[0] if isinstance(evaluation.data, EnsembleSplit) else None
    dataset = first if first is not None else evaluation.data
    identities = _identities(evaluation)[1] if by_identity else None
    report = ReportData(
        evaluation=evaluation,
        protocol=chosen,
        split=split,
        scores=scores,
        ranks=ranks,
        queries=[],
        top_k=top_k,
        captions=list(dataset.captions),
        image_ids=list(dataset.image_ids),
        txt_to_img=torch.as_tensor(dataset.txt_to_img, dtype=torch.long).cpu(),
        by_identity=by_identity,
        identities=identities,
        label=" + ".join(str(p) for p in paths),
    )
    chosen_queries = {d: list(v) for d, v in (queries or {}).items()}
    check_queries(chosen_queries, n_images=len(report.image_ids), n_captions=len(report.captions))
    for direction in DIRECTIONS:
        picked = pick_queries(ranks[direction], samples=samples, worst=worst, seed=seed)
        picked = {"chosen": chosen_queries.get(direction, []), **picked}
        for group in GROUPS:
            report.queries += [query_facts(report, direction, q, group) for q in picked[group]]
    return report


__all__ = [
    "DIRECTIONS",
    "GROUPS",
    "GroundTruth",
    "QueryFacts",
    "ReportData",
    "RetrievedItem",
    "check_queries",
    "choose_protocol",
    "collect_report",
    "counted_ranks",
    "identity_query_ranks",
    "pick_queries",
    "query_facts",
    "relevant_items",
    "retrieval_query_ranks",
    "score_matrix_of",
]
