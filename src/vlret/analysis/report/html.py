"""The report's page: one static ``index.html`` (inline CSS and SVG, thumbnails by relative
path, no script, no external URL), and ``report.json`` with the same facts.

Every query is one ``<section class="query">`` carrying ``data-direction``, ``data-group``,
``data-query`` and ``data-rank`` (the 1-based rank of its best ground truth, as the metrics
count it), so scripts can read the page back; its heading says the same in words. Every text
of the data (captions, ids, tokens, paths) is escaped with :func:`html.escape`.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from .attention import WordAttention
from .data import DIRECTIONS, GROUPS, QueryFacts, ReportData
from .thumbs import Thumb, box_canvas

#: the rank histogram's bins: (first rank, last rank) of each, 1-based
RANK_BINS = (
    (1, 1), (2, 5), (6, 10), (11, 20), (21, 50), (51, 100), (101, 500), (501, 1000),
    (1001, math.inf),
)  # fmt: skip
_DIRECTION_TITLES = {"i2t": "image → text", "t2i": "text → image"}
_GROUP_TITLES = {
    "sampled": "Sampled queries",
    "worst": "Worst queries (highest ground-truth rank)",
}
_CSS = """
body{font-family:system-ui,sans-serif;margin:1.5em;color:#222;background:#fff}
h1{font-size:1.4em}h2{border-bottom:2px solid #ccc;margin-top:1.6em}
pre{background:#f4f4f4;padding:.6em;overflow-x:auto}
table.metrics{border-collapse:collapse}table.metrics td,table.metrics th{border:1px solid #bbb;
padding:.2em .6em;text-align:right}
section.query{border:1px solid #ddd;border-radius:6px;margin:.8em 0;padding:.6em}
section.query h4{margin:.1em 0 .4em}
ol.results{display:flex;flex-wrap:wrap;gap:.5em;list-style:none;padding:0;margin:0}
ol.results li{border:2px solid #ddd;border-radius:4px;padding:.3em;width:170px;font-size:.85em}
ol.results li.gt{border-color:#1a8f3a;background:#eefaf0}
.score{font-family:monospace}.badge{color:#1a8f3a;font-weight:bold}
.qtext{font-style:italic}.tokens span{padding:0 .15em}
.tokens span.chosen{background:#ffd54f;font-weight:bold}
.attention{display:flex;flex-wrap:wrap;gap:1em;margin-top:.5em}
.attention figure{margin:0}figcaption{font-size:.8em;max-width:340px}
.note{color:#666;font-size:.85em}
"""


def esc(value: Any) -> str:
    """``value`` as escaped HTML text (quotes included)."""
    return html.escape(str(value), quote=True)


def rank_histogram(ranks: Sequence[int] | np.ndarray, n_gallery: int) -> list[dict[str, Any]]:
    """Counts of ranks per :data:`RANK_BINS` bin up to the bin holding ``n_gallery``."""
    values = np.asarray(ranks, dtype=np.int64)
    out = []
    for lo, hi in RANK_BINS:
        if lo > n_gallery:
            break
        top = min(hi, n_gallery)
        label = str(lo) if lo == top else f"{lo}-{int(top)}" if math.isfinite(top) else f">{lo - 1}"
        count = int(((values >= lo) & (values <= top)).sum())
        out.append({"bin": label, "first": lo, "last": int(top), "count": count})
    return out


def histogram_svg(bins: list[dict[str, Any]], title: str) -> str:
    """An inline SVG bar chart of :func:`rank_histogram`'s bins."""
    width, height, pad = max(60 * len(bins) + 40, 300), 220, 30
    peak = max([b["count"] for b in bins] + [1])
    parts = [
        f'<svg class="histogram" xmlns="http://www.w3.org/2000/svg" width="{width}" '
        f'height="{height}" role="img" aria-label="{esc(title)}">',
        f'<text x="{width / 2}" y="14" text-anchor="middle" font-size="13">{esc(title)}</text>',
    ]
    for k, b in enumerate(bins):
        h = (height - 2 * pad - 10) * b["count"] / peak
        x, y = 30 + 60 * k, height - pad - h
        parts.append(
            f'<rect x="{x}" y="{y:.1f}" width="44" height="{h:.1f}" fill="#4a78c2">'
            f"<title>rank {esc(b['bin'])}: {b['count']}</title></rect>"
            f'<text x="{x + 22}" y="{y - 3:.1f}" text-anchor="middle" font-size="11">'
            f"{b['count']}</text>"
            f'<text x="{x + 22}" y="{height - pad + 14}" text-anchor="middle" font-size="11">'
            f"{esc(b['bin'])}</text>"
        )
    parts.append("</svg>")
    return "".join(parts)


def _image_label(data: ReportData, index: int) -> str:
    return f"image {index} (id {esc(data.image_ids[index])})"


def _caption_label(data: ReportData, index: int) -> str:
    return f"caption {index} (of image {int(data.txt_to_img[index])})"


def _thumb_img(thumb: Thumb | None, alt: str) -> str:
    if thumb is None:
        return ""
    return (
        f'<img src="{esc(thumb.path)}" width="{thumb.width}" height="{thumb.height}" '
        f'alt="{esc(alt)}"><br>'
    )


def _item_html(data: ReportData, direction: str, index: int, thumbs: dict[int, Thumb]) -> str:
    """A gallery item: an image (thumbnail and id) for text queries, a caption for image
    queries."""
    if direction == "t2i":
        return _thumb_img(thumbs.get(index), f"image {index}") + _image_label(data, index)
    return f"{esc(data.captions[index])}<br>{_caption_label(data, index)}"


def bars_svg(weights: Sequence[float]) -> str:
    """An inline SVG bar chart of attention weights over regions (region index below each)."""
    n = len(weights)
    bar = max(4, min(24, 320 // max(n, 1)))
    width, height = bar * n + 20, 140
    peak = max(list(weights) + [1e-12])
    parts = [
        f'<svg class="bars" xmlns="http://www.w3.org/2000/svg" width="{width}" '
        f'height="{height}" role="img" aria-label="attention over regions">'
    ]
    for j, w in enumerate(weights):
        h = 100 * w / peak
        x = 10 + bar * j
        parts.append(
            f'<rect x="{x}" y="{110 - h:.1f}" width="{bar - 1}" height="{h:.1f}" '
            f'fill="#e0762b"><title>region {j}: {w:.4f}</title></rect>'
        )
        if n <= 40 or j % 5 == 0:
            parts.append(
                f'<text x="{x + bar / 2}" y="126" text-anchor="middle" font-size="9">{j}</text>'
            )
    parts.append("</svg>")
    return "".join(parts)


def boxes_svg(boxes: np.ndarray, weights: Sequence[float], thumb: Thumb | None) -> str:
    """The regions' boxes over the thumbnail (a grey canvas without one), each box's stroke
    and fill as strong as its weight; the three strongest labelled with their weights."""
    unit, width, height = box_canvas(boxes, thumb)
    peak = max(list(weights) + [1e-12])
    parts = [
        f'<svg class="boxes" xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" '
        f'height="{height:.0f}" role="img" aria-label="attention over region boxes">'
    ]
    if thumb is not None:
        parts.append(f'<image href="{esc(thumb.path)}" width="{width:.0f}" height="{height:.0f}"/>')
    else:
        parts.append(f'<rect width="{width:.0f}" height="{height:.0f}" fill="#d9d9d9"/>')
    order = sorted(range(len(weights)), key=lambda j: weights[j])
    strongest = set(order[-3:])
    for j in order:  # weakest first, strongest drawn on top
        x1, y1, x2, y2 = unit[j] * np.array([width, height, width, height])
        a = weights[j] / peak
        parts.append(
            f'<rect x="{x1:.1f}" y="{y1:.1f}" width="{max(x2 - x1, 1):.1f}" '
            f'height="{max(y2 - y1, 1):.1f}" fill="#ff5722" fill-opacity="{0.35 * a:.3f}" '
            f'stroke="#ff5722" stroke-opacity="{a:.3f}" stroke-width="2">'
            f"<title>region {j}: {weights[j]:.4f}</title></rect>"
        )
        if j in strongest:
            parts.append(
                f'<text x="{x1 + 2:.1f}" y="{y1 + 11:.1f}" font-size="10" fill="#000">'
                f"{weights[j]:.2f}</text>"
            )
    parts.append("</svg>")
    return "".join(parts)


def attention_html(
    data: ReportData, att: WordAttention, thumbs: dict[int, Thumb], boxes: np.ndarray | None
) -> str:
    """One attention map: the caption's tokens (the word shown highlighted) and the word's
    weights over the image's regions, as boxes when the features come with them."""
    tokens = "".join(
        f'<span class="chosen">{esc(t)}</span>' if k == att.word else f"<span>{esc(t)}</span>"
        for k, t in enumerate(att.tokens)
    )
    thumb = thumbs.get(att.image)
    if boxes is not None and boxes.shape[1] == len(att.weights):
        chart = boxes_svg(boxes[att.image], att.weights, thumb)
    else:
        chart = _thumb_img(thumb, f"image {att.image}") + bars_svg(att.weights)
    note = " (the word asked for is not in this caption)" if att.fallback else ""
    return (
        f'<figure class="attention-map" data-image="{att.image}" data-caption="{att.caption}">'
        f"{chart}<figcaption><b>{esc(att.role)}</b>: word "
        f"&ldquo;{esc(att.tokens[att.word])}&rdquo; of caption {att.caption} over the "
        f"{len(att.weights)} regions of image {att.image}{note}"
        f'<div class="tokens">{tokens}</div></figcaption></figure>'
    )


def query_html(
    data: ReportData, q: QueryFacts, thumbs: dict[int, Thumb], boxes: np.ndarray | None
) -> str:
    """One query: what it is, its rank, its top-K list (ground truths marked) and where its
    ground truths rank, and its attention maps."""
    if q.direction == "t2i":
        what = f"Caption {q.index}"
        body = f'<p class="qtext">&ldquo;{esc(data.captions[q.index])}&rdquo;</p>'
    else:
        what = f"Image {q.index} (id {esc(data.image_ids[q.index])})"
        body = _thumb_img(thumbs.get(q.index), f"image {q.index}")
    items = []
    for item in q.top:
        mark = ' <span class="badge">✓ ground truth</span>' if item.relevant else ""
        items.append(
            f'<li class="item{" gt" if item.relevant else ""}" data-index="{item.index}" '
            f'data-score="{item.score:.6g}" data-relevant="{int(item.relevant)}">'
            f'#{item.position} <span class="score">{item.score:.4f}</span>{mark}<br>'
            f"{_item_html(data, q.direction, item.index, thumbs)}</li>"
        )
    kind = "caption" if q.direction == "i2t" else "image"
    truths = ", ".join(
        f'<span class="truth" data-index="{g.index}" data-position="{g.position}">{kind} '
        f"{g.index} at #{g.position} (score {g.score:.4f})</span>"
        for g in q.ground_truth[:10]
    )
    more = f" and {len(q.ground_truth) - 10} more" if len(q.ground_truth) > 10 else ""
    attention = "".join(attention_html(data, a, thumbs, boxes) for a in q.attention)
    return (
        f'<section class="query" id="{q.direction}-{q.group}-{q.index}" '
        f'data-direction="{q.direction}" data-group="{q.group}" data-query="{q.index}" '
        f'data-rank="{q.rank}"><h4>{what}: ground truth at rank {q.rank}</h4>{body}'
        f'<ol class="results">{"".join(items)}</ol>'
        f'<p class="gtline">Ground truth: {truths}{more}</p>'
        + (f'<div class="attention">{attention}</div>' if attention else "")
        + "</section>"
    )


def metrics_table(metrics: dict[str, Any]) -> str:
    """The evaluation's metrics by name, as an HTML table."""
    head = "".join(f"<th>{esc(k)}</th>" for k in metrics)
    row = "".join(
        f"<td>{v:.2f}</td>" if isinstance(v, float) else f"<td>{esc(v)}</td>"
        for v in metrics.values()
    )
    return f'<table class="metrics"><tr>{head}</tr><tr>{row}</tr></table>'


def render_html(
    data: ReportData,
    record: dict[str, Any],
    histograms: dict[str, list[dict[str, Any]]],
    thumbs: dict[int, Thumb],
    boxes: np.ndarray | None,
) -> str:
    """The whole page (module docstring)."""
    ev = data.evaluation
    title = ev.title(protocol=data.protocol, split=data.split)
    parts = [
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">',
        f"<title>vlret report: {esc(title.splitlines()[0])}</title><style>{_CSS}</style>",
        "</head><body>",
        f"<h1>Retrieval report: {esc(title.splitlines()[0])}</h1>",
        f'<p class="note">protocol {esc(data.protocol.name)}, split {esc(data.split)}, '
        f"{ev.n_images} images x {ev.n_texts} texts; top {data.top_k} per query; ranks are "
        "1-based, the best ground truth's, ties counted against the query (as the metrics)."
        "</p>",
        "<h2>Summary</h2>",
        f'<pre class="table">{esc(ev.table(protocol=data.protocol, split=data.split))}</pre>',
        metrics_table(record["metrics"]),
        "<h2>Rank histograms</h2><div>",
    ]
    for d in DIRECTIONS:
        parts.append(histogram_svg(histograms[d], f"{_DIRECTION_TITLES[d]}: ground-truth rank"))
    parts.append("</div>")
    for d in DIRECTIONS:
        parts.append(f'<h2 id="{d}">{_DIRECTION_TITLES[d]}</h2>')
        for g in GROUPS:
            chosen = [q for q in data.queries if q.direction == d and q.group == g]
            parts.append(f"<h3>{_GROUP_TITLES[g]} ({len(chosen)})</h3>")
            parts += [query_html(data, q, thumbs, boxes) for q in chosen]
    parts.append("</body></html>")
    return "\n".join(parts)


__all__ = [
    "RANK_BINS",
    "attention_html",
    "bars_svg",
    "boxes_svg",
    "esc",
    "histogram_svg",
    "metrics_table",
    "query_html",
    "rank_histogram",
    "render_html",
]
