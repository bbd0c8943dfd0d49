"""The CLIP configs of AdaCL Table 2 / 10 and Unified B.1.2: both readings shipped side by side
(InfoNCE with and without AdaCL's queue and momentum encoder; the ViT-L/14 towers at a
fine-tuning rate and B.1.2's one rate read literally), open_clip's eps, and the start-of-run
warning for pretrained towers trained at a rate meant for new layers."""

from __future__ import annotations

import dataclasses

import pytest
from torch import nn

from vlret.models import build_model
from vlret.run import load_config
from vlret.train.hooks.core import LrMultipliers
from vlret.train.optim_groups import ParamGroup
from vlret.train.pretrained_rate import (
    CLIP_TOWERS,
    PRETRAINED_TOWER_RATE,
    pretrained_rate_warning,
    tower_rate,
)


def _without(config, *keys: str) -> dict:
    """The config's sections, less the dotted ``keys`` and the output folder."""
    out = config.to_dict()
    out.pop("output_dir")
    for key in keys:
        section, name = key.split(".")
        out[section].pop(name, None)
    return out


@pytest.mark.parametrize("data", ["cc3m", "cc12m"])
def test_the_queue_baseline_differs_from_each_row_by_one_thing(data):
    plain = load_config(f"adacl_clip_{data}_infonce")
    queue = load_config(f"adacl_clip_{data}_infonce_queue")
    adacl = load_config(f"adacl_clip_{data}_adacl")
    # against AdaCL: the loss only (the queue, its width and the momentum encoder are the same)
    assert (queue.loss.params["queue_size"], queue.loss.params["embed_dim"]) == (4096, 512)
    assert (adacl.loss.params["queue_size"], adacl.loss.params["embed_dim"]) == (4096, 512)
    assert queue.train.momentum_encoder == adacl.train.momentum_encoder == 0.99
    assert _without(queue, "loss.name") != _without(adacl, "loss.name")  # the loss
    assert {k: v for k, v in _without(queue).items() if k != "loss"} == {
        k: v for k, v in _without(adacl).items() if k != "loss"
    }
    # against the plain baseline: the negatives only
    assert {k: v for k, v in queue.loss.params.items() if k not in ("queue_size", "embed_dim")} == (
        plain.loss.params
    )
    assert plain.train.momentum_encoder is None
    assert _without(queue, "loss.queue_size", "loss.embed_dim", "train.momentum_encoder") == (
        _without(plain, "train.momentum_encoder")
    )
    for c in (plain, queue, adacl):  # open_clip's AdamW eps, as the headers say
        assert c.optim.eps == 1e-6


def _tiny_clip() -> nn.Module:
    """A random CLIP with the shipped configs' layout (towers, their projections, the added
    768-d layers), small."""
    small = {"hidden_size": 32, "intermediate_size": 32, "num_hidden_layers": 1}
    model = {
        "kind": "clip",
        "preset": "ViT-B-32",
        "tokenizer": "bytes",
        "proj_dim": 768,
        "config": {
            "projection_dim": 16,
            "vision_config": {**small, "num_attention_heads": 2, "image_size": 32, "patch_size": 8},
            "text_config": {**small, "num_attention_heads": 2},
        },
    }
    return build_model(model, vocab_size=20)


@pytest.mark.parametrize(
    "name", ["clip_unified_f30k", "clip_unified_coco", "clip_vlc_f30k", "clip_vlc_coco"]
)
def test_vit_l_configs_train_the_towers_at_a_fine_tuning_rate_and_keep_the_literal_one(name):
    default, literal = load_config(name), load_config(f"{name}_literal")
    # the literal reading: B.1.2's one rate for every weight; otherwise the same run
    assert literal.optim.lr == default.optim.lr == 5e-4 and not literal.optim.lr_multipliers
    assert _without(default, "optim.lr_multipliers") == _without(literal, "optim.lr_multipliers")
    # the default's multipliers, applied by the trainer's own hook to a CLIP's parameter names
    model = _tiny_clip()
    named = list(model.named_parameters())
    groups = LrMultipliers(default.optim.lr_multipliers, source=name).param_groups(
        None, [ParamGroup(tuple(n for n, _ in named), tuple(p for _, p in named))]
    )
    rate = {n: default.optim.lr * g.lr_scale for g in groups for n in g.names}
    for n in rate:
        added = ".embed_proj." in n
        assert rate[n] == pytest.approx(5e-4 if added else 1e-5), n
    for tower in CLIP_TOWERS:  # the warning's reading of the multipliers is the hook's
        inside = [r for n, r in rate.items() if n.startswith(tower + ".")]
        assert inside and all(r == pytest.approx(tower_rate(default, tower)) for r in inside)


def test_the_warning_fires_for_pretrained_towers_at_the_literal_rate_only():
    literal = load_config("clip_unified_f30k_literal")
    line = pretrained_rate_warning(literal)
    assert line is not None and all(f"{t} at lr 0.0005" in line for t in CLIP_TOWERS)
    assert pretrained_rate_warning(load_config("clip_unified_f30k")) is None  # 1e-5
    # from random weights (pre-training, no model.path) nothing is pretrained
    assert pretrained_rate_warning(load_config("adacl_clip_cc3m_infonce")) is None
    just_below = dataclasses.replace(literal.optim, lr=PRETRAINED_TOWER_RATE * 0.99)
    assert pretrained_rate_warning(dataclasses.replace(literal, optim=just_below)) is None
    # a tower that never trains is not warned about; the other one still is
    locked = dataclasses.replace(literal.train, lock=["image_encoder"])
    line = pretrained_rate_warning(dataclasses.replace(literal, train=locked))
    assert line is not None and "image_encoder" not in line and "text_encoder.text_model" in line
    frozen = dataclasses.replace(
        literal.train, freeze=["text_encoder"], freeze_epochs=literal.train.epochs
    )
    line = pretrained_rate_warning(dataclasses.replace(literal, train=frozen))
    assert line is not None and "text_encoder" not in line
