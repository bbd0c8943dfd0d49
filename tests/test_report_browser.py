"""The report in a real browser: headless Chromium (Debian's ``chromium`` package; ``.ci/run``
installs it when missing) opens ``index.html`` from ``file://``, logs no console message, keeps
every query section in its DOM, and its screenshot is not blank. Skipped, with the reason,
where Chromium is not installed."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from test_report import karpathy_world, parse_report, precomp_world
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
