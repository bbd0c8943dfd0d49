"""`vlret report` on tiny real-format worlds (a precomputed folder with region boxes, a Karpathy
folder of JPEGs) with seeded random checkpoints (two-tower, SCAN, BFAN, SGRAF): the page read
back names every reported query with the rank counted naively here from the score matrix, its
summary's R@1 is the evaluation's, the pair models' attention equals a naive recomputation."""

from __future__ import annotations

import math
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from report_helpers import (
    QueryParser,
    karpathy_world,
    parse_report,
    persons_world,
    precomp_world,
)
from vlret.analysis.report import build_report, counted_ranks, rank_histogram
from vlret.analysis.report.attention import STOPWORDS
from vlret.analysis.report.data import pick_queries
from vlret.analysis.report.html import TRUTH_CARDS
from vlret.analysis.report.thumbs import THUMB_SIZE
from vlret.cli import main
from vlret.data import PrecompDataset
from vlret.run.builders import load_trained_model
from vlret.run.evaluate import run_evaluation

# -- fixtures -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return precomp_world(tmp_path_factory.mktemp("report"))


@pytest.fixture(scope="module")
def kworld(tmp_path_factory):
    return karpathy_world(tmp_path_factory.mktemp("kreport"))


def naive_ranks(sim: torch.Tensor, relevant: list[list[bool]]) -> list[int]:
    """1-based: 1 + the non-relevant entries of the row scoring >= its best relevant one."""
    out = []
    for r in range(sim.shape[0]):
        row = [float(v) for v in sim[r]]
        rel = [c for c in range(len(row)) if relevant[r][c]]
        best = max(row[c] for c in rel)
        out.append(1 + sum(1 for c, v in enumerate(row) if c not in rel and v >= best))
    return out


def blocks_of(facts) -> list[tuple[int, int, int, int]]:
    n_img, n_txt = facts.scores.shape
    if facts.protocol.folds == 1:
        return [(0, n_img, 0, n_txt)]
    size, t2i = n_img // facts.protocol.folds, facts.txt_to_img.tolist()
    out = []
    for f in range(facts.protocol.folds):
        texts = [j for j, i in enumerate(t2i) if f * size <= i < (f + 1) * size]
        out.append((f * size, (f + 1) * size, texts[0], texts[-1] + 1))
    return out


def expected_ranks(facts) -> dict[str, dict[int, int]]:
    """Every query's rank, counted per fold block with plain Python loops."""
    t2i = facts.txt_to_img.tolist()
    want: dict[str, dict[int, int]] = {"i2t": {}, "t2i": {}}
    for i0, i1, t0, t1 in blocks_of(facts):
        block = facts.scores[i0:i1, t0:t1]
        own = [[t2i[t] == i for t in range(t0, t1)] for i in range(i0, i1)]
        i2t = naive_ranks(block, own)
        t2i_r = naive_ranks(block.t(), [list(col) for col in zip(*own, strict=True)])
        want["i2t"].update({i0 + r: v for r, v in enumerate(i2t)})
        want["t2i"].update({t0 + r: v for r, v in enumerate(t2i_r)})
    return want


def check_page(facts, out: Path, *, samples: int, worst: int) -> QueryParser:
    """The page and report.json against the naive ranks, top-K lists and R@1."""
    page, record = parse_report(out)
    want = expected_ranks(facts)
    sizes = (len(facts.image_ids), len(facts.captions))
    expected = sum(min(samples, n) + min(worst, n) for n in sizes)
    assert len(page.queries) == len(record["queries"]) == expected
    for q in record["queries"]:
        key = (q["direction"], q["group"], q["query"])
        rank = want[q["direction"]][q["query"]]
        assert page.queries[key] == q["rank"] == rank, key
        noun = "Caption" if q["direction"] == "t2i" else "Image"
        assert page.headings[key].startswith(f"{noun} {q['query']}")
        assert page.headings[key].endswith(f"ground truth at rank {rank}")
        # the top-K list: the row's scores sorted (ties by index), ground truths marked
        row = facts.scores[q["query"]] if q["direction"] == "i2t" else facts.scores[:, q["query"]]
        inside = [c for c in range(row.numel()) if not math.isnan(float(row[c]))]
        order = sorted(inside, key=lambda c: (-float(row[c]), c))[: facts.top_k]
        t2i = facts.txt_to_img.tolist()
        if q["direction"] == "i2t":
            truths = [t2i[c] == q["query"] for c in order]
        else:
            truths = [c == t2i[q["query"]] for c in order]
        assert page.items[key] == list(zip(order, truths, strict=True))
        # each ground truth's position in the whole ranked list (the other truths above count),
        # listed in rank order; those below the top K are shown as cards in that order
        ranked = sorted(inside, key=lambda c: (-float(row[c]), c))
        if q["direction"] == "i2t":
            relevant = [c for c in inside if t2i[c] == q["query"]]
        else:
            relevant = [t2i[q["query"]]]
        listed = [(g["index"], g["position"]) for g in q["ground_truth"]]
        assert listed == sorted(((c, ranked.index(c) + 1) for c in relevant), key=lambda t: t[1])
        below = [(c, n) for c, n in listed if n > len(order)]
        assert page.truths.get(key, []) == below[:TRUTH_CARDS]
        assert [t["score"] for t in q["top"]] == pytest.approx([float(row[c]) for c in order])
    # the worst queries are the highest ranks; the sampled ones are as many as asked
    for d in ("i2t", "t2i"):
        worst_ranks = [
            q["rank"] for q in record["queries"] if (q["direction"], q["group"]) == (d, "worst")
        ]
        assert worst_ranks == sorted(want[d].values(), reverse=True)[: len(worst_ranks)]
        assert len(worst_ranks) == min(worst, len(want[d]))
        n_sampled = sum((q["direction"], q["group"]) == (d, "sampled") for q in record["queries"])
        assert n_sampled == min(samples, len(want[d]))
    # R@1: the summary's is the evaluation's, and the naive ranks give it
    metrics = record["evaluation"]["metrics"]
    assert metrics == facts.evaluation.metrics.as_dict()
    for d in ("i2t", "t2i"):
        naive_r1 = recall_at_1(want[d], facts, d)
        assert metrics[f"{d}_r1"] == pytest.approx(naive_r1, abs=1e-9)
        assert f"<td>{metrics[f'{d}_r1']:.2f}</td>" in (out / "index.html").read_text(
            encoding="utf-8"
        )
    return page


def recall_at_1(ranks: dict[int, int], facts, direction: str) -> float:
    """100 x the fraction of rank-1 queries (COCO 1K: the mean over the folds)."""
    if facts.protocol.folds == 1:
        return 100.0 * sum(r == 1 for r in ranks.values()) / len(ranks)
    per_fold = []
    for i0, i1, t0, t1 in blocks_of(facts):
        span = range(i0, i1) if direction == "i2t" else range(t0, t1)
        per_fold.append(100.0 * sum(ranks[q] == 1 for q in span) / len(span))
    return sum(per_fold) / len(per_fold)


def report(ckpts: list[Path], data: Path, split: str, out: Path, **options):
    return build_report(ckpts, data=data, split=split, out=out, device="cpu", **options)


# -- ranks, lists and summary -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("names", "split", "protocol"),
    [
        (("tower",), "test", None),
        (("scan",), "test", "f30k"),
        (("tower",), "testall", "coco1k"),
        (("tower", "scan"), "test", None),
    ],
)
def test_page_names_every_query_with_its_naive_rank(world, tmp_path, names, split, protocol):
    data, ckpts = world
    facts, page = report(
        [ckpts[n] for n in names], data, split, tmp_path, protocol=protocol, samples=3, worst=4
    )
    assert page == tmp_path / "index.html"
    check_page(facts, tmp_path, samples=3, worst=4)
    evaluation = run_evaluation(
        [str(ckpts[n]) for n in names] if len(names) > 1 else str(ckpts[names[0]]),
        data=data,
        split=split,
        protocol=facts.protocol.name,
        device="cpu",
    )
    assert facts.evaluation.metrics.as_dict() == evaluation.metrics.as_dict()
    assert facts.protocol.name == (protocol or "f30k")


def test_two_tower_scores_are_the_models_cosines(world, tmp_path):
    data, ckpts = world
    facts, _ = report([ckpts["tower"]], data, "test", tmp_path, samples=1, worst=1)
    model, run, encoder = load_trained_model(ckpts["tower"])
    dataset = facts.dataset
    with torch.no_grad():
        img = torch.cat([model.encode_images(dataset.image(i)[None]) for i in range(6)])
        txt = torch.cat(
            [
                model.encode_texts(c[None], torch.tensor([len(c)]))
                for c in map(dataset.caption, range(30))
            ]
        )
    cos = F.normalize(img.double(), dim=1) @ F.normalize(txt.double(), dim=1).t()
    # float32 encodings and products against float64: a few ulps of numbers of size 1
    torch.testing.assert_close(facts.scores.double(), cos, atol=1e-5, rtol=0)


def test_counted_ranks_count_ties_against_the_query():
    sim = torch.zeros(2, 5)  # collapsed: every score equal
    relevant = torch.tensor([[1, 0, 0, 0, 0], [0, 1, 1, 0, 0]], dtype=torch.bool)
    assert counted_ranks(sim, relevant).tolist() == [5, 4]  # never first
    sim = torch.tensor([[0.1, 0.9, 0.1, 0.5, 0.2]])
    assert counted_ranks(sim, torch.tensor([[0, 0, 1, 0, 1]], dtype=torch.bool)).tolist() == [3]
    with pytest.raises(ValueError, match="query 0 has no relevant"):
        counted_ranks(sim, torch.zeros(1, 5, dtype=torch.bool))


def test_rank_histogram_counts_each_bin():
    ranks = [1, 1, 2, 5, 6, 10, 11, 30, 700]
    bins = rank_histogram(ranks, 800)
    counts = {b["bin"]: b["count"] for b in bins}
    assert counts == {
        "1": 2, "2-5": 2, "6-10": 2, "11-20": 1, "21-50": 1, "51-100": 0, "101-500": 0,
        "501-800": 1,
    }  # fmt: skip
    assert sum(counts.values()) == len(ranks)
    assert [b["bin"] for b in rank_histogram([1, 3], 3)] == ["1", "2-3"]


def test_pick_queries_draws_without_replacement_and_sorts_the_worst():
    ranks = torch.tensor([3, 1, 7, 7, 2, 5])
    picked = pick_queries(ranks, samples=4, worst=3, seed=0)
    assert len(set(picked["sampled"])) == 4 and picked["sampled"] == sorted(picked["sampled"])
    assert picked["worst"] == [2, 3, 5]  # ties: lower index first
    assert pick_queries(ranks, samples=4, worst=3, seed=0) == picked
    assert pick_queries(ranks, samples=10, worst=0, seed=1) == {
        "sampled": [0, 1, 2, 3, 4, 5],
        "worst": [],
    }


# -- pair models: word attention --------------------------------------------------------------


def naive_attention(regions: torch.Tensor, words: torch.Tensor, lam: float, focal):
    """SCAN Eq. 1-2 in plain loops, float64: LeakyReLU(0.1) of <e_k, v_j>, each region's
    column L2-normalised over the words (+1e-8), softmax over regions of lambda x that;
    BFAN's focal rule after it."""
    L, R = words.shape[0], regions.shape[0]
    s = [[float(words[k].double() @ regions[j].double()) for j in range(R)] for k in range(L)]
    s = [[v if v > 0 else 0.1 * v for v in row] for row in s]
    norms = [math.sqrt(sum(s[k][j] ** 2 for k in range(L))) + 1e-8 for j in range(R)]
    out = []
    for k in range(L):
        e = [math.exp(lam * s[k][j] / norms[j]) for j in range(R)]
        w = [v / sum(e) for v in e]
        if focal is not None:
            score = [
                sum((w[i] - w[j]) * (math.sqrt(w[j]) if focal == "prob" else 1) for j in range(R))
                for i in range(R)
            ]
            keep = [score[i] > 0 for i in range(R)]
            if not any(keep):
                keep = [w[i] == max(w) for i in range(R)]
            total = sum(w[i] for i in range(R) if keep[i])
            w = [w[i] / total if keep[i] else 0.0 for i in range(R)]
        out.append(w)
    return torch.tensor(out, dtype=torch.float64)


@pytest.mark.parametrize("name", ["scan", "bfan", "sgraf"])
def test_word_attention_sums_to_one_and_equals_a_naive_recomputation(world, tmp_path, name):
    data, ckpts = world
    facts, _ = report([ckpts[name]], data, "test", tmp_path, samples=2, worst=2)
    _, record = parse_report(tmp_path)
    model, _, _ = load_trained_model(ckpts[name])
    lam = model.scorer.lambda_softmax if name == "sgraf" else model.lambda_softmax
    dataset = facts.dataset
    seen = 0
    for q in record["queries"]:
        assert q["attention"], q
        assert q["attention"][0]["role"] == "top-1"
        for att in q["attention"]:
            weights = torch.tensor(att["weights"], dtype=torch.float64)
            assert weights.shape == (4,)
            assert float(weights.sum()) == pytest.approx(1.0, abs=1e-12)
            ids = dataset.caption(att["caption"])
            with torch.no_grad():
                regions = model.encode_images(dataset.image(att["image"])[None])[0]
                words = model.encode_texts(ids[None], torch.tensor([len(ids)]))[0]
            naive = naive_attention(regions, words, lam, getattr(model, "focal", None))
            torch.testing.assert_close(weights, naive[att["word"]], atol=1e-9, rtol=0)
            assert att["tokens"] == [dataset.encoder.idx2word[int(i)] for i in ids]
            chosen = att["tokens"][att["word"]]
            assert chosen not in STOPWORDS and chosen not in ("<start>", "<end>")
            assert any(c.isalnum() for c in chosen)
            seen += 1
    assert seen >= 8
    html = (tmp_path / "index.html").read_text(encoding="utf-8")
    assert html.count('<svg class="boxes"') == seen  # test_boxes.npy: boxes, not bars


def test_word_option_and_bars_without_boxes(world, tmp_path):
    data, ckpts = world
    plain = tmp_path / "plain"
    shutil.copytree(data, plain)
    (plain / "test_boxes.npy").unlink()
    word = PrecompDataset(plain, "test").captions[0].split()[1].lower()
    report([ckpts["scan"]], plain, "test", tmp_path / "a", samples=6, worst=0, word=word)
    _, record = parse_report(tmp_path / "a")
    maps = [a for q in record["queries"] for a in q["attention"]]
    has = [a for a in maps if word in [t.lower() for t in a["tokens"]]]
    assert has and all(a["word_text"].lower() == word and not a["fallback"] for a in has)
    assert all(a["fallback"] for a in maps if a not in has)
    html = (tmp_path / "a" / "index.html").read_text(encoding="utf-8")
    assert '<svg class="boxes"' not in html and html.count('<svg class="bars"') == len(maps)


def test_boxes_of_another_shape_are_refused_naming_the_file(world, tmp_path):
    data, ckpts = world
    bad = tmp_path / "bad"
    shutil.copytree(data, bad)
    np.save(bad / "test_boxes.npy", np.zeros((6, 4, 3), dtype=np.float32))
    with pytest.raises(ValueError, match=r"test_boxes.npy: expected \(6, R, 4\) boxes"):
        report([ckpts["scan"]], bad, "test", tmp_path / "out", samples=1, worst=0)


def test_two_tower_report_has_no_attention(world, tmp_path):
    data, ckpts = world
    report([ckpts["tower"]], data, "test", tmp_path, samples=2, worst=1)
    _, record = parse_report(tmp_path)
    assert all(q["attention"] == [] for q in record["queries"])


# -- Karpathy images: thumbnails ----------------------------------------------------------------


def test_karpathy_report_shows_thumbnails_and_naive_ranks(kworld, tmp_path):
    data, ckpt = kworld
    facts, _ = report([ckpt], data, "test", tmp_path, samples=2, worst=3, top_k=3)
    check_page(facts, tmp_path, samples=2, worst=3)
    html = (tmp_path / "index.html").read_text(encoding="utf-8")
    sources = re.findall(r'<img src="([^"]+)"', html)
    assert sources and all(s.startswith("thumbs/") for s in sources)
    for src in set(sources):
        with Image.open(tmp_path / src) as im:
            assert im.format == "JPEG" and max(im.size) == THUMB_SIZE
    # every image of a text query's top-3 has its thumbnail
    _, record = parse_report(tmp_path)
    for q in record["queries"]:
        if q["direction"] == "t2i":
            assert all(f"thumbs/{t['index']}.jpg" in sources for t in q["top"])
    # one folder, no server: no external URL, no script
    assert not re.search(r"(src|href)=\"(https?:|//)", html) and "<script" not in html


def test_text_is_escaped():
    from vlret.analysis.report.html import esc

    assert esc('<b a="1">&') == "&lt;b a=&quot;1&quot;&gt;&amp;"


# -- person search: every image of the person is relevant ------------------------------------


@pytest.fixture(scope="module")
def persons(tmp_path_factory):
    return persons_world(tmp_path_factory.mktemp("preport"))


def test_person_search_ranks_count_every_image_of_the_person(persons, tmp_path):
    world, ckpt = persons
    facts, _ = report([ckpt], world, "test", tmp_path, samples=2, worst=2)
    assert facts.protocol.name == "cuhk-pedes" and facts.by_identity
    img_ids = facts.evaluation.data.image_identity.tolist()
    txt_ids = [img_ids[i] for i in facts.txt_to_img.tolist()]
    assert len(set(img_ids)) < len(img_ids)  # several images per person
    same = [[txt_ids[t] == img_ids[i] for t in range(len(txt_ids))] for i in range(len(img_ids))]
    want = {
        "i2t": dict(enumerate(naive_ranks(facts.scores, same))),
        "t2i": dict(
            enumerate(naive_ranks(facts.scores.t(), [list(c) for c in zip(*same, strict=True)]))
        ),
    }
    page, record = parse_report(tmp_path)
    assert len(record["queries"]) == 8
    for q in record["queries"]:
        key = (q["direction"], q["group"], q["query"])
        assert page.queries[key] == q["rank"] == want[q["direction"]][q["query"]]
        kind = img_ids if q["direction"] == "i2t" else txt_ids
        other = txt_ids if q["direction"] == "i2t" else img_ids
        assert sorted(g["index"] for g in q["ground_truth"]) == [
            c for c in range(len(other)) if other[c] == kind[q["query"]]
        ]
        assert [t["relevant"] for t in q["top"]] == [
            other[t["index"]] == kind[q["query"]] for t in q["top"]
        ]
    metrics = record["evaluation"]["metrics"]
    for d in ("i2t", "t2i"):
        r1 = 100.0 * sum(r == 1 for r in want[d].values()) / len(want[d])
        assert metrics[f"identity_{d}_r1"] == pytest.approx(r1, abs=1e-9)
    # the person pictures are shown although the model reads their precomputed features
    assert (tmp_path / "thumbs").is_dir() and any((tmp_path / "thumbs").iterdir())


# -- the command line -------------------------------------------------------------------------


def test_cli_writes_the_report_and_prints_its_page(world, tmp_path, capsys):
    data, ckpts = world
    argv = ["report", ckpts["scan"], "--data", data, "--split", "test", "--out", tmp_path]
    assert main([str(a) for a in [*argv, "--top-k", "2", "--samples", "1", "--worst", "1"]]) == 0
    out = capsys.readouterr().out
    assert out.strip().endswith(str(tmp_path / "index.html"))
    _, record = parse_report(tmp_path)
    assert all(len(q["top"]) == 2 for q in record["queries"]) and len(record["queries"]) == 4


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (
            {"checkpoint": "missing.pt"},
            r"^vlret report: \S*missing.pt: missing; expected a run folder or a checkpoint$",
        ),
        ({"--split": "nosuch"}, r"^vlret report: --split: expected one of .*got 'nosuch'$"),
        ({"--top-k": "0"}, r"^vlret report: --top-k: expected a positive integer, got 0$"),
        ({"--worst": "-1"}, r"^vlret report: --worst: expected an integer >= 0, got -1$"),
        ({"--protocol": "nope"}, r"^vlret report: --protocol: expected one of .*got 'nope'$"),
        (  # ranks classes, not captions: vlret eval runs it
            {"--protocol": "zeroshot-classification"},
            r"^vlret report: --protocol: expected one of f30k, .*rstpreid, "
            r"got 'zeroshot-classification'$",
        ),
        (
            {"--split": "testall", "--protocol": "f30k"},
            r"^vlret report: \S+tower.pt: protocol f30k .* not 'testall'$",
        ),
    ],
)
def test_cli_bad_input_is_one_line_naming_the_argument(world, tmp_path, capsys, change, match):
    data, ckpts = world
    args = {"checkpoint": str(ckpts["tower"]), "--data": str(data), "--split": "test"}
    if change.get("checkpoint") == "missing.pt":
        change = {"checkpoint": str(tmp_path / "missing.pt")}
    args.update(change)
    argv = ["report", args.pop("checkpoint"), "--out", str(tmp_path / "out")]
    for flag, value in args.items():
        argv += [flag, value]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and re.match(match, err), err


def test_a_synthetic_world_read_from_features_shows_its_rendered_pictures(tmp_path):
    from PIL import Image

    from vlret.analysis.report.thumbs import world_pictures, write_thumb
    from vlret.captioning.images import split_images
    from vlret.worlds import write_synthetic

    root = tmp_path / "world"
    write_synthetic("tiny", root, format="precomp", seed=3)
    assert world_pictures(tmp_path, "test") is None  # not a world
    render = world_pictures(root, "test")
    assert render is not None

    class FeaturesOnly:  # a precomp split: features, no pictures
        def image_source(self, index):
            raise NotImplementedError

    thumb = write_thumb(FeaturesOnly(), 2, tmp_path / "out", fallback=render)
    assert thumb is not None and thumb.path == "thumbs/2.jpg"
    picture = split_images(root, "test", format="precomp").load(2)
    assert (thumb.source_width, thumb.source_height) == picture.size
    with Image.open(tmp_path / "out" / thumb.path) as shown:
        assert max(shown.size) == 160
    assert write_thumb(FeaturesOnly(), 2, tmp_path / "none") is None
