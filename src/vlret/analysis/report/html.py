"""The report's page: one static ``index.html`` (inline CSS and SVG, thumbnails by relative
path, no script, no external URL), and ``report.json`` with the same facts.

The page states each number once: the title, then one summary table (a row per direction, a
column per metric, :func:`metrics_table`), the rank histograms, then the queries.

Every query is one ``<section class="query">`` carrying ``data-direction``, ``data-group``,
``data-query`` and ``data-rank`` (the 1-based rank of its best ground truth, as the metrics
count it), so scripts can read the page back; its heading says the same in words. Its top-K
list is ``<ol class="results">`` (ground truths marked); the ground truths ranked below it
follow in rank order as ``<ol class="results truths">``, each a card with its picture (text
queries) or caption (image queries) and its position ``#N`` in the ranked list (the first
:data:`TRUTH_CARDS`; ``report.json`` lists all). Every card is an ``<li>`` with
``data-index``, ``data-position``, ``data-score`` and ``data-relevant``. Person search: the
query and every card name their person (``data-person``; ``same person`` or ``another
person``). Every text of the data (captions, ids, tokens, paths) is escaped with
:func:`html.escape`.

With a compared checkpoint (``vlret report --compare``) the summary has one table per model
and each query's two ranked lists stand side by side in ``<div class="sidebyside">``: one
``<div class="model" data-model="first">`` (the report's checkpoint) and one
``data-model="compared"``, each headed by the checkpoint's name and the query's rank under it,
holding that model's top-K list and ground truths below it; the section carries
``data-compared-rank`` too. The chosen queries (``--queries``) come first, in the order asked.
"""

from __future__ import annotations

import html
import math
import re
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
#: ground truths below the top K shown per query as cards (``report.json`` lists them all)
TRUTH_CARDS = 10
_DIRECTION_TITLES = {"i2t": "image → text", "t2i": "text → image"}
#: a metric key of one direction (``i2t_r1``, ``identity_t2i_map``, ``t2i_R1``) and the column
#: its name goes to
_DIRECTION_KEY = re.compile(r"^(?:(?P<qualifier>[a-z_]+?)_)?(?P<direction>i2t|t2i)_(?P<name>\w+)$")
_COLUMN_TITLES = {
    "r1": "R@1",
    "r5": "R@5",
    "r10": "R@10",
    "medr": "median rank",
    "meanr": "mean rank",
    "map": "mAP",
    "minp": "mINP",
}
_GROUP_TITLES = {
    "chosen": "Chosen queries",
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
ol.results li{border:2px solid #ddd;border-radius:4px;padding:.3em;width:170px;font-size:.85em;
overflow-wrap:anywhere}
ol.results li.gt{border-color:#1a8f3a;background:#eefaf0}
.score{font-family:monospace}.badge{color:#1a8f3a;font-weight:bold}
.qtext{font-style:italic}.tokens span{padding:0 .15em}
.tokens span.chosen{background:#ffd54f;font-weight:bold}
.attention{display:flex;flex-wrap:wrap;gap:1em;margin-top:.5em}
.attention figure{margin:0}figcaption{font-size:.8em;max-width:340px}
.note{color:#666;font-size:.85em}
ol.results li.truth{border-style:dashed}
.gtline{margin:.7em 0 .3em}
.sidebyside{display:grid;grid-template-columns:1fr 1fr;gap:1em}
.modelname{font-weight:bold;margin:.2em 0 .4em;overflow-wrap:anywhere}
.person{font-weight:bold}.person.same{color:#1a8f3a}.person.other{color:#b3261e}
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


def _person_html(person: int | None, query_person: int | None) -> str:
    """Who a gallery item is (person search): its person, and whether it is the query's."""
    if person is None:
        return ""
    same = person == query_person
    words = "same person" if same else "another person"
    return (
        f'<br><span class="person {"same" if same else "other"}">person {esc(person)} '
        f"({words})</span>"
    )


def _item_html(
    data: ReportData, direction: str, index: int, thumbs: dict[int, Thumb], query_person: Any
) -> str:
    """A gallery item: an image (thumbnail and id) for text queries, a caption for image
    queries; person search: its person too."""
    if direction == "t2i":
        body = _thumb_img(thumbs.get(index), f"image {index}") + _image_label(data, index)
        return body + _person_html(data.person("image", index), query_person)
    body = f"{esc(data.captions[index])}<br>{_caption_label(data, index)}"
    return body + _person_html(data.person("caption", index), query_person)


def _card(
    data: ReportData,
    q: QueryFacts,
    thumbs: dict[int, Thumb],
    *,
    index: int,
    position: int,
    score: float,
    relevant: bool,
    below: bool = False,
) -> str:
    """One ranked item of a query as a card: its position, score and mark, then the item."""
    query_person = data.person("caption" if q.direction == "t2i" else "image", q.index)
    kind = "image" if q.direction == "t2i" else "caption"
    person = data.person(kind, index)
    classes = "item" + (" gt" if relevant else "") + (" truth" if below else "")
    mark = ""
    if relevant and not below:  # the cards below the top K are all relevant, as titled
        words = "" if data.by_identity else " ground truth"  # the person line says whose
        mark = f' <span class="badge">✓{words}</span>'
    who = f' data-person="{esc(person)}"' if person is not None else ""
    return (
        f'<li class="{classes}" data-index="{index}" data-position="{position}" '
        f'data-score="{score:.6g}" data-relevant="{int(relevant)}"{who}>'
        f'#{position} <span class="score">{score:.4f}</span>{mark}<br>'
        f"{_item_html(data, q.direction, index, thumbs, query_person)}</li>"
    )


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
    """One query: what it is (and who, on person search), its rank, its top-K list (ground
    truths marked), the ground truths ranked below it in rank order as cards, and its
    attention maps."""
    person = data.person("caption" if q.direction == "t2i" else "image", q.index)
    who = f"person {esc(person)}" if person is not None else ""
    if q.direction == "t2i":
        what = f"Caption {q.index}" + (f" ({who})" if who else "")
        body = f'<p class="qtext">&ldquo;{esc(data.captions[q.index])}&rdquo;</p>'
    else:
        what = f"Image {q.index} (id {esc(data.image_ids[q.index])}" + (f", {who})" if who else ")")
        body = _thumb_img(thumbs.get(q.index), f"image {q.index}")
    lists = ranked_html(data, q, thumbs)
    other = ""
    if q.against is not None and data.compared is not None:
        b = data.compared
        lists = (
            '<div class="sidebyside"><div class="model" data-model="first">'
            f'<p class="modelname">{esc(data.label)}: rank {q.rank}</p>{lists}</div>'
            '<div class="model" data-model="compared">'
            f'<p class="modelname">{esc(b.label)}: rank {q.against.rank}</p>'
            f"{ranked_html(b, q.against, thumbs)}</div></div>"
        )
        other = f' data-compared-rank="{q.against.rank}"'
    attention = "".join(attention_html(data, a, thumbs, boxes) for a in q.attention)
    return (
        f'<section class="query" id="{q.direction}-{q.group}-{q.index}" '
        f'data-direction="{q.direction}" data-group="{q.group}" data-query="{q.index}" '
        f'data-rank="{q.rank}"{other}'
        + (f' data-person="{esc(person)}"' if person is not None else "")
        + f"><h4>{what}: ground truth at rank {q.rank}</h4>{body}{lists}"
        + (f'<div class="attention">{attention}</div>' if attention else "")
        + "</section>"
    )


def ranked_html(data: ReportData, q: QueryFacts, thumbs: dict[int, Thumb]) -> str:
    """A query's top-K list (ground truths marked) and the ground truths ranked below it, in
    rank order, as cards."""
    items = [
        _card(
            data, q, thumbs, index=t.index, position=t.position, score=t.score, relevant=t.relevant
        )
        for t in q.top
    ]
    below, k = q.truths_below, len(q.top)
    noun = "the same person" if data.by_identity else "ground truth"
    if below:
        cards = [
            _card(
                data,
                q,
                thumbs,
                index=g.index,
                position=g.position,
                score=g.score,
                relevant=True,
                below=True,
            )
            for g in below[:TRUTH_CARDS]
        ]
        more = ""
        if len(below) > TRUTH_CARDS:
            rest = len(below) - TRUTH_CARDS
            more = f"; {rest} more down to #{below[-1].position} in report.json"
        inside = len(q.ground_truth) - len(below)
        marked = f"; {inside} marked ✓ above" if inside else ""
        counts = f", in rank order ({len(below)} of {len(q.ground_truth)}{marked}){more}"
        if len(q.ground_truth) == 1:
            counts = ""  # one ground truth: nothing to order or count
        truths = (
            f'<p class="gtline">{noun.capitalize()} ranked below the top {k}{counts}:</p>'
            f'<ol class="results truths">{"".join(cards)}</ol>'
        )
    else:
        n = len(q.ground_truth)
        plural = "items of the same person" if data.by_identity else "ground truths"
        one = "The only item of the same person is" if data.by_identity else "The ground truth is"
        which = one if n == 1 else f"All {n} {plural} are"
        truths = f'<p class="gtline">{which} in the top {k} (marked ✓).</p>'
    return f'<ol class="results">{"".join(items)}</ol>{truths}'


def _cell(value: Any, **attrs: Any) -> str:
    extra = "".join(f' {k}="{esc(v)}"' for k, v in attrs.items())
    text = f"{value:.2f}" if isinstance(value, float) else esc(value)
    return f"<td{extra}>{text}</td>"


def metrics_table(metrics: dict[str, Any]) -> str:
    """The evaluation's metrics as one HTML table, each number once: a row per direction
    (``i2t_*``, ``t2i_*``; a qualified key such as ``identity_t2i_r1`` heads its own row), a
    column per metric (R@1, R@5, R@10, median rank, ...), and the metrics of no direction
    (rsum) in a last column spanning the rows."""
    rows: dict[str, dict[str, Any]] = {}
    columns: list[str] = []
    whole: dict[str, Any] = {}
    for key, value in metrics.items():
        match = _DIRECTION_KEY.match(key)
        if match is None:
            whole[key] = value
            continue
        qualifier = (match["qualifier"] or "").replace("_", " ")
        row = f"{qualifier} {_DIRECTION_TITLES[match['direction']]}".strip()
        column = _COLUMN_TITLES.get(match["name"].lower(), match["name"])
        rows.setdefault(row, {})[column] = value
        if column not in columns:
            columns.append(column)
    head = "<th></th>" + "".join(f"<th>{esc(c)}</th>" for c in [*columns, *whole])
    lines = [f"<tr>{head}</tr>"]
    for r, (row, values) in enumerate(rows.items()):
        cells = "".join(_cell(values[c]) if c in values else "<td></td>" for c in columns)
        if r == 0:
            cells += "".join(_cell(v, rowspan=len(rows)) for v in whole.values())
        lines.append(f"<tr><th>{esc(row)}</th>{cells}</tr>")
    if not rows:
        lines.append("<tr><th></th>" + "".join(_cell(v) for v in whole.values()) + "</tr>")
    return f'<table class="metrics">{"".join(lines)}</table>'


def render_html(
    data: ReportData,
    record: dict[str, Any],
    histograms: dict[str, list[dict[str, Any]]],
    thumbs: dict[int, Thumb],
    boxes: np.ndarray | None,
) -> str:
    """The whole page (module docstring)."""
    ev = data.evaluation
    title, *more = ev.title(protocol=data.protocol, split=data.split).splitlines()
    if "checkpoint" in record:
        more.append(f"checkpoint {record['checkpoint']}")
    notes = "".join(f"{esc(line)}<br>" for line in more)
    parts = [
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">',
        f"<title>vlret report: {esc(title)}</title><style>{_CSS}</style>",
        "</head><body>",
        f"<h1>Retrieval report: {esc(title)}</h1>",
        f'<p class="note">{notes}protocol <code>{esc(data.protocol.name)}</code>; top '
        f"{data.top_k} per query; ranks are 1-based, the best ground truth's, ties counted "
        "against the query (as the metrics).</p>",
        "<h2>Summary</h2>",
    ]
    if data.compared is not None:  # one table per model, each headed by its checkpoint
        parts.append(f'<h3 class="modelname">{esc(data.label)}</h3>')
    parts.append(metrics_table(record["metrics"]))
    if data.compared is not None:
        parts.append(f'<h3 class="modelname">{esc(data.compared.label)}</h3>')
        other = data.compared.evaluation.record(protocol=data.protocol, split=data.split)
        parts.append(metrics_table(other["metrics"]))
    parts.append(
        "<h2>Rank histograms</h2>"
        + (f'<p class="note">of {esc(data.label)}</p>' if data.compared is not None else "")
        + "<div>"
    )
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
    "TRUTH_CARDS",
    "attention_html",
    "bars_svg",
    "boxes_svg",
    "esc",
    "histogram_svg",
    "metrics_table",
    "query_html",
    "ranked_html",
    "rank_histogram",
    "render_html",
]
