"""``vlret report``: collect the facts (:mod:`.data`), the pair models' word attention
(:mod:`.attention`) and the thumbnails (:mod:`.thumbs`), and write ``index.html`` and
``report.json`` in one folder."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..._files import atomic_write_text
from ..._images import DEFAULT_MAX_IMAGE_PIXELS
from ..._progress import progress_bar
from .attention import WordAttention, pair_model, query_attention
from .data import DIRECTIONS, QueryFacts, ReportData, collect_report, query_facts
from .html import TRUTH_CARDS, rank_histogram, render_html
from .thumbs import Thumb, load_boxes, world_pictures, write_thumb


def _attention_record(att: WordAttention) -> dict[str, Any]:
    return {
        "role": att.role,
        "image": att.image,
        "caption": att.caption,
        "tokens": att.tokens,
        "word": att.word,
        "word_text": att.tokens[att.word],
        "fallback": att.fallback,
        "weights": att.weights,
    }


def report_record(
    data: ReportData, histograms: dict[str, list[dict[str, Any]]], thumbs: dict[int, Thumb]
) -> dict[str, Any]:
    """``report.json``: the evaluation's record (``vlret eval --json``'s), the histograms and
    every reported query with its rank, top-K ids and scores, ground truths (in rank order)
    and attention; under a same-identity protocol also the ``person`` of the query and of
    each item."""
    record = data.evaluation.record(protocol=data.protocol, split=data.split)
    queries = []
    for q in data.queries:
        kind = "caption" if q.direction == "i2t" else "image"
        top, truths = _ranked_record(q)
        query: dict[str, Any] = {
            "direction": q.direction,
            "group": q.group,
            "query": q.index,
            "text": data.captions[q.index] if q.direction == "t2i" else None,
            "image_id": data.image_ids[q.index] if q.direction == "i2t" else None,
            "rank": q.rank,
            "top": top,
            "ground_truth": truths,
            "attention": [_attention_record(a) for a in q.attention],
        }
        if q.against is not None:  # the compared checkpoint's list of the same query
            other_top, other_truths = _ranked_record(q.against)
            query["compared"] = {
                "rank": q.against.rank,
                "top": other_top,
                "ground_truth": other_truths,
            }
        if data.identities is not None:  # who each one is (person search)
            query["person"] = data.person("image" if kind == "caption" else "caption", q.index)
            for item in top + truths + query.get("compared", {}).get("top", []):
                item["person"] = data.person(kind, int(item["index"]))
        queries.append(query)
    out = {
        "checkpoint": data.label,
        "evaluation": record,
        "top_k": data.top_k,
        "rank_histogram": histograms,
        "thumbnails": {str(k): v.path for k, v in sorted(thumbs.items())},
        "queries": queries,
    }
    if data.compared is not None:
        other = data.compared.evaluation.record(protocol=data.protocol, split=data.split)
        out["compared"] = {"checkpoint": data.compared.label, "evaluation": other}
    return out


def _ranked_record(q: QueryFacts) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A query's top-K items and its ground truths (rank order) as ``report.json`` rows."""
    top: list[dict[str, Any]] = [
        {"index": t.index, "score": t.score, "position": t.position, "relevant": t.relevant}
        for t in q.top
    ]
    truths: list[dict[str, Any]] = [
        {"index": g.index, "score": g.score, "rank": g.rank, "position": g.position}
        for g in q.ground_truth
    ]
    return top, truths


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if hasattr(value, "item") and callable(value.item):
        return value.item()
    return value


def _shown_images(data: ReportData) -> set[int]:
    shown: set[int] = set()
    for q in data.queries:
        if q.direction == "i2t":
            shown.add(q.index)
        else:  # the top K and the ground truths shown below them, of both models
            for facts in (q, q.against) if q.against is not None else (q,):
                shown.update(t.index for t in facts.top)
                shown.update(g.index for g in facts.truths_below[:TRUTH_CARDS])
        shown.update(a.image for a in q.attention)
    return shown


def same_split(first: ReportData, other: ReportData, *, name: str) -> None:
    """Refuse, in one line naming ``name`` (the compared checkpoint), a report whose split is
    not the same images and captions as ``first``'s: side-by-side lists index one gallery."""
    a = (len(first.image_ids), len(first.captions))
    b = (len(other.image_ids), len(other.captions))
    if a != b:
        raise ValueError(
            f"compare {name}: its split holds {b[0]} images x {b[1]} captions, the report's "
            f"{a[0]} x {a[1]}: the two checkpoints must be scored on the same data"
        )
    if (
        list(first.image_ids) != list(other.image_ids)
        or first.captions != other.captions
        or not bool((first.txt_to_img == other.txt_to_img).all())
    ):
        raise ValueError(
            f"compare {name}: its split has other image ids, captions or pairs than the "
            "report's: the two checkpoints must be scored on the same data"
        )


def compare_with(
    facts: ReportData,
    checkpoint: str | Path,
    *,
    data: str | Path,
    batch_size: int = 256,
    device: str = "auto",
    progress: bool = False,
) -> ReportData:
    """Score ``checkpoint`` on ``facts``' data, split and protocol and attach its ranked list
    of every reported query (``QueryFacts.against``; ``facts.compared``): ``vlret report
    --compare``. Returns the compared facts."""
    other = collect_report(
        [checkpoint],
        data=data,
        split=facts.split,
        protocol=facts.protocol.name,
        top_k=facts.top_k,
        samples=0,
        worst=0,
        batch_size=batch_size,
        device=device,
        progress=progress,
    )
    same_split(facts, other, name=str(checkpoint))
    for q in facts.queries:
        q.against = query_facts(other, q.direction, q.index, q.group)
    facts.compared = other
    return other


def _bar(items: list[Any], desc: str, unit: str, show: bool) -> Any:
    """``items`` behind a bar, gone once done (:mod:`vlret._progress`)."""
    return progress_bar(items, show=show, desc=desc, unit=unit, leave=False)


def write_report(
    data: ReportData,
    out: str | Path,
    *,
    word: str | None = None,
    data_dir: str | Path = ".",
    progress: bool = False,
) -> Path:
    """Write ``out/index.html``, ``out/report.json`` and ``out/thumbs/`` for ``data``; pair
    models get their word attention (``word``: the word shown, :func:`.attention.pick_word`);
    region boxes are read from ``data_dir`` (:func:`.thumbs.load_boxes`); ``progress``: bars
    while the attention and the thumbnails are made (:mod:`vlret._progress`). Returns the
    page."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    dataset = data.dataset
    model = pair_model(data.evaluation.scorer)
    if model is not None:
        for q in _bar(data.queries, "word attention", "query", progress):
            q.attention = query_attention(model, dataset, q, word=word)
    boxes = None
    folder = Path(getattr(dataset, "root", data_dir))
    if model is not None:
        boxes = load_boxes(folder, data.split, n_images=len(data.image_ids))
    rendered = world_pictures(folder, data.split)  # a synthetic world read from its features
    # the run's data.max_image_pixels, which the data set's (capped) image transform holds
    cap = getattr(getattr(dataset, "image_transform", None), "max_pixels", DEFAULT_MAX_IMAGE_PIXELS)
    thumbs: dict[int, Thumb] = {}
    for index in _bar(sorted(_shown_images(data)), "thumbnails", "image", progress):
        thumb = write_thumb(dataset, index, out, fallback=rendered, max_pixels=cap)
        if thumb is not None:
            thumbs[index] = thumb
    n_gallery = {"i2t": len(data.captions), "t2i": len(data.image_ids)}
    histograms = {d: rank_histogram(data.ranks[d].numpy(), n_gallery[d]) for d in DIRECTIONS}
    record = report_record(data, histograms, thumbs)
    page = render_html(data, record["evaluation"], histograms, thumbs, boxes)
    atomic_write_text(out / "index.html", page)  # the output-path rule, again at the write
    text = json.dumps(_jsonable(record), indent=1, ensure_ascii=False)
    atomic_write_text(out / "report.json", text + "\n")
    return out / "index.html"


def build_report(
    checkpoints: Sequence[str | Path],
    *,
    data: str | Path,
    split: str,
    out: str | Path,
    protocol: str | None = None,
    queries: Mapping[str, Sequence[int]] | None = None,
    compare: str | Path | None = None,
    top_k: int = 5,
    samples: int = 20,
    worst: int = 20,
    seed: int = 0,
    word: str | None = None,
    batch_size: int = 256,
    device: str = "auto",
    progress: bool = False,
) -> tuple[ReportData, Path]:
    """:func:`.data.collect_report` (``queries``: the chosen queries per direction, listed
    first), :func:`compare_with` when ``compare`` names a second checkpoint, then
    :func:`write_report`: ``(facts, index.html)``."""
    facts = collect_report(
        checkpoints,
        data=data,
        split=split,
        protocol=protocol,
        queries=queries,
        top_k=top_k,
        samples=samples,
        worst=worst,
        seed=seed,
        batch_size=batch_size,
        device=device,
        progress=progress,
    )
    if compare is not None:
        compare_with(
            facts, compare, data=data, batch_size=batch_size, device=device, progress=progress
        )
    return facts, write_report(facts, out, word=word, data_dir=data, progress=progress)


__all__ = ["build_report", "compare_with", "report_record", "same_split", "write_report"]
