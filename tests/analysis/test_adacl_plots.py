"""AdaCL stats log (JSON lines) and the margins plot."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from vlret.analysis.adacl_plots import append_stats, load_stats, plot_adacl_margins
from vlret.losses import AdaCLLoss


def _train_log(path: Path, steps: int = 6) -> list[dict]:
    g = torch.Generator().manual_seed(0)
    loss = AdaCLLoss()
    logged = []
    for k in range(steps):
        img = torch.nn.functional.normalize(torch.randn(10, 16, generator=g), dim=1)
        txt = torch.nn.functional.normalize(img + 0.7 * torch.randn(10, 16, generator=g), dim=1)
        sim = img @ txt.t()
        if k == 2:
            sim.fill_diagonal_(1.0)  # every positive is 1: the anchor guard fires
        loss.from_similarity(sim)
        append_stats(path, loss.last_stats)
        logged.append(loss.last_stats)
    return logged


def test_append_and_load_round_trip(tmp_path: Path):
    path = tmp_path / "logs" / "adacl.jsonl"
    logged = _train_log(path)
    records = load_stats(path)
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6]
    assert [r["m1"] for r in records] == [s["m1"] for s in logged]
    assert records[2]["guard"] == "anchor_ge_one"
    for line in path.read_text().splitlines():
        json.loads(line)  # strict JSON, one object per line


def test_non_finite_values_are_written_as_null(tmp_path: Path):
    path = tmp_path / "s.jsonl"
    append_stats(path, {"m1": 20.0, "m2": 0.1, "anchor": float("nan")})
    assert json.loads(path.read_text())["anchor"] is None
    assert load_stats(path)[0]["step"] == 1


def test_plot_writes_a_png(tmp_path: Path):
    stats = tmp_path / "adacl.jsonl"
    _train_log(stats)
    files = plot_adacl_margins(stats, tmp_path / "plots")
    assert files == [tmp_path / "plots" / "adacl_margins.png"]
    assert files[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_plot_adacl_margins(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    from vlret.cli import main

    log = tmp_path / "adacl.jsonl"
    _train_log(log)
    out = tmp_path / "figs"
    assert main(["plot", "adacl-margins", "--stats", str(log), "--out", str(out)]) == 0
    png = out / "adacl_margins.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert str(png) in capsys.readouterr().out
    assert main(["plot", "adacl-margins", "--out", str(out)]) == 2  # one line, not SystemExit
    assert "--stats" in capsys.readouterr().err


def test_missing_file_is_named(tmp_path: Path):
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        plot_adacl_margins(missing, tmp_path)


@pytest.mark.parametrize(
    "second_line, message",
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "expected a JSON object"),
        ('{"m1": 3.0}', "missing required key 'm2'"),
        ('{"m1": "big", "m2": 0.1}', "'m1' must be a number"),
        ('{"m1": 3.0, "m2": 0.1, "anchor": "x"}', "'anchor' must be a number"),
    ],
)
def test_bad_line_is_named_with_its_number(tmp_path: Path, second_line: str, message: str):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"m1": 20.0, "m2": 0.1}\n\n' + second_line + "\n")
    with pytest.raises(ValueError, match=rf"bad.jsonl:3: {message}"):
        plot_adacl_margins(path, tmp_path)


def test_empty_log_is_rejected(tmp_path: Path):
    path = tmp_path / "empty.jsonl"
    path.write_text("\n")
    with pytest.raises(ValueError, match="no stats records"):
        load_stats(path)
