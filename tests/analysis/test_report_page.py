"""What a reader of the report page sees, read back from the HTML: a ground truth ranked below
the top K is a card with its picture (text queries) or caption (image queries) and its
position, the ground truths come in rank order, each number of the summary is on the page
once, and on person search every card says who it is and whether that is the query's person
(checked against the data's identities)."""

from __future__ import annotations

import html
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest
from test_report import persons, report  # noqa: F401 (persons: a fixture)

from report_helpers import karpathy_world, parse_report, precomp_world
from vlret.analysis.report.html import TRUTH_CARDS, metrics_table

#: a card of a query's ranked items: its classes, index, position and inner HTML
CARD = re.compile(
    r'<li class="(?P<cls>[^"]*)" data-index="(?P<index>\d+)" data-position="(?P<pos>\d+)"'
    r"(?P<attrs>[^>]*)>(?P<body>.*?)</li>",
    re.S,
)
SECTION = re.compile(r'<section class="query" (?P<attrs>[^>]*)>(?P<body>.*?)</section>', re.S)


@pytest.fixture(scope="module")
def kworld(tmp_path_factory):
    return karpathy_world(tmp_path_factory.mktemp("kpage"))


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return precomp_world(tmp_path_factory.mktemp("ppage"))


def sections(page: str) -> list[tuple[dict[str, str], str]]:
    out = []
    for m in SECTION.finditer(page):
        attrs = dict(re.findall(r'(data-[a-z]+)="([^"]*)"', m["attrs"]))
        out.append((attrs, m["body"]))
    return out


def truth_cards(body: str) -> list[re.Match]:
    """The cards of the ground truths below the top K (``<ol class="results truths">``)."""
    start = body.find('<ol class="results truths">')
    return [] if start < 0 else list(CARD.finditer(body, start))


def test_a_ground_truth_below_the_top_k_shows_its_picture_or_caption(kworld, tmp_path):
    data, ckpt = kworld
    facts, page = report([ckpt], data, "test", tmp_path, samples=4, worst=4, top_k=1)
    text = page.read_text(encoding="utf-8")
    _, record = parse_report(tmp_path)
    by_key = {(q["direction"], q["group"], q["query"]): q for q in record["queries"]}
    seen = {"i2t": 0, "t2i": 0}
    for attrs, body in sections(text):
        q = by_key[(attrs["data-direction"], attrs["data-group"], int(attrs["data-query"]))]
        below = [g for g in q["ground_truth"] if g["position"] > 1]
        cards = truth_cards(body)
        assert [(int(c["index"]), int(c["pos"])) for c in cards] == [
            (g["index"], g["position"]) for g in below[:TRUTH_CARDS]
        ]
        positions = [int(c["pos"]) for c in cards]
        assert positions == sorted(positions)  # rank order
        for card in cards:
            index = int(card["index"])
            assert f"#{card['pos']} " in card["body"]  # its position, as the top-K cards show
            if q["direction"] == "t2i":  # its picture, written beside the page
                assert f'<img src="thumbs/{index}.jpg"' in card["body"]
                assert (tmp_path / "thumbs" / f"{index}.jpg").is_file()
            else:  # its caption
                assert html.escape(facts.captions[index], quote=True) in card["body"]
            seen[q["direction"]] += 1
        if below:
            assert "ranked below the top 1" in body
        else:
            assert "in the top 1 (marked ✓)" in body and not cards
    assert seen["i2t"] > 0 and seen["t2i"] > 0  # both kinds of card were checked


def test_ground_truths_are_listed_in_rank_order_not_index_order(kworld, tmp_path):
    data, ckpt = kworld
    report([ckpt], data, "test", tmp_path, samples=4, worst=4, top_k=1)
    _, record = parse_report(tmp_path)
    reordered = 0
    for q in record["queries"]:
        positions = [g["position"] for g in q["ground_truth"]]
        ranks = [g["rank"] for g in q["ground_truth"]]
        assert positions == sorted(positions) and ranks == sorted(ranks)
        reordered += [g["index"] for g in q["ground_truth"]] != sorted(
            g["index"] for g in q["ground_truth"]
        )
    assert reordered > 0  # some query's rank order is not its index order


class Cells(HTMLParser):
    """The summary table read back: ``{(row header, column header): text}``."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[list[tuple[str, str, int]]] = []
        self._cell: list[str] | None = None
        self._tag = ""
        self._span = 1

    def handle_starttag(self, tag, attrs):
        if tag == "tr":
            self.rows.append([])
        elif tag in ("td", "th"):
            self._cell, self._tag = [], tag
            self._span = int(dict(attrs).get("rowspan") or 1)

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self.rows[-1].append((self._tag, "".join(self._cell), self._span))
            self._cell = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)

    def table(self) -> dict[tuple[str, str], str]:
        header = [text for _, text, _ in self.rows[0]]
        out = {}
        spanning: dict[int, str] = {}
        for row in self.rows[1:]:
            name, cells = row[0][1], row[1:]
            col = 1
            values = []
            for _, text, span in cells:
                while col in spanning:
                    values.append((col, spanning[col]))
                    col += 1
                values.append((col, text))
                if span > 1:
                    spanning[col] = text
                col += 1
            while col in spanning:
                values.append((col, spanning[col]))
                col += 1
            out.update({(name, header[c]): v for c, v in values})
        return out


def read_table(snippet: str) -> dict[tuple[str, str], str]:
    parser = Cells()
    parser.feed(snippet)
    return parser.table()


def test_the_summary_table_puts_each_metric_in_its_direction_and_column():
    retrieval = {"i2t_r1": 7.5, "i2t_r5": 20.0, "t2i_r1": 3.5, "t2i_r5": 18.0, "rsum": 49.0}
    cells = read_table(metrics_table(retrieval))
    assert cells == {
        ("image → text", "R@1"): "7.50",
        ("image → text", "R@5"): "20.00",
        ("image → text", "rsum"): "49.00",
        ("text → image", "R@1"): "3.50",
        ("text → image", "R@5"): "18.00",
        ("text → image", "rsum"): "49.00",  # one cell spanning both rows
    }
    assert metrics_table(retrieval).count("49.00") == 1
    person = {"identity_t2i_r1": 41.25, "identity_t2i_map": 51.05, "identity_i2t_minp": 21.86}
    cells = read_table(metrics_table(person))
    assert cells[("identity text → image", "R@1")] == "41.25"
    assert cells[("identity text → image", "mAP")] == "51.05"
    assert cells[("identity image → text", "mINP")] == "21.86"
    # an older record's casing reads into the same columns
    assert read_table(metrics_table({"t2i_R1": 1.0, "t2i_mAP": 2.0})) == {
        ("text → image", "R@1"): "1.00",
        ("text → image", "mAP"): "2.00",
    }


class Text(HTMLParser):
    """The words a reader sees in the page's body (no style, no title element)."""

    def __init__(self) -> None:
        super().__init__()
        self.words: list[str] = []
        self.lines: list[str] = []
        self._skip = 0

    def handle_starttag(self, tag, attrs):
        self._skip += tag in ("style", "title")

    def handle_endtag(self, tag):
        self._skip -= tag in ("style", "title")

    def handle_data(self, data):
        if not self._skip:
            self.lines.append(data)
            self.words += data.split()


def test_each_number_of_the_summary_is_on_the_page_once(world, tmp_path):
    data, ckpts = world
    facts, page = report([ckpts["tower"]], data, "test", tmp_path, samples=2, worst=2)
    text = page.read_text(encoding="utf-8")
    _, record = parse_report(tmp_path)
    metrics = record["evaluation"]["metrics"]
    body = Text()
    body.feed(text)
    shown = [f"{v:.2f}" for v in metrics.values()]
    for value in set(shown):
        assert body.words.count(value) == shown.count(value), value
    assert "<pre" not in text  # the text table of vlret eval is not repeated
    title = record["evaluation"]["title"].splitlines()[0]
    assert sum(title in line for line in body.lines) == 1  # the heading only
    # the table holds the metrics where their names say
    table = read_table(text[text.index('<table class="metrics">') :].split("</table>")[0])
    assert table[("image → text", "R@1")] == f"{metrics['i2t_r1']:.2f}"
    assert table[("text → image", "R@10")] == f"{metrics['t2i_r10']:.2f}"
    assert table[("text → image", "rsum")] == f"{metrics['rsum']:.2f}"


def test_person_search_cards_say_who_each_result_is(persons, tmp_path):  # noqa: F811
    world, ckpt = persons
    facts, page = report([ckpt], world, "test", tmp_path, samples=3, worst=3, top_k=2)
    text = page.read_text(encoding="utf-8")
    img_ids = facts.evaluation.data.image_identity.tolist()
    txt_ids = [img_ids[i] for i in facts.txt_to_img.tolist()]
    _, record = parse_report(tmp_path)
    checked = {"same": 0, "other": 0}
    for attrs, body in sections(text):
        query = int(attrs["data-query"])
        t2i = attrs["data-direction"] == "t2i"
        person = (txt_ids if t2i else img_ids)[query]
        gallery = img_ids if t2i else txt_ids
        assert int(attrs["data-person"]) == person
        heading = body[body.index("<h4>") : body.index("</h4>")]
        assert f"person {person})" in heading or f"person {person}," in heading
        cards = list(CARD.finditer(body))
        assert cards
        for card in cards:
            who = gallery[int(card["index"])]
            assert f'data-person="{who}"' in card["attrs"]
            same = who == person
            words = f"person {who} ({'same person' if same else 'another person'})"
            assert words in card["body"]
            assert ('data-relevant="1"' in card["attrs"]) == same
            checked["same" if same else "other"] += 1
    assert checked["same"] > 0 and checked["other"] > 0
    for q in record["queries"]:  # report.json says the same
        kind = txt_ids if q["direction"] == "t2i" else img_ids
        other = img_ids if q["direction"] == "t2i" else txt_ids
        assert q["person"] == kind[q["query"]]
        assert all(t["person"] == other[t["index"]] for t in q["top"] + q["ground_truth"])


def test_retrieval_records_name_no_person(world, tmp_path):
    data, ckpts = world
    report([ckpts["tower"]], data, "test", tmp_path, samples=1, worst=1)
    text = (Path(tmp_path) / "index.html").read_text(encoding="utf-8")
    _, record = parse_report(tmp_path)
    assert "data-person" not in text and "person" not in record["queries"][0]
