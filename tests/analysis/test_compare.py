"""The comparison runner and the compare / sweep / synth commands on tiny precomp data."""

from __future__ import annotations

import csv
import json
import os
import signal
import statistics
import sys
import types
from pathlib import Path

import pytest
import torch
import yaml

from train_helpers import tiny_data, tiny_raw
from vlret.analysis.compare import (
    CompareError,
    compare,
    parse_param,
    read_compare_config,
    resolve_variants,
    run_config,
    sweep,
)
from vlret.analysis.tables import (
    SUBSET_COLUMNS,
    SYNTHETIC_COLUMNS,
    SYNTHETIC_KEYS,
    TABLE_COLUMNS,
)
from vlret.cli import main
from vlret.data.formats import open_dataset
from vlret.eval import encode_dataset
from vlret.run.builders import load_trained_model
from vlret.run.config import config_from_dict
from vlret.run.evaluate import evaluate_checkpoint
from vlret.train import Trainer, TrainingInterrupted

pytest.importorskip("matplotlib")


def _config(tmp: Path, *, epochs: int = 1, compare_section: dict | None = None, **loss) -> Path:
    data = tmp / "data"
    if not data.is_dir():
        tiny_data(data)
    raw = tiny_raw(data, tmp / "base", **loss)
    raw["train"]["epochs"] = epochs
    if compare_section is not None:
        raw["compare"] = compare_section
    path = tmp / f"cfg_e{epochs}.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def two_by_two(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cmp")
    cfg = _config(tmp, compare_section={"losses": {"unified": {"margin": 0.1, "gamma": 30.0}}})
    report = compare(cfg, losses=["triplet", "unified"], seeds=2, out=tmp / "out", progress=False)
    return cfg, tmp / "out", report


def test_compare_results_equal_recomputed_metrics(two_by_two):
    _, out, report = two_by_two
    assert report.count("trained") == 4
    doc = json.loads((out / "results.json").read_text(encoding="utf-8"))
    assert [v["label"] for v in doc["variants"]] == ["triplet", "unified"]
    assert doc["variants"][1]["params"] == {"margin": 0.1, "gamma": 30.0}
    rows = list(csv.DictReader((out / "results.csv").open(encoding="utf-8")))
    for variant in doc["variants"]:
        assert variant["seeds"] == [0, 1]
        for run in variant["runs"]:
            run_dir = Path(run["run_dir"])
            assert run_dir == out / "runs" / variant["label"] / f"seed{run['seed']}"
            stored = yaml.safe_load((run_dir / "config.yaml").read_text(encoding="utf-8"))
            assert stored["train"]["seed"] == run["seed"]
            assert stored["loss"]["name"] == variant["loss"]
            fresh = evaluate_checkpoint(
                run_dir / "best.pt", data=stored["data"]["root"], split="test", protocol="f30k"
            ).as_dict()
            assert run["metrics"] == pytest.approx(fresh)
            (row,) = [
                r for r in rows if r["label"] == variant["label"] and r["seed"] == str(run["seed"])
            ]
            assert float(row["rsum"]) == pytest.approx(fresh["rsum"])
        for key in fresh:
            values = [r["metrics"][key] for r in variant["runs"]]
            assert variant["mean"][key] == pytest.approx(statistics.mean(values))
            assert variant["std"][key] == pytest.approx(statistics.stdev(values))


def test_compare_table_cells_and_bold(two_by_two):
    _, out, _ = two_by_two
    doc = json.loads((out / "results.json").read_text(encoding="utf-8"))
    lines = (out / "table.md").read_text(encoding="utf-8").splitlines()
    for col, (key, _) in enumerate(TABLE_COLUMNS, start=2):
        shown = {v["label"]: round(v["mean"][key], 1) for v in doc["variants"]}
        best = max(shown.values())
        for v in doc["variants"]:
            (row,) = [line for line in lines if line.startswith(f"| {v['label']} |")]
            cell = row.split("|")[col].strip()
            text = f"{v['mean'][key]:.1f} ± {v['std'][key]:.1f}"
            assert cell == (f"**{text}**" if shown[v["label"]] == best else text)


def test_compare_writes_plots_and_dev_similarities(two_by_two):
    _, out, report = two_by_two
    names = {p.name for p in report.plots}
    assert {"curves_loss_rsum.png", "curves_similarity.png"} <= names
    for p in report.plots:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    log = out / "runs" / "triplet" / "seed0" / "metrics.jsonl"
    epochs = [json.loads(line) for line in log.read_text().splitlines() if '"epoch"' in line]
    epoch_recs = [r for r in epochs if r["kind"] == "epoch"]
    assert len(epoch_recs) == 1
    assert -1.0 <= epoch_recs[0]["dev_pos_sim"] <= 1.0
    assert -1.0 <= epoch_recs[0]["dev_hardest_neg_sim"] <= 1.0


def test_deleted_result_reruns_only_that_run(tmp_path, two_by_two):
    import shutil

    cfg, out0, _ = two_by_two
    out = tmp_path / "out"
    shutil.copytree(out0, out)
    results = sorted(out.glob("runs/*/seed*/result.json"))
    before = {p: p.stat().st_mtime_ns for p in results}
    old = json.loads(results[1].read_text())
    results[1].unlink()
    report = compare(cfg, losses=["triplet", "unified"], seeds=2, out=out, progress=False)
    assert report.count("cached") == 3 and report.count("resumed") == 1
    for p in results:
        if p != results[1]:
            assert p.stat().st_mtime_ns == before[p]
    assert json.loads(results[1].read_text())["metrics"] == old["metrics"]


def test_interrupted_comparison_resumes_unfinished_runs(tmp_path):
    cfg = _config(tmp_path, epochs=2)
    out = tmp_path / "out"
    calls = []

    def interrupt_in_second_run(spec, epoch):
        calls.append((spec.variant.label, spec.seed, epoch))
        if spec.variant.label == "infonce" and epoch == 1:
            os.kill(os.getpid(), signal.SIGINT)  # the trainer saves last.pt at its next step

    with pytest.raises(TrainingInterrupted):
        compare(
            cfg,
            losses=["triplet", "infonce"],
            seeds=1,
            out=out,
            progress=False,
            on_epoch=interrupt_in_second_run,
        )
    assert (out / "runs/triplet/seed0/result.json").is_file()
    assert (out / "runs/infonce/seed0/last.pt").is_file()
    assert not (out / "runs/infonce/seed0/result.json").exists()
    finished_mtime = (out / "runs/triplet/seed0/result.json").stat().st_mtime_ns

    calls.clear()
    report = compare(
        cfg,
        losses=["triplet", "infonce"],
        seeds=1,
        out=out,
        progress=False,
        on_epoch=lambda spec, epoch: calls.append((spec.variant.label, spec.seed, epoch)),
    )
    assert calls == [("infonce", 0, 2)]  # only the unfinished epoch of the unfinished run
    assert report.count("cached") == 1 and report.count("resumed") == 1
    assert (out / "runs/triplet/seed0/result.json").stat().st_mtime_ns == finished_mtime
    log = (out / "runs/infonce/seed0/metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["epoch"] for x in log if '"kind": "epoch"' in x] == [0, 1]


def test_changed_settings_in_same_folder_is_an_error(tmp_path, two_by_two):
    cfg, out, _ = two_by_two
    with pytest.raises(CompareError, match="other settings"):
        compare(
            cfg,
            losses=["triplet"],
            seeds=1,
            out=out,
            progress=False,
            overrides=["optim.lr=0.01"],
        )


def test_sweep_covers_the_product(tmp_path):
    cfg = _config(tmp_path)
    report = sweep(
        cfg,
        params=["margin=0,0.2", "gamma=20,40,60"],
        loss="unified",
        seeds=1,
        out=tmp_path / "sw",
        progress=False,
    )
    points = sorted((s.params["margin"], s.params["gamma"]) for s in report.summaries)
    assert points == sorted((m, g) for m in (0, 0.2) for g in (20, 40, 60))
    assert len({s.label for s in report.summaries}) == 6
    names = {p.name for p in report.plots}
    assert {"sweep_margin.png", "sweep_gamma.png"} <= names
    doc = json.loads((tmp_path / "sw" / "results.json").read_text())
    assert doc["sweep"] == {"margin": [0, 0.2], "gamma": [20, 40, 60]}


def test_variant_parameters_are_layered(tmp_path):
    cfg = _config(
        tmp_path,
        compare_section={
            "seeds": 2,
            "losses": {
                "unified": {"gamma": 70.0},
                "triplet-sum": {"name": "triplet", "hardest": False, "set": ["optim.lr=0.01"]},
            },
        },
    )
    raw, section = read_compare_config(
        cfg, ["loss.name=unified", "loss.margin=0.3", "compare.seeds=3"]
    )
    assert section["seeds"] == 3
    variants = resolve_variants(raw, section, None)
    assert [v.label for v in variants] == ["unified", "triplet-sum"]
    assert variants[0].params == {"margin": 0.3, "gamma": 70.0}  # [loss], then the table
    assert variants[1].loss == "triplet" and variants[1].params == {"hardest": False}
    config = run_config(raw, variants[1], 5, tmp_path / "r")
    assert config.optim.lr == 0.01 and config.train.seed == 5
    # defaults: the six papers' losses with registry defaults (the table has none of them)
    raw2, _ = read_compare_config(_config(tmp_path, epochs=2))
    labels = [v.label for v in resolve_variants(raw2, {}, None)]
    assert labels == ["triplet", "infonce", "unified", "goal", "vsl", "adacl"]
    assert resolve_variants(raw2, {}, ["infonce"])[0].params == {}


def test_goal_grid_and_loss_only_train_keys(tmp_path):
    cfg = _config(tmp_path)
    raw, section = read_compare_config(
        cfg, ["train.all_negatives_epochs=1", "compare.losses.goal.margin=0.3"]
    )
    grid = resolve_variants(raw, section, [], goal_grid=True)
    assert len(grid) == 15
    combos = {(v.params["triplet_weight"], v.params["pair_weight"]) for v in grid}
    assert len(combos) == 15 and all(v.params["margin"] == 0.3 for v in grid)
    assert grid[0].label == "goal-con-con"
    # the warm-up stays for the hardest-negative family (triplet, GOAL, VSL), dropped for others
    tri, vsl, nce, uni = resolve_variants(raw, section, ["triplet", "vsl", "infonce", "unified"])
    for variant, epochs in ((tri, 1), (grid[0], 1), (vsl, 1), (nce, 0), (uni, 0)):
        config = run_config(raw, variant, 0, tmp_path / variant.label)
        assert config.train.all_negatives_epochs == epochs, variant.label


def test_loss_only_train_keys_follow_the_capabilities_of_the_configured_loss(tmp_path):
    """The default losses are the registry's declared ones in the papers' order, and a train
    key stays exactly where the loss with its parameters takes it: the warm-up for VSL with a
    triplet base but not an InfoNCE one, the momentum encoder for AdaCL with a queue only."""
    from vlret.analysis.compare import PAPER_LOSSES
    from vlret.losses import loss_capabilities

    assert PAPER_LOSSES == ("triplet", "infonce", "unified", "goal", "vsl", "adacl")
    cfg = _config(
        tmp_path,
        compare_section={
            "losses": {
                "vsl-nce": {"name": "vsl", "base": "infonce"},
                "adacl-q": {"name": "adacl", "queue_size": 32},
            }
        },
    )
    raw, section = read_compare_config(
        cfg, ["train.all_negatives_epochs=1", "train.momentum_encoder=0.9"]
    )
    labels = ["vsl", "vsl-nce", "adacl", "adacl-q", "triplet"]
    expected = {  # (all_negatives_epochs, momentum_encoder)
        "vsl": (1, None),
        "vsl-nce": (0, None),
        "adacl": (0, None),
        "adacl-q": (0, 0.9),
        "triplet": (1, None),
    }
    for variant in resolve_variants(raw, section, labels):
        caps = loss_capabilities(variant.loss, variant.params)
        config = run_config(raw, variant, 0, tmp_path / variant.label)
        got = (config.train.all_negatives_epochs, config.train.momentum_encoder)
        assert got == expected[variant.label], variant.label
        assert (got[0] == 1) == caps.all_negatives_warmup, variant.label


@pytest.mark.parametrize(
    ("losses", "overrides", "match"),
    [
        (["nope"], [], "unknown loss or variant 'nope'"),
        (["triplet", "triplet"], [], "listed twice"),
        (["bad/label"], [], "names a folder"),
        (["unified"], ["compare.losses.unified.gama=3"], "'gama' is not a parameter"),
        (["unified"], ["compare.colour=red"], "compare.colour: unknown key"),
    ],
)
def test_bad_requests_raise_clear_errors(tmp_path, losses, overrides, match):
    cfg = _config(tmp_path)
    with pytest.raises(CompareError, match=match):
        compare(cfg, losses=losses, seeds=1, out=tmp_path / "o", overrides=overrides)


def test_parse_param():
    assert parse_param("margin=0,0.1, 0.2") == ("margin", [0, 0.1, 0.2])
    assert parse_param("pair_weight=sig,lin-ms") == ("pair_weight", ["sig", "lin-ms"])
    for bad in ("margin", "=1,2", "margin=1,,2", "margin=1,1"):
        with pytest.raises(CompareError, match="--param"):
            parse_param(bad)


def test_trainer_logs_dev_similarities_equal_to_loops(tmp_path):
    data = tiny_data(tmp_path / "data")
    raw = tiny_raw(data, tmp_path / "run")
    raw["train"]["epochs"] = 1
    Trainer(config_from_dict(raw)).fit()
    log = (tmp_path / "run" / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    (record,) = [r for r in map(json.loads, log) if r["kind"] == "epoch"]
    # the weights that were validated: last.pt after the single epoch
    model, config, encoder = load_trained_model(tmp_path / "run" / "last.pt")
    img, txt = encode_dataset(model, open_dataset(config.data, "dev", encoder=encoder))
    t2i = [int(i) for i in open_dataset(config.data, "dev", encoder=encoder).txt_to_img]
    cos = torch.nn.functional.cosine_similarity
    pos = [float(cos(img[i], txt[j], dim=0)) for j, i in enumerate(t2i)]
    hardest = [
        max(float(cos(img[i], txt[j], dim=0)) for j in range(len(t2i)) if t2i[j] != i)
        for i in range(img.shape[0])
    ]
    hardest += [
        max(float(cos(img[i], txt[j], dim=0)) for i in range(img.shape[0]) if i != t2i[j])
        for j in range(len(t2i))
    ]
    assert record["dev_pos_sim"] == pytest.approx(sum(pos) / len(pos), abs=1e-5)
    assert record["dev_hardest_neg_sim"] == pytest.approx(sum(hardest) / len(hardest), abs=1e-5)
    assert "dev_rsum" in record


# -- synthetic world extras ------------------------------------------------------------------


@pytest.fixture(scope="module")
def synthetic_comparison(tmp_path_factory):
    from vlret.worlds import write_synthetic

    tmp = tmp_path_factory.mktemp("syn")
    world = write_synthetic("tiny", tmp / "world")
    hint = json.loads((world / "synthetic.json").read_text(encoding="utf-8"))["train_config_hint"]
    raw = tiny_raw(world, tmp / "base")
    raw["data"].update(hint["data"])
    raw["model"]["image"]["in_dim"] = hint["image_in_dim"]
    raw["train"].update(epochs=1, batch_size=32, max_steps_per_epoch=6)
    cfg = tmp / "syn.yaml"
    cfg.write_text(yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")
    report = compare(cfg, losses=["triplet", "infonce"], seeds=2, out=tmp / "out", progress=False)
    return world, tmp / "out", report


def _subset_value(subsets, key: str) -> float:
    """``clone_group_t2i_r1`` -> ``subsets["clone_group"].t2i_r1``."""
    (name,) = [n for n in subsets if key.startswith(f"{n}_")]
    return getattr(subsets[name], key[len(name) + 1 :])


def test_synthetic_extras_equal_evaluate_synthetic(synthetic_comparison):
    from vlret.worlds import evaluate_synthetic, load_synthetic

    world, out, _ = synthetic_comparison
    doc = json.loads((out / "results.json").read_text(encoding="utf-8"))
    rows = list(csv.DictReader((out / "results.csv").open(encoding="utf-8")))
    assert set(SYNTHETIC_KEYS) <= set(rows[0])
    annotations = load_synthetic(world, "test")
    for variant in doc["variants"]:
        for run in variant["runs"]:
            model, config, encoder = load_trained_model(Path(run["run_dir"]) / "best.pt")
            img, txt = encode_dataset(model, open_dataset(config.data, "test", encoder=encoder))
            direct = evaluate_synthetic(img, txt, annotations)
            want = {
                "clone_t2i": direct["clone"].t2i,
                "clone_i2t": direct["clone"].i2t,
                "t2i_rprecision": direct["extended"].t2i_rprecision,
                "t2i_map_at_r": direct["extended"].t2i_map_at_r,
                "i2t_rprecision": direct["extended"].i2t_rprecision,
                "i2t_map_at_r": direct["extended"].i2t_map_at_r,
                "secondary_t2i_r1": direct["secondary_t2i_r1"],
                **{k: _subset_value(direct["subsets"], k) for k, _ in SUBSET_COLUMNS},
            }
            got = {k: run["metrics"][k] for k in SYNTHETIC_KEYS}
            assert got == pytest.approx(want, abs=1e-9)
            (row,) = [
                r for r in rows if r["label"] == variant["label"] and r["seed"] == str(run["seed"])
            ]
            assert float(row["clone_t2i"]) == pytest.approx(want["clone_t2i"])
            stored = json.loads((Path(run["run_dir"]) / "result.json").read_text())
            assert stored["synthetic"]["split"] == "test"
            assert stored["synthetic"]["trials"]["clone_t2i"] > 0
        for key in SYNTHETIC_KEYS:
            values = [r["metrics"][key] for r in variant["runs"]]
            assert variant["mean"][key] == pytest.approx(statistics.mean(values))
            assert variant["std"][key] == pytest.approx(statistics.stdev(values))


def test_synthetic_extras_table_has_bold_best(synthetic_comparison):
    _, out, report = synthetic_comparison
    doc = json.loads((out / "results.json").read_text(encoding="utf-8"))
    text = report.table_text()
    assert "synthetic-world extras" in text
    second = text[text.index("synthetic-world extras") : text.index("query subsets")].splitlines()
    third = text[text.index("query subsets") :].splitlines()
    header3 = next(line for line in third if line.startswith("| Loss |"))
    assert [c.strip() for c in header3.split("|")[2:-1]] == [h for _, h in SUBSET_COLUMNS]
    for col, (key, _) in enumerate(SUBSET_COLUMNS, start=2):
        shown = {v["label"]: round(v["mean"][key], 1) for v in doc["variants"]}
        for v in doc["variants"]:
            (row,) = [line for line in third if line.startswith(f"| {v['label']} |")]
            body = f"{v['mean'][key]:.1f} ± {v['std'][key]:.1f}"
            best = shown[v["label"]] == max(shown.values())
            assert row.split("|")[col].strip() == (f"**{body}**" if best else body)
    header = next(line for line in second if line.startswith("| Loss |"))
    assert [c.strip() for c in header.split("|")[2:-1]] == [h for _, h in SYNTHETIC_COLUMNS]
    for col, (key, _) in enumerate(SYNTHETIC_COLUMNS, start=2):
        shown = {v["label"]: round(v["mean"][key], 1) for v in doc["variants"]}
        for v in doc["variants"]:
            (row,) = [line for line in second if line.startswith(f"| {v['label']} |")]
            cell = row.split("|")[col].strip()
            body = f"{v['mean'][key]:.1f} ± {v['std'][key]:.1f}"
            assert cell == (f"**{body}**" if shown[v["label"]] == max(shown.values()) else body)


def test_synthetic_extras_added_to_cached_runs(tmp_path, synthetic_comparison):
    import shutil

    world, out0, _ = synthetic_comparison
    out = tmp_path / "out"
    shutil.copytree(out0, out)
    result = out / "runs" / "triplet" / "seed0" / "result.json"
    record = json.loads(result.read_text())
    extras = record.pop("synthetic")
    result.write_text(json.dumps(record))  # as written before the extras existed
    cfg = next(out0.parent.glob("syn.yaml"))
    report = compare(cfg, losses=["triplet", "infonce"], seeds=2, out=out, progress=False)
    assert report.count("cached") == 4
    assert json.loads(result.read_text())["synthetic"] == extras
    # a run scored before the query subsets existed gets them, the older metrics unchanged
    record = json.loads(result.read_text())
    for key, _ in SUBSET_COLUMNS:
        del record["synthetic"]["metrics"][key]
    result.write_text(json.dumps(record))
    compare(cfg, losses=["triplet", "infonce"], seeds=2, out=out, progress=False)
    assert json.loads(result.read_text())["synthetic"] == extras
    table = (out / "table.md").read_text(encoding="utf-8")
    header = "| Loss | " + " | ".join(h for _, h in SUBSET_COLUMNS) + " |"
    assert header in table.splitlines()


# -- command line ----------------------------------------------------------------------------


def test_cli_compare_prints_table_and_paths(tmp_path, capsys):
    cfg = _config(tmp_path)
    out = tmp_path / "o"
    argv = ["compare", str(cfg), "--losses", "triplet", "--seeds", "1", "--out", str(out)]
    assert main([*argv, "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert "| triplet |" in text and "runs: 1 trained" in text
    assert str(out / "table.md") in text and str(out / "plots" / "curves_loss_rsum.png") in text
    assert main([*argv, "--no-progress"]) == 0
    assert "runs: 1 cached" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["compare", "C", "--seeds", "0"], "--seeds: expected a positive integer, got '0'"),
        (["compare", "C", "--seeds", "x"], "--seeds: expected a positive integer, got 'x'"),
        (["sweep", "C"], "the following arguments are required: --param"),
        (["synth", "tiny"], "the following arguments are required: --out"),
        (["synth", "tiny", "--out", "d", "--format", "png"], "invalid choice: 'png'"),
    ],
)
def test_cli_parse_errors_are_clear(capsys, argv, message):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_cli_compare_checks_the_test_split_before_training(tmp_path, capsys):
    cfg = _config(tmp_path)
    out = tmp_path / "o"
    base = ["compare", str(cfg), "--losses", "triplet", "--seeds", "1", "--out", str(out)]
    cases = [
        (["--set", "compare.split=testall"], "not 'testall'"),
        (["--set", "compare.protocol=msrvtt-full"], "needs msrvtt data"),
        (["--set", f"compare.data={tmp_path / 'nowhere'}"], "compare.data: "),
    ]
    for extra, message in cases:
        assert main([*base, "--no-progress", *extra]) == 2
        err = capsys.readouterr().err
        assert err.startswith("vlret compare: ") and message in err
        assert "Traceback" not in err
        assert not (out / "runs").exists()  # nothing was trained


def test_cli_compare_evaluation_errors_exit_2_before_training(tmp_path, capsys):
    # coco1k on precomp dev passes the split check; its 2 dev images are not 5 folds, which the
    # plan's check finds by opening the split before any run trains (issue 39 item 14)
    cfg = _config(tmp_path)
    argv = ["compare", str(cfg), "--losses", "triplet", "--seeds", "1", "--out", str(tmp_path)]
    argv += ["--no-progress", "--set", "compare.protocol=coco1k", "--set", "compare.split=dev"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("vlret compare: compare.split = 'dev', compare.protocol = 'coco1k'")
    assert "coco1k averages 5 folds" in err and "Traceback" not in err
    assert len(err.splitlines()) == 1 and not (tmp_path / "runs").exists()


def test_cli_request_errors_name_the_command(tmp_path, capsys):
    cfg = _config(tmp_path)
    cases = [
        (["compare", str(cfg), "--losses", "a,,b"], "vlret compare: --losses 'a,,b'"),
        (["sweep", str(cfg), "--param", "margin"], "vlret sweep: --param 'margin'"),
        (["compare", str(tmp_path / "missing.toml")], "vlret compare: "),
        (["synth", "tiny", "--out", str(tmp_path), "--noise", "0.2"], "vlret synth: "),
    ]
    for argv, message in cases:
        assert main(argv) == 2
        assert capsys.readouterr().err.startswith(message)


def test_cli_synth_passes_options(tmp_path, monkeypatch, capsys):
    seen = {}

    def synth_main(preset, out, **options):
        seen.update(preset=preset, out=out, **options)
        return Path(out) / "made"

    fake = types.ModuleType("vlret.worlds")
    fake.synth_main = synth_main
    fake.train_hint_lines = lambda path: []  # the fake world has no synthetic.json
    monkeypatch.setitem(sys.modules, "vlret.worlds", fake)
    argv = ["synth", "tiny", "--out", str(tmp_path), "--seed", "3", "--format", "karpathy"]
    assert main([*argv, "--noise", "permute_captions:0.2"]) == 0
    assert seen == {
        "preset": "tiny",
        "out": tmp_path,
        "seed": 3,
        "format": "karpathy",
        "noise": "permute_captions:0.2",
    }
    assert capsys.readouterr().out.strip() == str(tmp_path / "made")
    seen.clear()
    assert main(["synth", "video", "--out", str(tmp_path)]) == 0
    assert seen == {"preset": "video", "out": tmp_path}  # the module's defaults apply


def test_cross_attention_comparison_scores_pairs_once_for_both_tables(tmp_path, monkeypatch):
    """A SCAN variant in a comparison on a synthetic world: its metrics and synthetic extras
    both come from the one exact score matrix (S, I as the embedding pair), equal to
    evaluate_synthetic on every pair scored on its own, and the pairs are scored once."""
    from vlret import eval as eval_package
    from vlret.analysis import compare as compare_module
    from vlret.eval import encode_tokens, scorers
    from vlret.worlds import evaluate_synthetic, load_synthetic, write_synthetic

    world = write_synthetic("tiny", tmp_path / "world")
    hint = json.loads((world / "synthetic.json").read_text(encoding="utf-8"))["train_config_hint"]
    raw = tiny_raw(world, tmp_path / "base")
    raw["data"].update(hint["data"])
    raw["model"] = {
        "kind": "scan",
        "embed_dim": 16,
        "image": {"in_dim": hint["image_in_dim"]},
        "text": {"word_dim": 8},
    }
    raw["train"].update(epochs=1, batch_size=16, max_steps_per_epoch=3)
    cfg = tmp_path / "scan.yaml"
    cfg.write_text(yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")
    calls = []
    real = eval_package.score_matrix

    def counted(models, regions, texts, **kwargs):
        calls.append(len(texts))
        return real(models, regions, texts, **kwargs)

    # vlret eval's scoring (the trainer's dev scoring goes through pair_scoring), and the
    # fallback that scores the pairs again for the synthetic extras
    monkeypatch.setattr(scorers, "score_matrix", counted)
    monkeypatch.setattr(eval_package, "score_matrix", counted)
    report = compare(cfg, losses=["unified"], seeds=1, out=tmp_path / "out", progress=False)
    assert report.count("trained") == 1
    assert len(calls) == 1  # the test split is scored once for both tables
    (run,) = json.loads((tmp_path / "out" / "results.json").read_text())["variants"][0]["runs"]
    model, config, encoder = load_trained_model(Path(run["run_dir"]) / "best.pt")
    dataset = open_dataset(config.data, "test", encoder=encoder)
    regions, texts = encode_tokens(model, dataset, device="cpu")
    with torch.no_grad():  # one call over all pairs (no blocks, captions in file order)
        sim = model.eval().score(regions, *texts.gather())
    direct = evaluate_synthetic(sim, torch.eye(sim.shape[1]), load_synthetic(world, "test"))
    assert run["metrics"]["rsum"] == pytest.approx(direct["standard"].rsum)
    assert run["metrics"]["clone_t2i"] == pytest.approx(direct["clone"].t2i)
    assert run["metrics"]["t2i_map_at_r"] == pytest.approx(
        direct["extended"].t2i_map_at_r, abs=1e-6
    )
    assert compare_module.synthetic_root(world) is not None


def test_a_run_finished_before_a_config_key_existed_is_reused(tmp_path, two_by_two):
    """An upgrade that adds a config key (here train.select_on, as vlret 0.x did) must not
    orphan finished runs: the key, absent from their spec.json, ran at its default; a key
    absent there but set to something else is another run."""
    cfg, out, _ = two_by_two
    spec_path = out / "runs/triplet/seed0/spec.json"
    stored = json.loads(spec_path.read_text())
    assert "select_on" in stored["config"]["train"]  # today's fingerprint has the key
    del stored["config"]["train"]["select_on"]
    spec_path.write_text(json.dumps(stored))
    report = compare(cfg, losses=["triplet"], seeds=1, out=out, progress=False)
    assert report.count("cached") == 1
    with pytest.raises(CompareError, match="other settings"):
        compare(
            cfg,
            losses=["triplet"],
            seeds=1,
            out=out,
            progress=False,
            overrides=["train.select_on=t2i_r1"],
        )


def test_unequal_training_budgets_are_named_under_the_table(tmp_path, two_by_two):
    from vlret.analysis.compare.report import budget_note, training_steps

    # the module's runs: equal budgets, no note
    _, out, report = two_by_two
    assert "different numbers of steps" not in report.table_text()
    steps = training_steps({"triplet": [out / "runs" / "triplet" / "seed0"]})
    log = [json.loads(line) for line in (out / "runs/triplet/seed0/metrics.jsonl").open()]
    assert steps == {"triplet": [max(r["step"] for r in log if "step" in r)]}
    # one variant trains twice the epochs of the other: both step counts named
    cfg = _config(
        tmp_path,
        compare_section={"losses": {"long": {"name": "triplet", "set": ["train.epochs=2"]}}},
    )
    with pytest.warns(UserWarning, match="different numbers of steps"):
        report = compare(cfg, losses=["triplet", "long"], seeds=1, out=tmp_path / "o")
    counts = training_steps(
        {label: [tmp_path / "o" / "runs" / label / "seed0"] for label in ("triplet", "long")}
    )
    assert counts["long"] == [2 * counts["triplet"][0]]
    assert f"long {counts['long'][0]}, triplet {counts['triplet'][0]}" in report.table_text()
    assert budget_note({"a": [3, 3], "b": [3]}) is None
    assert budget_note({"a": [3, 4], "b": [3]}) is not None  # seeds of one variant differ too


def test_a_variant_with_default_false_runs_only_when_named(tmp_path):
    cfg = _config(
        tmp_path,
        compare_section={
            "losses": {
                "unified": {"gamma": 70.0},
                "ablation": {"name": "triplet", "margin": 0.05, "default": False},
                "kept": {"name": "triplet", "default": True},
            }
        },
    )
    raw, section = read_compare_config(cfg)
    assert [v.label for v in resolve_variants(raw, section, None)] == ["unified", "kept"]
    named = resolve_variants(raw, section, ["ablation"])
    assert named[0].loss == "triplet" and named[0].params["margin"] == 0.05
    assert "default" not in named[0].params
    bad = {"losses": {"x": {"name": "triplet", "default": "no"}}}
    raw, section = read_compare_config(_config(tmp_path / "b", compare_section=bad))
    with pytest.raises(CompareError, match=r"\[compare.losses.x\] default: expected true or false"):
        resolve_variants(raw, section, None)
