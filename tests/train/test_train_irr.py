"""IRRA's training step (``train.procedure = "irr"``, vlret.train.procedures.irr): chosen by
the loss part ``mlm``, it masks each batch's captions, trains the model's IRR encoder with
the rest of the model, logs ``mlm_acc``, and refuses by name what it cannot run."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from vlret.run.config import config_from_dict
from vlret.train import Trainer
from vlret.train.procedures.irr import IRRStep, masked_accuracy, step_generator
from vlret.train.procedures.registry import build_procedure, resolve_procedure

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from pedes_helpers import TINY_CLIP, write_pedes  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


def raw_config(tmp_path: Path, *, loss: str = "sdm+mlm+id", irr: bool = True) -> dict[str, Any]:
    root = tmp_path / "data"
    if not root.exists():
        write_pedes(root)
    return {
        "output_dir": str(tmp_path / "run"),
        "data": {"root": str(root), "format": "cuhk-pedes", "dev_split": "val", "min_count": 1},
        "model": {
            "kind": "clip",
            "preset": "ViT-B-32",
            "tokenizer": "bytes",
            "config": TINY_CLIP,
            "proj_dim": 0,
            "irr": irr,
        },
        "loss": {"name": loss},
        "optim": {"name": "adam", "lr": 1e-3},
        "train": {"epochs": 1, "batch_size": 4, "seed": 0, "progress": False, "log_every": 1},
    }


def test_the_mlm_part_resolves_the_irr_procedure(tmp_path):
    config = config_from_dict(raw_config(tmp_path))
    assert resolve_procedure(config) == "irr"
    assert isinstance(build_procedure(config), IRRStep)
    plain = config_from_dict(raw_config(tmp_path, loss="sdm+id", irr=False))
    assert resolve_procedure(plain) == "standard"


def test_a_run_trains_the_irr_encoder_and_logs_mlm_acc(tmp_path):
    """One epoch of sdm+mlm+id: every IRR weight moves, each step record has mlm_acc in
    [0, 1], the dev loss is skipped with the procedure's reason, and the checkpoint rebuilds
    the encoder."""
    printed: list[str] = []
    trainer = Trainer(config_from_dict(raw_config(tmp_path)), print_fn=printed.append)
    before = {k: v.clone() for k, v in trainer.model.irr.state_dict().items()}
    trainer.fit()
    after = trainer.model.irr.state_dict()
    moved = [k for k in before if not torch.equal(before[k], after[k])]
    assert set(moved) == set(before)
    steps = [
        json.loads(line)
        for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
        if json.loads(line)["kind"] == "step"
    ]
    assert steps and all(0.0 <= s["mlm_acc"] <= 1.0 for s in steps)
    assert any("the dev split has no masked-token loss" in p for p in printed)
    state = torch.load(tmp_path / "run" / "last.pt", map_location="cpu", weights_only=False)
    assert any(k.startswith("irr.") for k in state["model"])


def test_the_mlm_part_without_model_irr_is_refused_by_name(tmp_path):
    config = config_from_dict(raw_config(tmp_path, irr=False))
    with pytest.raises(ValueError, match=r"needs IRRA's cross-modal encoder: set model.irr = true"):
        Trainer(config, print_fn=lambda s: None).fit()


@pytest.mark.parametrize("procedure", ["irr", "standard"])
def test_model_irr_without_the_mlm_part_is_refused_by_name(tmp_path, procedure):
    """With the standard procedure the encoder would sit idle, trained by nothing: refused
    when the config is read, as with the irr procedure."""
    raw = raw_config(tmp_path, loss="sdm+id")
    raw["train"]["procedure"] = procedure
    with pytest.raises(ValueError, match=r'model.irr: .*trained only by the loss part "mlm"'):
        config_from_dict(raw)


def test_the_masking_draws_are_a_function_of_seed_epoch_and_step():
    draw = lambda *key: torch.rand(8, generator=step_generator(*key))  # noqa: E731
    assert torch.equal(draw(0, 1, 2), draw(0, 1, 2))
    assert not torch.equal(draw(0, 1, 2), draw(0, 1, 3))
    assert not torch.equal(draw(0, 1, 2), draw(0, 2, 2))
    assert not torch.equal(draw(0, 1, 2), draw(1, 1, 2))


def test_masked_accuracy_counts_masked_positions_only():
    logits = torch.tensor([[[0.0, 1.0], [1.0, 0.0], [0.0, 1.0]]])
    labels = torch.tensor([[1, 1, -100]])
    assert masked_accuracy(logits, labels) == 0.5


def test_the_shipped_irra_config_trains_on_a_tiny_stand_in(tmp_path):
    """person_cuhk_irra as shipped (IRRA's 5 x lr groups for the classifier and the IRR
    encoder, amp = true, eps 1e-3) with a tiny random CLIP and folder: every multiplier names
    parameters, and the encoder's groups run at 5 x lr, its layer norms at 1 x."""
    from vlret.configs import shipped_configs
    from vlret.run.config import load_config

    raw = load_config(shipped_configs()["person_cuhk_irra"]).to_dict()
    tiny = raw_config(tmp_path)
    raw["output_dir"], raw["data"]["root"] = tiny["output_dir"], tiny["data"]["root"]
    raw["data"]["min_count"] = 1
    raw["model"] = {**tiny["model"], "image_size": [32, 16]}
    raw["optim"]["warmup_steps"] = 0
    raw["train"].update(epochs=1, batch_size=4, progress=False)
    trainer = Trainer(config_from_dict(raw), print_fn=lambda s: None)
    lr_of = {id(p): g["lr"] for g in trainer.optimizer.param_groups for p in g["params"]}
    named = dict(trainer.model.named_parameters())
    for name, lr in {
        "irr.cross_attn.in_proj_weight": 5e-5,
        "irr.blocks.0.attn.in_proj_weight": 5e-5,
        "irr.mlm_head.3.weight": 5e-5,
        "irr.ln_pre_t.weight": 1e-5,
        "irr.ln_post.weight": 1e-5,
        "text_encoder.text_projection.weight": 1e-5,
    }.items():
        assert lr_of[id(named[name])] == pytest.approx(lr), name
    trainer.fit()
    assert (tmp_path / "run" / "last.pt").exists()
