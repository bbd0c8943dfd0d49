"""``vlret report --queries ... --compare CKPT2``: chosen queries first in the order asked, and
each query's top-K under two checkpoints side by side (VSL Fig. 3, AdaCL Fig. 4/5/8), each list
the one a report of that checkpoint alone gives; one-line errors for an out-of-range query, a
bad spec and a compared checkpoint scored on other data."""

from __future__ import annotations

import json
import re

import pytest
import torch

from report_helpers import precomp_world
from vlret.analysis.report import build_report, same_split
from vlret.cli import main
from vlret.cli.report import parse_queries

pytestmark = pytest.mark.usefixtures("one_thread")

SECTION = re.compile(r'<section class="query" (?P<attrs>[^>]*)>(?P<body>.*?)</section>', re.S)
INDEX = re.compile(r'<li class="[^"]*" data-index="(\d+)"')
TOP = re.compile(r'<ol class="results">(.*?)</ol>', re.S)  # the top K, not the truths below
CHOSEN = {"t2i": [7, 2, 29, 11], "i2t": [4, 0, 5]}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return precomp_world(tmp_path_factory.mktemp("compare"))


def chosen_sections(page: str) -> list[tuple[str, int, list[int], list[int]]]:
    """Each chosen query in page order: direction, index, the first and the compared list."""
    out = []
    for m in SECTION.finditer(page):
        attrs = dict(re.findall(r'([\w-]+)="([^"]*)"', m["attrs"]))
        if attrs["data-group"] != "chosen":
            continue
        first, _, compared = m["body"].partition('<div class="model" data-model="compared">')
        first = first.partition('<div class="model" data-model="first">')[2]
        lists = [
            [int(i) for i in INDEX.findall(TOP.findall(part)[0])] for part in (first, compared)
        ]
        out.append((attrs["data-direction"], int(attrs["data-query"]), *lists))
    return out


def top_k(scores: torch.Tensor, direction: str, query: int, k: int) -> list[int]:
    """A naive top-K: score descending, ties by the lower index."""
    row = (scores[query] if direction == "i2t" else scores[:, query]).tolist()
    return sorted(range(len(row)), key=lambda j: (-row[j], j))[:k]


def test_chosen_queries_side_by_side_in_the_order_asked(world, tmp_path):
    data, ckpts = world
    facts, page = build_report(
        [ckpts["tower"]],
        data=data,
        split="test",
        out=tmp_path / "both",
        queries=CHOSEN,
        compare=ckpts["scan"],
        top_k=3,
        samples=0,
        worst=0,
        device="cpu",
    )
    html = page.read_text(encoding="utf-8")
    found = chosen_sections(html)
    assert [(d, q) for d, q, *_ in found] == [("i2t", q) for q in CHOSEN["i2t"]] + [
        ("t2i", q) for q in CHOSEN["t2i"]
    ]
    # the compared lists are what a report of SCAN alone shows for the same queries
    alone, _ = build_report(
        [ckpts["scan"]],
        data=data,
        split="test",
        out=tmp_path / "scan",
        queries=CHOSEN,
        top_k=3,
        samples=0,
        worst=0,
        device="cpu",
    )
    assert facts.compared is not None
    own = {(q.direction, q.index): q for q in alone.queries}
    for direction, query, first, compared in found:
        assert first == top_k(facts.scores, direction, query, 3)
        assert compared == [t.index for t in own[direction, query].top]
        assert compared == top_k(alone.scores, direction, query, 3)
    assert torch.equal(facts.compared.scores, alone.scores)
    assert html.count(f">{ckpts['scan']}: rank ") == len(found)  # each list headed by its model
    assert html.count('<table class="metrics">') == 2  # a summary table per model
    record = json.loads((tmp_path / "both" / "report.json").read_text(encoding="utf-8"))
    assert record["compared"]["checkpoint"] == str(ckpts["scan"])
    for q in record["queries"]:
        mine = own[q["direction"], q["query"]]
        assert q["compared"]["rank"] == mine.rank
        assert [t["index"] for t in q["compared"]["top"]] == [t.index for t in mine.top]


def test_parse_queries_inline_and_from_a_file(tmp_path):
    listed = tmp_path / "queries.txt"
    listed.write_text("# AdaCL Fig. 4\nt2i 12\n\ni2t 3  # the marathon\nt2i 1\n", encoding="utf-8")
    got = parse_queries(["t2i:5,2", str(listed), "i2t:0"])
    assert got == {"t2i": [5, 2, 12, 1], "i2t": [3, 0]}


def test_same_split_refuses_other_data(world, tmp_path):
    data, ckpts = world
    other_data, other = precomp_world(tmp_path / "other")
    kw = {"split": "testall", "samples": 0, "worst": 0, "device": "cpu"}
    a, _ = build_report([ckpts["tower"]], data=data, out=tmp_path / "a", **kw)
    kw["split"] = "test"
    b, _ = build_report([other["tower"]], data=other_data, out=tmp_path / "b", **kw)
    with pytest.raises(
        ValueError,
        match=r"^compare X: its split holds 6 images x 30 captions, the report's 10 x 50",
    ):
        same_split(a, b, name="X")
    same_split(b, b, name="X")  # the same split passes


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        (["--queries", "t2i:30"], r"queries: t2i query 30 is out of range \(the split has 30 "),
        (["--queries", "i2t:6"], r"queries: i2t query 6 is out of range \(the split has 6 images"),
        (["--queries", "img:1"], r"--queries img:1: neither DIRECTION:I,J,\.\.\. "),
        (["--queries", "t2i:a"], r"--queries t2i:a: 'a' is not a query index$"),
        (["--compare", "MISSING"], r"--compare \S*nosuch.pt: missing"),
    ],
)
def test_cli_errors_are_one_line(world, tmp_path, capsys, extra, match):
    data, ckpts = world
    extra = [str(tmp_path / "nosuch.pt") if e == "MISSING" else e for e in extra]
    argv = ["report", str(ckpts["tower"]), "--data", str(data), "--out", str(tmp_path / "out")]
    argv += ["--split", "test"]
    assert main([*argv, *extra, "--samples", "0", "--worst", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("vlret report: "), err
    assert re.search(match, err), err


def test_cli_compare_prints_both_tables_and_writes_both_lists(world, tmp_path, capsys):
    data, ckpts = world
    argv = ["report", str(ckpts["tower"]), "--compare", str(ckpts["bfan"]), "--data", str(data)]
    argv += ["--split", "test", "--queries", "t2i:3,1", "--out", str(tmp_path / "r")]
    assert main([*argv, "--samples", "0", "--worst", "0", "--top-k", "2"]) == 0
    out = capsys.readouterr().out
    assert out.count("rsum") >= 2 and out.strip().endswith(str(tmp_path / "r" / "index.html"))
    found = chosen_sections((tmp_path / "r" / "index.html").read_text(encoding="utf-8"))
    assert [(d, q, len(a), len(b)) for d, q, a, b in found] == [("t2i", 3, 2, 2), ("t2i", 1, 2, 2)]
