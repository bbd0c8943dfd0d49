"""vlret compare under a person-search protocol: a tiny `vlret synth persons` world, a tiny
CLIP from scratch, two losses x two seeds of one epoch; the tables hold the identity-level
metrics, and each run's values are its own `vlret eval` record."""

from __future__ import annotations

import csv
import json
import statistics
from pathlib import Path

import pytest
import yaml

from pedes_helpers import TINY_CLIP
from vlret.analysis.compare import CompareError, compare
from vlret.analysis.tables import IDENTITY_COLUMNS, IDENTITY_KEYS
from vlret.cli import main
from vlret.worlds.persons import write_persons

pytest.importorskip("transformers")
pytest.importorskip("matplotlib")

LOSSES = ["infonce", "sdm+id"]


def _raw(world: Path, out: Path) -> dict:
    return {
        "output_dir": str(out),
        "data": {"root": str(world), "format": "cuhk-pedes"},
        "model": {"kind": "clip", "preset": "ViT-B-32", "tokenizer": "bytes", "config": TINY_CLIP},
        "loss": {"name": "infonce"},
        "optim": {"lr": 1e-4},
        "train": {
            "epochs": 1,
            "batch_size": 8,
            "progress": False,
            "eval_batch_size": 16,
            "max_steps_per_epoch": 2,
            "device": "cpu",
        },
        # no protocol: the registry's default for cuhk-pedes data (cuhk-pedes)
        "compare": {"split": "test", "losses": {"infonce": {}, "sdm+id": {}}},
    }


@pytest.fixture(scope="module")
def person_compare(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("persons")
    world = tmp / "world"
    write_persons(
        world, sizes={"train": 8, "val": 4, "test": 4}, images_per_id=2, height=32, width=16
    )
    config = tmp / "persons_compare.yaml"
    config.write_text(yaml.safe_dump(_raw(world, tmp / "base"), sort_keys=False))
    report = compare(config, losses=LOSSES, seeds=2, out=tmp / "out", progress=False)
    return world, report


def _eval_record(run_dir: Path, world: Path, tmp: Path) -> dict:
    out = tmp / f"{run_dir.parent.name}-{run_dir.name}.json"
    args = ["eval", str(run_dir / "best.pt"), "--data", str(world), "--split", "test"]
    assert main([*args, "--protocol", "cuhk-pedes", "--json", str(out), "--no-progress"]) == 0
    return json.loads(out.read_text())


def test_tables_hold_each_runs_own_vlret_eval_identity_metrics(person_compare, tmp_path):
    world, report = person_compare
    assert [s.label for s in report.summaries] == LOSSES
    evaluated: dict[str, list[dict]] = {}
    for outcome in report.outcomes:
        record = _eval_record(outcome.spec.run_dir, world, tmp_path)
        assert record["protocol"] == "cuhk-pedes" and record["split"] == "test"
        stored = json.loads((outcome.spec.run_dir / "result.json").read_text())
        assert stored["metrics"] == record["metrics"] and "synthetic" not in stored
        assert {k: outcome.result.metrics[k] for k in IDENTITY_KEYS} == record["metrics"]
        evaluated.setdefault(outcome.spec.variant.label, []).append(record["metrics"])
    text = report.table_text()
    header = next(line for line in text.splitlines() if line.startswith("| Loss"))
    assert header == "| Loss | " + " | ".join(h for _, h in IDENTITY_COLUMNS) + " |"
    assert header.split(" | ")[1:3] == ["T→I R@1", "T→I R@5"] and "rsum" not in text
    assert "identity level" in text and "Synthetic world" not in text
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[0] in LOSSES:
            rows[cells[0]] = cells[1:]
    assert set(rows) == set(LOSSES)
    for summary in report.summaries:
        runs = evaluated[summary.label]
        cells = rows[summary.label]
        for (key, _), cell in zip(IDENTITY_COLUMNS, cells, strict=True):
            values = [r[key] for r in runs]
            mean, std = statistics.fmean(values), statistics.stdev(values)
            assert summary.mean[key] == pytest.approx(mean, abs=1e-9)
            assert summary.std[key] == pytest.approx(std, abs=1e-9)
            assert cell.strip("*") == f"{mean:.1f} ± {std:.1f}", (summary.label, key)
            best = max(statistics.fmean(r[key] for r in evaluated[s]) for s in LOSSES)
            assert cell.startswith("**") == (round(mean, 1) == round(best, 1)), key
    with open(report.results_csv, newline="", encoding="utf-8") as fh:
        table = list(csv.DictReader(fh))
    assert list(table[0])[4:] == list(IDENTITY_KEYS)
    per_seed = [r for r in table if r["seed"] not in ("mean", "std")]
    assert len(per_seed) == 4
    for row in per_seed:
        want = evaluated[row["label"]][int(row["seed"])]
        assert {k: float(row[k]) for k in IDENTITY_KEYS} == want
    results = json.loads(report.results_json.read_text())
    assert results["protocol"] == "cuhk-pedes" and results["split"] == "test"
    for variant in results["variants"]:
        assert set(variant["mean"]) == set(IDENTITY_KEYS)
        assert [r["metrics"] for r in variant["runs"]] == evaluated[variant["label"]]


def test_runs_select_on_t2i_r1_and_the_curves_plot_it(person_compare):
    _, report = person_compare
    for outcome in report.outcomes:
        lines = (outcome.spec.run_dir / "metrics.jsonl").read_text().splitlines()
        epoch = next(r for r in map(json.loads, lines) if r["kind"] == "epoch")
        assert epoch["select_on"] == "identity_t2i_r1" and epoch["best_epoch"] == 0
        assert epoch["best_identity_t2i_r1"] == epoch["dev_identity_t2i_r1"]
    curves = report.curves.read_text()
    assert curves.startswith("### Dev identity_t2i_r1 (selects best.pt)")
    assert "Dev rsum" in curves  # the caption-level curve is still there, after it
    assert any(p.name == "curves_loss_rsum.png" for p in report.plots)


def test_an_unknown_select_on_fails_before_any_run(tmp_path):
    world = tmp_path / "world"
    write_persons(world, sizes={"train": 4, "val": 2, "test": 2}, images_per_id=2)
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(_raw(world, tmp_path / "base"), sort_keys=False))
    with pytest.raises(CompareError, match=r"train\.select_on: unknown dev metric 't2i_medr'"):
        compare(
            config,
            losses=["infonce"],
            out=tmp_path / "out",
            progress=False,
            overrides=["train.select_on=t2i_medr"],
        )
    assert not (tmp_path / "out" / "runs").exists()


#: today's identity-level key -> as earlier releases wrote it (IRRA's labels)
OLD_SPELLING = {
    f"identity_{d}_{k}": f"{d}_{old}"
    for d in ("t2i", "i2t")
    for k, old in (("r1", "R1"), ("r5", "R5"), ("r10", "R10"), ("map", "mAP"), ("minp", "mINP"))
}


def _old(key: str) -> str:
    """A key of today as an earlier release wrote it: dev_identity_t2i_r1 -> dev_t2i_R1."""
    for new, old in OLD_SPELLING.items():
        if key.endswith(new):
            return key[: -len(new)] + old
    return key


def test_results_and_logs_of_the_older_key_spelling_still_read(person_compare):
    """Run folders written before the key rename (result.json and metrics.jsonl with t2i_R1,
    dev_t2i_R1, best_t2i_R1, select_on t2i_R1): a comparison reads them as cached runs and
    makes the same table, and plots the same selection metric. Runs last: it rewrites them."""
    world, report = person_compare
    before = {s.label: dict(s.mean) for s in report.summaries}
    for outcome in report.outcomes:
        result = outcome.spec.run_dir / "result.json"
        record = json.loads(result.read_text())
        record["metrics"] = {_old(k): v for k, v in record["metrics"].items()}
        assert "t2i_R1" in record["metrics"]
        result.write_text(json.dumps(record))
        log = outcome.spec.run_dir / "metrics.jsonl"
        rows = []
        for row in map(json.loads, log.read_text().splitlines()):
            row = {_old(k): v for k, v in row.items()}
            if row.get("select_on") in OLD_SPELLING:
                row["select_on"] = OLD_SPELLING[row["select_on"]]
            rows.append(json.dumps(row))
        log.write_text("\n".join(rows) + "\n")
    tmp = world.parent
    again = compare(
        tmp / "persons_compare.yaml", losses=LOSSES, seeds=2, out=tmp / "out", progress=False
    )
    assert all(o.status == "cached" for o in again.outcomes)
    assert {s.label: dict(s.mean) for s in again.summaries} == before
    assert set(next(iter(before.values()))) >= set(IDENTITY_KEYS)
    assert again.curves.read_text().startswith("### Dev identity_t2i_r1 (selects best.pt)")
