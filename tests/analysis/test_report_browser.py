"""The report in a real browser: headless Chromium (Debian's ``chromium`` package; ``.ci/run``
installs it when missing) opens ``index.html`` from ``file://``, logs no console message, keeps
every query section in its DOM, and its screenshot is not blank; each query is laid out as
heading, query, top-K list, ground-truth line, then the cards of the ground truths below the top
K (pictures for text queries). Skipped, with the reason, where Chromium is not installed."""

from __future__ import annotations

import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from report_helpers import karpathy_world, parse_report, precomp_world
from vlret.analysis.report import build_report

BROWSER = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(
    BROWSER is None,
    reason="chromium not installed: apt-get install -y chromium (.ci/run installs it) to render "
    "the report in a real browser",
)
#: a console line of Chromium's stderr log (``--enable-logging=stderr``): any message a page
#: script or the page's loading writes to the console, errors included
CONSOLE = re.compile(r":CONSOLE[:(]")


def chromium(page: Path, tmp: Path, *flags: str) -> subprocess.CompletedProcess:
    assert BROWSER is not None
    argv = [
        BROWSER,
        "--headless",
        "--disable-gpu",
        "--no-sandbox",
        f"--user-data-dir={tmp / 'profile'}",
        "--enable-logging=stderr",
        "--v=0",
        *flags,
        page.resolve().as_uri(),
    ]
    return subprocess.run(argv, capture_output=True, text=True, timeout=180, check=False)


def screenshot(page: Path, tmp: Path) -> tuple[np.ndarray, str]:
    png = tmp / "shot.png"
    done = chromium(page, tmp, f"--screenshot={png}", "--window-size=1200,2000")
    assert done.returncode == 0, done.stderr[-2000:]
    with Image.open(png) as im:
        assert im.size == (1200, 2000)
        pixels = np.asarray(im.convert("L"), dtype=np.float64)
    return pixels, done.stderr


def console_lines(log: str) -> list[str]:
    return [line for line in log.splitlines() if CONSOLE.search(line)]


def test_the_console_check_sees_a_script_error(tmp_path):
    """The detector itself: a page whose script fails is caught (so a clean log means
    something)."""
    page = tmp_path / "bad.html"
    page.write_text("<html><body><p>x</p><script>undefinedFunction();</script></body></html>")
    _, log = screenshot(page, tmp_path)
    assert any("undefinedFunction" in line for line in console_lines(log)), log[-2000:]


@pytest.mark.parametrize("world", ["karpathy", "precomp-scan"])
def test_chromium_renders_the_report(tmp_path, world):
    if world == "karpathy":
        data, ckpt = karpathy_world(tmp_path)
    else:
        data, ckpts = precomp_world(tmp_path)
        ckpt = ckpts["scan"]
    out = tmp_path / "report"
    build_report([ckpt], data=data, split="test", out=out, samples=3, worst=3, device="cpu")
    page = out / "index.html"
    pixels, log = screenshot(page, tmp_path)
    assert console_lines(log) == []
    # not blank: text, tables, bars and thumbnails give a spread of grey levels
    assert pixels.std() > 20, pixels.std()
    assert (pixels < 128).mean() > 0.005  # some dark ink on the white page
    done = chromium(page, tmp_path, "--dump-dom")
    assert done.returncode == 0, done.stderr[-2000:]
    _, record = parse_report(out)
    assert done.stdout.count('class="query"') == len(record["queries"]) > 0
    assert "Rank histograms" in done.stdout


class Layout(HTMLParser):
    """Each query section of the DOM Chromium built: its direct children in order, as
    ``tag.class`` (``ol.results``, ``ol.results.truths``, ``p.gtline`` ...), and the images
    inside its cards of the ground truths below the top K."""

    def __init__(self) -> None:
        super().__init__()
        self.sections: list[list[str]] = []
        self.truth_images: list[list[str]] = []
        self._depth = 0  # inside a section: 1 for its direct children
        self._in_truths = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        classes = str(a.get("class") or "").split()
        if tag == "section" and "query" in classes:
            self.sections.append([])
            self.truth_images.append([])
            self._depth = 1
            return
        if not self._depth:
            return
        if self._depth == 1:
            self.sections[-1].append(".".join([tag, *classes]))
            self._in_truths = tag == "ol" and "truths" in classes
        if tag == "img" and self._in_truths:
            self.truth_images[-1].append(str(a.get("src")))
        if tag not in VOID:
            self._depth += 1

    def handle_endtag(self, tag: str) -> None:
        if self._depth and tag not in VOID:
            self._depth -= 1
            if self._depth == 1:
                self._in_truths = False


#: elements without an end tag
VOID = {"img", "br", "meta", "input", "hr", "link", "source", "wbr"}


def test_chromium_lays_out_each_query_in_order(tmp_path):
    """In the browser's DOM every query is: its heading, the query, the top-K list, the line
    about its ground truth, then (when some rank below the top K) their cards, with pictures
    for text queries."""
    data, ckpt = karpathy_world(tmp_path)
    out = tmp_path / "report"
    build_report([ckpt], data=data, split="test", out=out, samples=3, worst=3, top_k=1)
    done = chromium(out / "index.html", tmp_path, "--dump-dom")
    assert done.returncode == 0, done.stderr[-2000:]
    layout = Layout()
    layout.feed(done.stdout)
    _, record = parse_report(out)
    assert len(layout.sections) == len(record["queries"]) > 0
    with_cards = 0
    for q, children, images in zip(
        record["queries"], layout.sections, layout.truth_images, strict=True
    ):
        order = [c for c in children if c.split(".")[0] in ("h4", "ol", "p") or c == "img"]
        query = ["p.qtext"] if q["direction"] == "t2i" else ["img"]
        below = [g for g in q["ground_truth"] if g["position"] > 1]
        tail = ["ol.results.truths"] if below else []
        assert order == ["h4", *query, "ol.results", "p.gtline", *tail], order
        if below and q["direction"] == "t2i":
            assert images == [f"thumbs/{g['index']}.jpg" for g in below[:10]]
            with_cards += 1
    assert with_cards > 0
