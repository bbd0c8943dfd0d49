"""Fault pass (issue 39, items 12-14) on the run config's inputs: freezing or locking every
trainable parameter, overlapping ``lr_multipliers`` prefixes through ``--set``, switching the
loss by name, ``train.procedure = "none"`` / null, and ``vlret compare``'s test split checked
before any run trains.

Each bad input ends in one line naming the key (``vlret CMD: ...``, exit status 2), before
anything is written into the run folder.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from train_helpers import tiny_config, tiny_data, tiny_raw
from vlret.analysis.compare import CompareError, compare
from vlret.cli import main
from vlret.data.writers import make_tiny_precomp
from vlret.run.config import apply_overrides, load_config
from vlret.run.config_files import ConfigError
from vlret.train import Trainer
from vlret.train.loss_step import LossStep
from vlret.train.procedures.registry import build_procedure

FREEZE_BOTH = ['train.freeze=["image_encoder", "text_encoder"]', "train.freeze_epochs=1"]
LOCK_BOTH = ['train.lock=["image_encoder", "text_encoder"]']
#: What a refused run must not have written into its folder.
RUN_FILES = ("config.yaml", "vocab.json", "metrics.jsonl", "last.pt", "best.pt")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return tiny_data(tmp_path_factory.mktemp("data"))


def _config_file(tmp_path: Path, raw: dict) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")
    return path


def _one_line(capsys, command: str) -> str:
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1, err
    assert err.startswith(f"vlret {command}: ") and "Traceback" not in err, err
    return err


def _set(*items: str) -> list[str]:
    return [arg for item in items for arg in ("--set", item)]


def _nothing_written(run: Path) -> None:
    assert not [name for name in RUN_FILES if (run / name).exists()]


# -- item 12: freezing every trainable parameter ---------------------------------------------


def test_freezing_both_towers_is_one_line_naming_train_freeze_before_anything_is_written(
    tmp_path, data, capsys
):
    run = tmp_path / "run"
    cfg = _config_file(tmp_path, tiny_raw(data, run))
    assert main(["train", str(cfg), *_set(*FREEZE_BOTH)]) == 2
    err = _one_line(capsys, "train")
    assert "train.freeze: " in err and "nothing to train" in err
    assert "image_encoder, text_encoder" in err and "first 1 epoch" in err
    _nothing_written(run)


def test_freezing_both_towers_still_trains_a_learnable_temperature(tmp_path, data):
    # something is left to train: the loss's own temperature; the towers stay as they were
    loss = ["loss.name=infonce", "loss.learnable_temperature=true"]
    overrides = [*FREEZE_BOTH, *loss, "train.epochs=1", "train.max_steps_per_epoch=2"]
    config = tiny_config(data, tmp_path / "run", overrides)
    trainer = Trainer(config, print_fn=None)
    towers = {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}
    loss_before = [p.detach().clone() for p in trainer.loss_fn.parameters()]
    assert loss_before, "infonce with learnable_temperature has a parameter"
    trainer.fit()
    for k, v in trainer.model.state_dict().items():
        assert torch.equal(v, towers[k]), k
    assert any(
        not torch.equal(p, q)
        for p, q in zip(trainer.loss_fn.parameters(), loss_before, strict=True)
    )


# -- item 13: overlapping lr_multipliers prefixes; locking every tower -----------------------


def _factors(trainer: Trainer) -> dict[str, float]:
    """Each parameter's learning rate over the plain parameters' (warm-up scales all alike)."""
    names = {id(p): n for n, p in trainer.model.named_parameters()}
    lrs = {names[id(p)]: g["lr"] for g in trainer.optimizer.param_groups for p in g["params"]}
    base = lrs["image_encoder.fc.weight"]
    return {n: lr / base for n, lr in lrs.items()}


@pytest.mark.parametrize(
    "overrides",
    [
        [
            "optim.lr_multipliers.text_encoder=0.5",
            'optim.lr_multipliers."text_encoder.embed"=0.1',
        ],
        # the quoted key first, then the shorter prefix beside it
        [
            "optim.lr_multipliers.'text_encoder.embed'=0.1",
            "optim.lr_multipliers.text_encoder=0.5",
        ],
        ['optim.lr_multipliers={"text_encoder" = 0.5, "text_encoder.embed" = 0.1}'],
    ],
)
def test_overlapping_lr_multiplier_prefixes_are_set_with_a_quoted_key(tmp_path, data, overrides):
    cfg = _config_file(tmp_path, tiny_raw(data, tmp_path / "run"))
    config = load_config(cfg, overrides)
    assert config.optim.lr_multipliers == {"text_encoder": 0.5, "text_encoder.embed": 0.1}
    factors = _factors(Trainer(config, print_fn=None))
    for name, factor in factors.items():
        want = 0.1 if name.startswith("text_encoder.embed.") else 1.0
        want = 0.5 if name.startswith("text_encoder.gru.") else want
        assert factor == pytest.approx(want, rel=1e-12), name


@pytest.mark.parametrize(
    ("first", "second", "words"),
    [
        ("text_encoder=0.5", "text_encoder.embed=0.1", "holds 0.5, not a table"),
        ("text_encoder.embed=0.1", "text_encoder=0.5", "would replace"),
    ],
)
def test_a_prefix_beside_a_shorter_one_unquoted_says_how_to_quote(first, second, words):
    raw = {"optim": {}}
    with pytest.raises(ConfigError) as err:
        apply_overrides(raw, [f"optim.lr_multipliers.{first}", f"optim.lr_multipliers.{second}"])
    message = str(err.value)
    assert "\n" not in message and words in message
    assert """--set 'optim.lr_multipliers."text_encoder.embed"=VALUE'""" in message


def test_an_unclosed_quote_in_a_set_key_is_one_line_naming_it():
    with pytest.raises(ConfigError, match=r"--set: optim\.lr_multipliers\.\"text_encoder"):
        apply_overrides({}, ['optim.lr_multipliers."text_encoder=0.1'])


def test_one_prefix_given_nested_and_quoted_is_refused(tmp_path, data):
    raw = tiny_raw(data, tmp_path / "run")
    raw["optim"]["lr_multipliers"] = {"text_encoder": {"embed": 0.1}, "text_encoder.embed": 0.2}
    with pytest.raises(ConfigError, match=r"optim\.lr_multipliers\.text_encoder\.embed: .*twice"):
        load_config(_config_file(tmp_path, raw))


def test_locking_both_towers_is_one_line_naming_train_lock_not_torchs_empty_list(
    tmp_path, data, capsys
):
    run = tmp_path / "run"
    cfg = _config_file(tmp_path, tiny_raw(data, run))
    assert main(["train", str(cfg), *_set(*LOCK_BOTH)]) == 2
    err = _one_line(capsys, "train")
    assert "train.lock: " in err and "nothing to train" in err, err
    assert "empty parameter list" not in err
    _nothing_written(run)


def test_freezing_what_the_lock_leaves_names_both_keys(tmp_path, data):
    overrides = ['train.lock=["image_encoder"]', 'train.freeze=["text_encoder"]']
    config = tiny_config(data, tmp_path / "run", [*overrides, "train.freeze_epochs=2"])
    with pytest.raises(ConfigError) as err:
        Trainer(config, print_fn=None)
    assert err.value.key == "train.freeze"
    assert "train.lock's image_encoder" in str(err.value) and "first 2 epochs" in str(err.value)


# -- item 14: switching the loss by name; procedure "none"; compare's test split -------------


def _triplet_file(tmp_path: Path, data: Path) -> Path:
    raw = tiny_raw(data, tmp_path / "run", margin=0.3, hardest=False, normalize=False)
    return _config_file(tmp_path, raw)


def test_switching_the_loss_by_name_drops_the_old_loss_parameters_with_a_note(
    tmp_path, data, capsys
):
    config = load_config(_triplet_file(tmp_path, data), ["loss.name=infonce"])
    assert config.loss.name == "infonce"
    assert config.loss.params == {"normalize": False}  # declared by both: kept
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1, err
    assert "margin, hardest" in err and "normalize" not in err and "'triplet'" in err


def test_a_parameter_given_with_set_is_kept_and_checked_against_the_new_loss(
    tmp_path, data, capsys
):
    cfg = _triplet_file(tmp_path, data)
    kept = load_config(cfg, ["loss.name=infonce", "loss.temperature=0.2"])
    assert kept.loss.params == {"normalize": False, "temperature": 0.2}
    with pytest.raises(ConfigError) as err:
        load_config(cfg, ["loss.margin=0.1", "loss.name=infonce"])
    assert err.value.key == "loss.margin" and "not a parameter of loss 'infonce'" in str(err.value)
    capsys.readouterr()
    assert main(["train", str(cfg), *_set("loss.name=infonce", "loss.margin=0.1")]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert lines[-1].startswith("vlret train: ") and "loss.margin" in lines[-1]


def test_a_whole_loss_table_set_at_once_replaces_the_section(tmp_path, data, capsys):
    overrides = ["loss.name=infonce", 'loss={ name = "unified", gamma = 30.0 }']
    config = load_config(_triplet_file(tmp_path, data), overrides)
    assert (config.loss.name, config.loss.params) == ("unified", {"gamma": 30.0})


def test_the_same_loss_name_keeps_every_parameter(tmp_path, data, capsys):
    config = load_config(_triplet_file(tmp_path, data), ["loss.name=triplet"])
    assert config.loss.params == {"margin": 0.3, "hardest": False, "normalize": False}
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("given", ["none", '"none"', '"None"', "null"])
def test_procedure_none_or_null_is_the_standard_step(tmp_path, data, given):
    config = tiny_config(data, tmp_path / "run", [f"train.procedure={given}"])
    assert config.train.procedure == "standard"
    assert type(build_procedure(config)) is LossStep


def test_a_yaml_null_procedure_is_the_standard_step_and_resolves_in_config_yaml(tmp_path, data):
    raw = tiny_raw(data, tmp_path / "run")
    raw["train"]["procedure"] = None
    config = load_config(_config_file(tmp_path, raw))
    assert config.to_dict()["train"]["procedure"] == "standard"
    config.train.procedure = None  # a config built without the checks: the registry agrees
    assert type(build_procedure(config)) is LossStep


def _compare_config(tmp_path: Path, sizes: dict[str, int], section: dict | None = None) -> Path:
    world = tmp_path / "world"
    make_tiny_precomp(world, sizes=sizes, feature_shape=(4, 16), seed=0)
    raw = tiny_raw(world, tmp_path / "base")
    raw["train"]["epochs"] = 1
    if section:
        raw["compare"] = section
    return _config_file(tmp_path, raw)


def test_compare_on_data_with_only_testall_fails_before_training(tmp_path, capsys):
    cfg = _compare_config(tmp_path, {"train": 8, "dev": 2, "testall": 5})
    out = tmp_path / "out"
    with pytest.raises(CompareError) as err:
        compare(cfg, losses=["triplet"], seeds=1, out=out, progress=False)
    message = str(err.value)
    assert "compare.split = 'test'" in message and "test_ims.npy" in message
    assert not list(out.rglob("*.pt")) and not list(out.rglob("config.yaml"))
    assert main(["compare", str(cfg), "--losses", "triplet", "--out", str(out), "--no-progress"])
    assert "compare.split = 'test'" in _one_line(capsys, "compare")
    assert not list(out.rglob("*.pt"))


def test_compare_checks_the_protocols_folds_against_the_split_before_training(tmp_path):
    section = {"protocol": "coco1k", "split": "testall"}
    cfg = _compare_config(tmp_path, {"train": 8, "dev": 2, "testall": 6}, section)
    out = tmp_path / "out"
    with pytest.raises(CompareError, match=r"compare\.protocol = 'coco1k'.*6 images"):
        compare(cfg, losses=["triplet"], seeds=1, out=out, progress=False)
    assert not list(out.rglob("*.pt"))


def test_compare_on_testall_with_a_protocol_that_evaluates_it_runs(tmp_path):
    section = {"protocol": "coco1k", "split": "testall"}
    cfg = _compare_config(tmp_path, {"train": 8, "dev": 2, "testall": 5}, section)
    report = compare(cfg, losses=["triplet"], seeds=1, out=tmp_path / "out", progress=False)
    assert report.count("trained") == 1
    doc = json.loads((tmp_path / "out" / "results.json").read_text(encoding="utf-8"))
    assert [v["label"] for v in doc["variants"]] == ["triplet"]
