"""``--set section.key=null`` deletes the key (the declared default applies), except where the
declaration accepts None with another default: there null is None, as it always was."""

from __future__ import annotations

from pathlib import Path

import pytest

from train_helpers import tiny_raw
from vlret.run.config import apply_overrides, config_from_dict
from vlret.run.config_files import ConfigError

DATA, OUT = Path("data"), Path("runs/x")


def resolved(raw, overrides):
    return config_from_dict(apply_overrides(raw, overrides))


def test_null_deletes_a_key_with_a_non_none_default():
    raw = tiny_raw(DATA, OUT, margin=0.5, hardest=False)
    out = apply_overrides(raw, ["loss.margin=null", "loss.hardest=NULL"])
    assert out["loss"] == {"name": "triplet"}
    assert raw["loss"]["margin"] == 0.5  # the input is not touched
    config = config_from_dict(out)
    assert config.loss.params == {}  # the loss's declared defaults apply
    assert resolved(raw, ["loss.margin=~"]).loss.params == {"hardest": False}
    # what null did before: None reached the loss's declaration, which refuses it
    with pytest.raises(ConfigError, match="loss.margin"):
        config_from_dict({**raw, "loss": {"name": "triplet", "margin": None}})


def test_null_switches_a_shared_parameter_back_to_the_new_loss_default():
    raw = tiny_raw(DATA, OUT, reduction="sum")  # triplet's own reduction, written out
    kept = resolved(raw, ["loss.name=sdm"])
    assert kept.loss.params == {"reduction": "sum"}  # a parameter both declare carries over
    switched = resolved(raw, ["loss.name=sdm", "loss.reduction=null"])
    assert switched.loss.name == "sdm" and switched.loss.params == {}  # sdm's own: mean
    # the order of the overrides does not matter
    other = resolved(raw, ["loss.reduction=null", "loss.name=sdm"])
    assert other.loss.params == switched.loss.params


def test_null_stays_none_where_the_declaration_accepts_none_with_another_default():
    raw = tiny_raw(DATA, OUT)
    raw["optim"]["grad_clip"] = 5.0
    out = apply_overrides(raw, ["data.dev_split=null", "optim.grad_clip=null"])
    assert out["data"]["dev_split"] is None and out["optim"]["grad_clip"] is None
    config = config_from_dict(out)
    assert config.data.dev_split is None  # "no validation", not the default "dev"
    assert config.optim.grad_clip is None
    # a deleted key whose default is None resolves to that None
    raw["data"]["vocab"] = "vocab.json"
    out = apply_overrides(raw, ["data.vocab=null"])
    assert "vocab" not in out["data"] and config_from_dict(out).data.vocab is None


def test_null_then_a_value_and_nested_keys():
    raw = tiny_raw(DATA, OUT)
    raw["optim"]["lr_multipliers"] = {"text_encoder.gru": 0.1, "image_encoder": 0.5}
    out = apply_overrides(
        raw,
        [
            'optim.lr_multipliers."text_encoder.gru"=null',
            "loss.margin=null",
            "loss.margin=0.3",
            "train.nothing_here=null",  # an absent key stays absent
        ],
    )
    assert out["optim"]["lr_multipliers"] == {"image_encoder": 0.5}
    assert out["loss"]["margin"] == 0.3
    assert "nothing_here" not in out["train"]
    assert "figure" not in apply_overrides(raw, ["model.figure.size=null"])["model"]
    with pytest.raises(ConfigError, match=r"--set: optim\.lr\.x: optim\.lr holds"):
        apply_overrides(raw, ["optim.lr.x=null"])
