"""train.select_on: the dev metric best.pt maximises (identity_t2i_r1 by default on person search).

A tiny CUHK-PEDES folder (tests/pedes_helpers.py) and a tiny CLIP from scratch train one step
per epoch; ``Trainer.validate`` is replaced by a fixed sequence of dev records in which rsum
and T->I R@1 disagree on the best epoch, so which epoch ``best.pt`` holds says which metric
selected it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from pedes_helpers import TINY_CLIP, write_pedes
from vlret.run.checkpoint import best_selection, load_checkpoint, save_checkpoint
from vlret.run.config import ConfigError, config_from_dict
from vlret.run.config_checks import (
    SELECT_ON_IDENTITY,
    SELECT_ON_RETRIEVAL,
    selectable_metrics,
    selection_metric,
)
from vlret.run.evaluate import dev_metrics
from vlret.run.folder import RunFolderError
from vlret.train import Trainer

pytest.importorskip("transformers")


#: dev records of epochs 0, 1, 2: rsum is best at epoch 2, T->I R@1 at epoch 1, mAP at 0
DEV = [
    {"rsum": 100.0, "identity_t2i_r1": 10.0, "identity_t2i_map": 40.0},
    {"rsum": 50.0, "identity_t2i_r1": 30.0, "identity_t2i_map": 20.0},
    {"rsum": 200.0, "identity_t2i_r1": 20.0, "identity_t2i_map": 30.0},
]


@pytest.fixture(scope="module")
def cuhk(tmp_path_factory):
    root = tmp_path_factory.mktemp("cuhk")
    write_pedes(root)
    return root


@pytest.fixture
def scripted_dev(monkeypatch):
    """``Trainer.validate`` returns ``DEV[epoch]``; the epochs it was asked for are kept."""
    asked: list[int] = []

    def validate(self):
        asked.append(self.epoch)
        return dict(DEV[self.epoch])

    monkeypatch.setattr(Trainer, "validate", validate)
    return asked


def _raw(root, out, fmt="cuhk-pedes", **train):
    return {
        "output_dir": str(out),
        "data": {"root": str(root), "format": fmt},
        "model": {"kind": "clip", "preset": "ViT-B-32", "tokenizer": "bytes", "config": TINY_CLIP},
        "loss": {"name": "infonce"},
        "optim": {"lr": 1e-4},
        "train": {
            "epochs": 3,
            "batch_size": 4,
            "progress": False,
            "eval_batch_size": 8,
            "max_steps_per_epoch": 1,
            "device": "cpu",
            **train,
        },
    }


def _config(root, out, **train):
    return config_from_dict(_raw(root, out, **train), source="run.toml")


def _epochs(out: Path) -> list[dict]:
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == "epoch"]


def _held_epoch(path: Path) -> int:
    """The epoch whose end-of-epoch weights the checkpoint at ``path`` holds."""
    state = load_checkpoint(path)
    assert state["batch_in_epoch"] == 0
    return int(state["epoch"]) - 1


# -- the config ---------------------------------------------------------------------------------


def test_defaults_valid_keys_and_the_refusal(cuhk, tmp_path):
    assert selection_metric(_config(cuhk, tmp_path)) == "identity_t2i_r1"  # IRRA's choice
    assert selection_metric(_config(cuhk, tmp_path, select_on="rsum")) == "rsum"
    assert (
        selection_metric(_config(cuhk, tmp_path, select_on="identity_i2t_minp"))
        == "identity_i2t_minp"
    )
    karpathy = config_from_dict(_raw(cuhk, tmp_path, fmt="karpathy"), source="k.toml")
    assert karpathy.train.select_on is None and selection_metric(karpathy) == "rsum"
    for bad in ("t2i_medr", "pos_sim", "hardest_neg_sim", "R1", "T2I_R1"):
        with pytest.raises(ConfigError) as err:
            selection_metric(_config(cuhk, tmp_path, select_on=bad))
        text = str(err.value)
        assert text.startswith("run.toml: train.select_on: unknown dev metric") and "\n" not in text
        assert "expected one of identity_t2i_r1, identity_t2i_r5" in text and text.endswith(
            "t2i_r5, t2i_r10"
        )
    # identity metrics exist only on person-search data
    raw = _raw(cuhk, tmp_path, fmt="karpathy", select_on="identity_t2i_r1")
    with pytest.raises(
        ConfigError, match=r"'identity_t2i_r1' \(data.format 'karpathy': not person search"
    ):
        selection_metric(config_from_dict(raw, source="k.toml"))
    assert selectable_metrics("karpathy") == SELECT_ON_RETRIEVAL


def test_every_selectable_metric_is_a_key_the_dev_metrics_return():
    torch.manual_seed(0)
    img, txt = torch.randn(6, 8), torch.randn(12, 8)
    txt_to_img = torch.arange(12) // 2
    identity = torch.tensor([4, 4, 9, 9, 9, 2])
    dev = dev_metrics(img, txt, txt_to_img, image_identity=identity)
    assert set(SELECT_ON_IDENTITY + SELECT_ON_RETRIEVAL) <= set(dev)
    plain = dev_metrics(img, txt, txt_to_img)
    assert set(SELECT_ON_RETRIEVAL) <= set(plain) and not set(SELECT_ON_IDENTITY) & set(plain)


def test_a_config_that_selects_on_a_key_the_dev_records_lack_stops_naming_it(
    cuhk, tmp_path, scripted_dev
):
    trainer = Trainer(_config(cuhk, tmp_path / "run", select_on="identity_i2t_r5"), print_fn=None)
    with pytest.raises(
        ValueError, match=r"train.select_on = 'identity_i2t_r5': the dev metrics hold no"
    ):
        trainer.fit()


# -- best.pt follows the selection metric -------------------------------------------------------


def test_a_person_run_keeps_the_best_t2i_r1_epoch_not_the_best_rsum(cuhk, tmp_path, scripted_dev):
    out = tmp_path / "run"
    lines: list[str] = []
    with Trainer(_config(cuhk, out), print_fn=lines.append) as trainer:
        result = trainer.fit()
    assert scripted_dev == [0, 1, 2]
    assert _held_epoch(out / "best.pt") == 1  # T->I R@1 30 at epoch 1; rsum's best is epoch 2
    assert result.select_on == "identity_t2i_r1" and result.best_metric == 30.0
    assert result.best_rsum is None  # not selected on rsum
    epochs = _epochs(out)
    assert [r["best_epoch"] for r in epochs] == [0, 1, 1]
    assert [r["best_metric"] for r in epochs] == [10.0, 30.0, 30.0]
    assert [r["best_identity_t2i_r1"] for r in epochs] == [10.0, 30.0, 30.0]
    assert all(r["select_on"] == "identity_t2i_r1" and "best_rsum" not in r for r in epochs)
    assert [r["dev_rsum"] for r in epochs] == [100.0, 50.0, 200.0]
    summaries = [x for x in lines if x.startswith("epoch ")]
    assert ", dev identity_t2i_r1 20.00 (best 30.00 at epoch 1), " in summaries[-1]
    state = load_checkpoint(out / "last.pt")
    assert (state["select_on"], state["best_metric"], state["best_rsum"]) == (
        "identity_t2i_r1",
        30.0,
        None,
    )
    assert best_selection(state) == ("identity_t2i_r1", 30.0)


def test_select_on_rsum_or_map_picks_their_own_best_epochs(cuhk, tmp_path, scripted_dev):
    for key, best in (("rsum", 2), ("identity_t2i_map", 0)):
        out = tmp_path / key
        with Trainer(_config(cuhk, out, select_on=key, epochs=3), print_fn=None) as trainer:
            result = trainer.fit()
        assert _held_epoch(out / "best.pt") == best, key
        assert result.best_metric == DEV[best][key]
        assert result.best_rsum == (200.0 if key == "rsum" else None)
        assert _epochs(out)[-1][f"best_{key}"] == DEV[best][key]


# -- resume -------------------------------------------------------------------------------------


def _as_old_checkpoint(path: Path) -> None:
    """Rewrite ``path`` as vlret wrote it before train.select_on: no select_on / best_metric,
    the best dev rsum as best_rsum, no select_on key in the stored config."""
    state = load_checkpoint(path)
    state.pop("select_on")
    best = state.pop("best_metric")
    state["best_rsum"] = best
    del state["config"]["train"]["select_on"]
    save_checkpoint(state, path)


def test_an_old_checkpoint_resumes_as_rsum_selected(cuhk, tmp_path, scripted_dev):
    out = tmp_path / "run"
    with Trainer(_config(cuhk, out, select_on="rsum", epochs=2), print_fn=None) as trainer:
        trainer.fit()
    _as_old_checkpoint(out / "last.pt")
    assert best_selection(load_checkpoint(out / "last.pt")) == ("rsum", 100.0)
    # the format's default (identity_t2i_r1) is not what the old run selected on: refused, one line
    with pytest.raises(RunFolderError) as err:
        Trainer(_config(cuhk, out), resume=out / "last.pt", print_fn=None)
    text = str(err.value)
    assert "\n" not in text and text.startswith(f"{out / 'last.pt'}: its best.pt is selected on")
    assert "dev rsum and this run's train.select_on is 'identity_t2i_r1'" in text
    assert 'set train.select_on = "rsum"' in text
    resumed = Trainer(_config(cuhk, out, select_on="rsum"), resume=out / "last.pt", print_fn=None)
    assert (resumed.epoch, resumed.best_metric, resumed.best_epoch) == (2, 100.0, 0)
    with resumed:
        result = resumed.fit()
    assert scripted_dev == [0, 1, 2]
    assert result.best_metric == 200.0 and _held_epoch(out / "best.pt") == 2
    assert [r["best_rsum"] for r in _epochs(out)] == [100.0, 100.0, 200.0]


def test_an_old_checkpoint_that_kept_a_higher_rsum_is_not_overwritten(cuhk, tmp_path, scripted_dev):
    out = tmp_path / "run"
    with Trainer(_config(cuhk, out, select_on="rsum", epochs=2), print_fn=None) as trainer:
        trainer.fit()
    state = load_checkpoint(out / "last.pt")
    _as_old_checkpoint(out / "last.pt")
    old = load_checkpoint(out / "last.pt")
    old["best_rsum"] = 500.0  # above every scripted rsum: epoch 2 must not write best.pt
    save_checkpoint(old, out / "last.pt")
    before = (out / "best.pt").read_bytes()
    with Trainer(
        _config(cuhk, out, select_on="rsum"), resume=out / "last.pt", print_fn=None
    ) as resumed:
        result = resumed.fit()
    assert result.best_metric == 500.0
    assert (out / "best.pt").read_bytes() == before and state["best_epoch"] == 0
    assert _epochs(out)[-1]["best_epoch"] == 0


def test_a_resume_that_changes_select_on_is_refused(cuhk, tmp_path, scripted_dev):
    out = tmp_path / "run"
    with Trainer(_config(cuhk, out, epochs=1), print_fn=None) as trainer:
        trainer.fit()
    with pytest.raises(RunFolderError) as err:
        Trainer(
            _config(cuhk, out, select_on="identity_t2i_map"), resume=out / "last.pt", print_fn=None
        )
    assert str(err.value) == (
        f"{out / 'last.pt'}: its best.pt is selected on dev identity_t2i_r1 and this run's "
        "train.select_on is 'identity_t2i_map'; a resumed run keeps its selection metric (set "
        'train.select_on = "identity_t2i_r1", or start a new run in another output_dir)'
    )
    # the same metric spelled out resumes (null and "identity_t2i_r1" are one choice on person
    # data)
    again = Trainer(
        _config(cuhk, out, select_on="identity_t2i_r1"), resume=out / "last.pt", print_fn=None
    )
    assert again.select_on == "identity_t2i_r1" and again.best_metric == 10.0
    again.close()


def test_the_older_spelling_selects_and_resumes_as_todays(cuhk, tmp_path, scripted_dev):
    """Earlier releases wrote the identity-level keys t2i_R1 ... i2t_mINP: a config naming one
    selects today's metric, and a checkpoint that stored one resumes under today's name."""
    assert selection_metric(_config(cuhk, tmp_path, select_on="t2i_R1")) == "identity_t2i_r1"
    assert selection_metric(_config(cuhk, tmp_path, select_on="i2t_mINP")) == "identity_i2t_minp"
    out = tmp_path / "run"
    with Trainer(_config(cuhk, out, epochs=1), print_fn=None) as trainer:
        trainer.fit()
    state = load_checkpoint(out / "last.pt")
    state["select_on"] = "t2i_R1"  # as an earlier release stored it
    save_checkpoint(state, out / "last.pt")
    assert best_selection(load_checkpoint(out / "last.pt")) == ("identity_t2i_r1", 10.0)
    again = Trainer(_config(cuhk, out), resume=out / "last.pt", print_fn=None)
    assert again.select_on == "identity_t2i_r1" and again.best_metric == 10.0
    again.close()
