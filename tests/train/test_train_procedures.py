"""Training procedures (``train.procedure``): the registry, the standard step's empty state,
and the checkpoint's ``procedure`` entry, written by a procedure and restored on a resume."""

from __future__ import annotations

import pytest
import torch

from vlret.run.config import config_from_dict
from vlret.train.loss_step import LossStep
from vlret.train.procedures.registry import (
    PROCEDURES,
    build_procedure,
    procedure_names,
    register_procedure,
)


def _config(tmp_path, **train):
    return config_from_dict(
        {
            "output_dir": str(tmp_path / "run"),
            "data": {"root": str(tmp_path / "data"), "format": "precomp", "min_count": 1},
            "model": {"embed_dim": 8, "image": {"in_dim": 16}, "text": {"word_dim": 4}},
            "loss": {"name": "triplet"},
            "train": {"epochs": 1, "batch_size": 4, "progress": False, **train},
        }
    )


class CountingStep(LossStep):
    """A procedure with state: counts its steps, and checkpoints the count."""

    name = "counting-test"

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, trainer, batch):
        self.calls += 1
        return super().__call__(trainer, batch)

    def state_dict(self):
        return {"calls": torch.tensor(self.calls)}

    def load_state_dict(self, state):
        self.calls = int(state["calls"])


@pytest.fixture
def counting():
    register_procedure("counting-test")(lambda config: CountingStep())
    yield
    PROCEDURES.pop("counting-test")


def test_the_standard_procedure_and_unknown_names(tmp_path):
    assert "standard" in procedure_names()
    step = build_procedure(_config(tmp_path))
    assert type(step) is LossStep and step.state_dict() == {} and step.hooks(None) == []
    assert step.validate(None) is None  # the trainer validates its own model
    step.load_state_dict({})
    with pytest.raises(ValueError, match="another training procedure \\(net_b\\)"):
        step.load_state_dict({"net_b": {}})
    with pytest.raises(ValueError, match="unknown procedure 'nope'; known: .*standard"):
        build_procedure(_config(tmp_path, procedure="nope"))
    with pytest.raises(ValueError, match="the standard procedure takes none, got warmup"):
        build_procedure(_config(tmp_path, procedure_options={"warmup": 1}))
    with pytest.raises(ValueError, match="already registered"):
        register_procedure("standard")(lambda config: LossStep())


def test_a_procedures_state_is_checkpointed_and_resumed(tmp_path, counting):
    from vlret.data.writers import make_tiny_precomp
    from vlret.train import Trainer

    make_tiny_precomp(tmp_path / "data", sizes={"train": 8, "dev": 4, "test": 4})
    config = _config(tmp_path, procedure="counting-test", epochs=2)
    trainer = Trainer(config)
    trainer.fit()
    assert trainer.loss_step.calls == trainer.step > 0
    state = torch.load(tmp_path / "run" / "last.pt", weights_only=False)
    assert int(state["procedure"]["calls"]) == trainer.step
    resumed = Trainer(config, resume=tmp_path / "run" / "last.pt")
    assert resumed.loss_step.calls == trainer.step  # restored, not rebuilt from zero
    # a standard run's checkpoint holds an empty procedure state
    make_tiny_precomp(tmp_path / "s" / "data", sizes={"train": 8, "dev": 4, "test": 4})
    assert Trainer(_config(tmp_path / "s")).state_dict()["procedure"] == {}
