"""Checkpoints evaluate from their model, encoder and scoring, never their loss.

The fixtures under tests/fixtures/prev_release were written by the release before vlret.eval
(commit b84b800): a tiny precomp data folder (``make_tiny_precomp(sizes={"train": 8, "dev": 2,
"test": 5, "testall": 10}, seed=3)``), a two-tower checkpoint trained with ``triplet``
``normalize = false`` (dot-product scores) and a SCAN checkpoint (one epoch, 5 steps each), and
``expected.json``: that release's ``vlret eval --json`` record of each case.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vlret.run.builders import load_trained_model, stored_run
from vlret.run.checkpoint import load_checkpoint, save_checkpoint
from vlret.run.evaluate import run_evaluation

FIXTURES = Path(__file__).parents[1] / "fixtures" / "prev_release"
EXPECTED = json.loads((FIXTURES / "expected.json").read_text(encoding="utf-8"))


def _evaluate(checkpoints: list[str], case: dict, folder: Path = FIXTURES):
    paths = [str(folder / c) for c in checkpoints]
    return run_evaluation(
        paths[0] if len(paths) == 1 else paths,
        data=FIXTURES / "data",
        split=case["split"],
        protocol=case["protocol"],
        device="cpu",
        **({"rescore": case["rescore"]} if "rescore" in case else {}),
    )


def _without_paths(record: dict) -> dict:
    return {k: v for k, v in record.items() if k not in ("checkpoint", "checkpoints", "title")}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_previous_release_checkpoints_evaluate_to_the_same_numbers(name):
    case = EXPECTED[name]
    record = _evaluate(case["checkpoints"], case).record()
    want = case["record"]
    assert _without_paths(record) == _without_paths(want)  # exact: same arithmetic
    # the title names the checkpoints of an ensemble by path; the rest is identical
    assert record["title"].split("\n")[0] == want["title"].split("\n")[0]


def test_old_checkpoint_scoring_comes_from_its_loss_section_as_plain_data():
    state = load_checkpoint(FIXTURES / "two_tower.pt")
    assert "scoring" not in state["config"]["model"]  # written before the model carried it
    model, run, _ = load_trained_model(FIXTURES / "two_tower.pt")
    assert run.scoring == "dot" and model.scoring == "dot"
    _, scan_run, _ = load_trained_model(FIXTURES / "scan.pt")
    assert scan_run.scoring == "cosine"  # no normalize in its loss section: the default


@pytest.mark.parametrize(
    "loss",
    [
        {"name": "no-such-loss", "normalize": False},
        {"name": "triplet", "normalize": False, "no_such_parameter": 3},
        {"name": "triplet", "normalize": False, "margin": "not a number"},
    ],
)
def test_a_checkpoint_whose_loss_this_version_does_not_know_still_evaluates(tmp_path, loss):
    for checkpoint in ("two_tower.pt", "scan.pt"):
        state = load_checkpoint(FIXTURES / checkpoint)
        state["config"]["loss"] = dict(loss)
        save_checkpoint(state, tmp_path / checkpoint)
    for name, case in EXPECTED.items():
        got = _evaluate(case["checkpoints"], case, folder=tmp_path).record()
        assert got["metrics"] == case["record"]["metrics"], name
        assert got.get("folds") == case["record"].get("folds"), name


def test_the_model_sections_scoring_wins_over_the_loss_section(tmp_path):
    state = load_checkpoint(FIXTURES / "two_tower.pt")
    dot = run_evaluation(
        FIXTURES / "two_tower.pt", data=FIXTURES / "data", split="test", protocol="f30k"
    )
    state["config"]["model"]["scoring"] = "cosine"  # the loss still says normalize = false
    save_checkpoint(state, tmp_path / "cosine.pt")
    cosine = run_evaluation(
        tmp_path / "cosine.pt", data=FIXTURES / "data", split="test", protocol="f30k"
    )
    state["config"]["loss"]["normalize"] = True
    state["config"]["model"].pop("scoring")
    save_checkpoint(state, tmp_path / "derived.pt")
    derived = run_evaluation(
        tmp_path / "derived.pt", data=FIXTURES / "data", split="test", protocol="f30k"
    )
    assert cosine.metrics == derived.metrics
    assert cosine.metrics != dot.metrics  # the fixture's numbers tell the two scorings apart


def test_stored_run_errors_name_the_key(tmp_path):
    with pytest.raises(ValueError, match="config"):
        stored_run(["not", "a", "table"], source="x.pt")
    with pytest.raises(ValueError, match="data.format"):
        stored_run({"data": {"root": "d", "format": "nope"}}, source="x.pt")
    with pytest.raises(ValueError, match="model"):
        stored_run({"data": {"root": "d", "format": "precomp"}, "model": 3}, source="x.pt")
    state = load_checkpoint(FIXTURES / "two_tower.pt")
    state["config"]["model"]["scoring"] = "angle"
    save_checkpoint(state, tmp_path / "angle.pt")
    assert stored_run(state["config"], source="x.pt").scoring == "angle"  # read as stored
    with pytest.raises(ValueError, match="model.scoring"):  # refused where the model is built
        load_trained_model(tmp_path / "angle.pt")


def test_a_new_checkpoint_stores_its_scoring_with_the_model(tmp_path):
    from train_helpers import tiny_raw
    from vlret.run import config_from_dict
    from vlret.train import Trainer

    raw = tiny_raw(FIXTURES / "data", tmp_path / "run", normalize=False)
    raw["model"]["image"]["in_dim"] = 16
    raw["train"].update(epochs=1, max_steps_per_epoch=1, validate=False)
    config = config_from_dict(raw)
    assert config.model["scoring"] == "dot"  # from the loss's normalize, at config load
    Trainer(config, print_fn=None).fit()
    state = load_checkpoint(tmp_path / "run" / "last.pt")
    assert state["config"]["model"]["scoring"] == "dot"
    model, run, _ = load_trained_model(tmp_path / "run" / "last.pt")
    assert run.scoring == model.scoring == "dot"
