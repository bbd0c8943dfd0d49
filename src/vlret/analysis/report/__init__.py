"""The retrieval report (``vlret report``): for a checkpoint (or an ensemble) and a split, a
static HTML page in one folder with the summary metrics, the ranked lists of chosen, sampled and
worst queries in both directions, beside a second checkpoint's lists with ``--compare``
(ground truth marked, its rank as the metrics count it),
thumbnails or captions, the pair-scoring models' word attention over regions, and a rank
histogram per direction; ``report.json`` holds the same facts.

* :mod:`.data`: the evaluation, every query's rank, the reported queries' top-K lists;
* :mod:`.attention`: a word's attention over an image's regions (SCAN, BFAN, SGRAF);
* :mod:`.thumbs`: thumbnails (PIL) and precomputed region boxes;
* :mod:`.html`: the page;
* :mod:`.build`: :func:`build_report`, the whole of it.
"""

from .attention import WordAttention, pair_attention, word_weights
from .build import build_report, compare_with, report_record, same_split, write_report
from .data import QueryFacts, ReportData, collect_report, counted_ranks
from .html import rank_histogram, render_html

__all__ = [
    "QueryFacts",
    "ReportData",
    "WordAttention",
    "build_report",
    "collect_report",
    "compare_with",
    "counted_ranks",
    "pair_attention",
    "rank_histogram",
    "render_html",
    "report_record",
    "same_split",
    "word_weights",
    "write_report",
]
