"""USER's configs (issue 45): the release's settings per dataset (train_region_{f30k,coco}.sh,
arguments.py, lib/vse.py), and the AdaCL rows with AdaCL Table 1's training details."""

from __future__ import annotations

import pytest

from vlret.configs import shipped_configs
from vlret.run.config import load_config

CONFIGS = shipped_configs()


def flat(name: str) -> dict:
    """``{"section.key": value}`` of a shipped config (nested tables kept whole)."""
    out: dict = {}
    for section, value in load_config(CONFIGS[name]).to_dict().items():
        if isinstance(value, dict):
            out.update({f"{section}.{k}": v for k, v in value.items()})
        else:
            out[section] = value
    return out


def differences(a: str, b: str) -> set[str]:
    fa, fb = flat(a), flat(b)
    return {k for k in fa.keys() | fb.keys() if fa.get(k) != fb.get(k)} - {"output_dir"}


@pytest.mark.parametrize(
    "data, epochs, decay, weight, queue",
    [("f30k", 20, 10, 20.0, 2048), ("coco", 25, 15, 1.0, 4096)],
)
def test_user_rows_are_the_releases_training_scripts(data, epochs, decay, weight, queue):
    c = load_config(CONFIGS[f"user_{data}_uto"])
    assert c.loss.name == "uto"
    assert c.loss.params == {
        "alpha": 90.0,
        "epsilon": 0.5,
        "batch_weight": weight,
        "queue_size": queue,
    }
    assert c.train.momentum_encoder == 0.999 and c.train.batch_size == 128
    assert (c.train.epochs, c.optim.decay_epochs, c.optim.decay_factor) == (epochs, [decay], 0.1)
    assert (c.optim.name, c.optim.lr, c.optim.weight_decay, c.optim.grad_clip) == (
        "adamw",
        5e-4,
        1e-4,
        2.0,
    )
    assert c.optim.lr_multipliers == {"text_encoder.bert": 0.1} and c.optim.no_decay == []
    assert c.model["embed_dim"] == 1024 and c.data.text_augment == "vse_infinity"
    image, text = c.model["image"], c.model["text"]
    assert (image["kind"], image["num_regions"], image["dropout"], image["pooling"]) == (
        "user",
        36,
        0.4,
        "gpo",
    )
    assert (text["kind"], text["pooling"]) == ("bert", "gpo")
    assert queue % c.train.batch_size == 0  # the release's queue asserts it


def test_the_two_user_rows_differ_in_the_dataset_settings_only():
    assert differences("user_f30k_uto", "user_coco_uto") == {
        "data.root",
        "loss.batch_weight",
        "loss.queue_size",
        "optim.decay_epochs",
        "train.epochs",
    }


@pytest.mark.parametrize("data", ["f30k", "coco"])
def test_adacl_user_rows_have_adacl_table1_details(data):
    c = load_config(CONFIGS[f"adacl_user_{data}"])
    assert c.loss.name == "adacl"
    assert c.loss.params == {"m1_init": 20.0, "m2_init": 0.1, "p_u": 0.03, "queue_size": 4096}
    assert c.train.momentum_encoder == 0.99
    assert (c.train.batch_size, c.optim.name, c.optim.lr, c.model["embed_dim"]) == (
        64,
        "adam",
        2e-4,
        256,
    )
    assert (c.optim.decay_epochs, c.optim.decay_factor, c.train.epochs) == ([20, 30], 0.85, 40)
    assert c.data.max_caption_tokens == 32 and c.model["image"]["num_regions"] == 36
    # USER's own model settings are its base row's
    base = flat(f"user_{data}_uto")
    row = flat(f"adacl_user_{data}")
    assert row["model.image"] == base["model.image"] and row["model.text"] == base["model.text"]
    assert row["optim.lr_multipliers"] == base["optim.lr_multipliers"]


def test_the_two_adacl_user_rows_differ_in_the_data_only():
    assert differences("adacl_user_f30k", "adacl_user_coco") == {"data.root"}
