"""The configs of issue 43's missing rows: each differs from the config it is measured against in
exactly what its header says, and the WSL rows refuse a missing weights file in one line."""

from __future__ import annotations

import pytest

from vlret.configs import shipped_configs
from vlret.run.builders import build_run_model
from vlret.run.config import ConfigError, load_config

CONFIGS = shipped_configs()


def flat(name: str) -> dict:
    """The resolved config of a shipped config as ``{"section.key": value}``."""
    out: dict = {}

    def walk(prefix: str, value: object) -> None:
        if isinstance(value, dict) and prefix.count(".") < 1:
            for key, item in value.items():
                walk(f"{prefix}.{key}" if prefix else key, item)
        else:
            out[prefix] = value

    walk("", load_config(CONFIGS[name]).to_dict())
    return out


def differences(a: str, b: str) -> set[str]:
    fa, fb = flat(a), flat(b)
    return {k for k in fa.keys() | fb.keys() if fa.get(k) != fb.get(k)} - {"output_dir"}


def test_bfan_prob_aoq_is_bfan_equal_aoq_with_prob_focal_attention():
    assert differences("bfan_prob_f30k_aoq", "bfan_equal_f30k_aoq") == {
        "model.focal",
        "data.offline_negatives",
    }
    c = flat("bfan_prob_f30k_aoq")
    assert c["model.focal"] == "prob" and c["loss.name"] == "aoq"
    assert c["data.offline_negatives"] == "runs/bfan_prob_f30k_triplet/negatives.npz"


@pytest.mark.parametrize(
    "system", ["goal_vsepp_resnet152_coco", "goal_vseinf_coco", "goal_vseinf_wsl_coco"]
)
def test_goal_table2_concon_rows_change_only_the_loss(system):
    assert {k.split(".")[0] for k in differences(f"{system}_concon", f"{system}_triplet")} == {
        "loss"
    }
    cfg = load_config(CONFIGS[f"{system}_concon"])
    assert cfg.loss.name == "goal"
    assert cfg.loss.params == {"triplet_weight": "con", "pair_weight": "con", "margin": 0.2}


@pytest.mark.parametrize("module", ["sgr", "saf"])
def test_vsl_table4_rows_add_only_the_text_side(module):
    assert differences(f"vsl_{module}_coco_lts", f"vsl_{module}_coco") == {"loss.text_side"}
    assert load_config(CONFIGS[f"vsl_{module}_coco_lts"]).loss.params["text_side"] is True


@pytest.mark.parametrize("data", ["f30k", "coco"])
@pytest.mark.parametrize("base", ["cmpm", "vsepp"])
def test_adacl_table1_resnet_rows_differ_from_their_baseline_in_the_loss(data, base):
    adacl, plain = f"adacl_{base}_resnet_{data}", f"{base}_resnet_{data}"
    outside_loss = {k for k in differences(adacl, plain) if not k.startswith("loss.")}
    assert outside_loss == {"train.momentum_encoder"}  # the bank's momentum encoder
    a, b = load_config(CONFIGS[adacl]), load_config(CONFIGS[plain])
    assert a.loss.params["weights"] == {base if base == "cmpm" else "triplet": 1.0, "adacl": 1.0}
    if base == "vsepp":  # the triplet part is the baseline's loss
        assert a.loss.params["triplet"] == b.loss.params == {"margin": 0.2, "hardest": True}
    assert a.loss.params["adacl"]["queue_size"] == 4096
    assert a.loss.name == ("cmpm+adacl" if base == "cmpm" else "triplet+adacl")
    assert a.train.momentum_encoder == 0.99
    assert (a.train.batch_size, a.optim.lr, a.model["embed_dim"], a.train.epochs) == (
        64,
        2e-4,
        256,
        40,
    )
    assert a.model["image"]["kind"] == "resnet" and a.model["text"]["bidirectional"] is True
    assert a.optim.lr_multipliers == {"image_encoder.backbone": 0.1}


@pytest.mark.parametrize(
    "name, module, root",
    [
        ("adacl_sgraf_coco", "sgr", "data/coco_precomp"),
        ("adacl_saf_f30k", "saf", "data/f30k_precomp"),
        ("adacl_saf_coco", "saf", "data/coco_precomp"),
    ],
)
def test_adacl_sgraf_rows_are_the_f30k_sgr_row_on_other_data_or_module(name, module, root):
    expected = {"model.module"} if module == "saf" else set()
    expected |= {"data.root"} if root != "data/f30k_precomp" else set()
    assert differences(name, "adacl_sgraf_f30k") == expected
    c = flat(name)
    assert (c["model.module"], c["data.root"]) == (module, root)


@pytest.mark.parametrize("name", [n for n in CONFIGS if n.startswith("goal_vseinf_wsl_")])
def test_wsl_rows_train_vse_infinity_grid_setting(name):
    cfg = load_config(CONFIGS[name])
    image = cfg.model["image"]
    assert (image["kind"], image["image_size"], image["pooling"]) == ("resnext-wsl", 512, "gpo")
    assert image["path"].endswith(".pth")
    assert cfg.optim.lr_multipliers == {"text_encoder.bert": 0.1, "image_encoder.backbone": 0.01}
    assert (cfg.train.freeze, cfg.train.freeze_epochs) == (["image_encoder.backbone"], 1)
    assert (cfg.train.epochs, cfg.optim.decay_epochs, cfg.train.all_negatives_epochs) == (
        25,
        [15],
        1,
    )


def test_wsl_rows_refuse_a_missing_weights_file_naming_it(tmp_path):
    cfg = load_config(
        CONFIGS["goal_vseinf_wsl_coco_goal"],
        [
            f"model.image.path={str(tmp_path / 'absent.pth')!r}",
            'model.text={kind="gru", word_dim=8}',
        ],
    )
    with pytest.raises((FileNotFoundError, ConfigError)) as err:
        build_run_model(cfg, 20)
    assert "absent.pth: missing" in str(err.value) and "\n" not in str(err.value)
