"""InfoNCE with AdaCL's negatives in a run: ``loss.queue_size`` with ``train.momentum_encoder``
(the ``adacl_clip_*_infonce_queue`` baselines) trains, and the queue holds the momentum
encoder's keys, not the online model's embeddings."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from train_helpers import tiny_config, tiny_data
from vlret.run.config import ConfigError
from vlret.train import Trainer

QUEUE = ["loss.name=infonce", "loss.queue_size=12", "loss.learnable_temperature=true"]


def _keys_of_every_item(model, train_set) -> tuple[torch.Tensor, torch.Tensor]:
    """The normalised image and text embeddings ``model`` gives each training item."""
    model.eval()
    with torch.no_grad():
        batch = train_set.collate([train_set[i] for i in range(len(train_set))])
        img, txt = model(batch)
    return F.normalize(img.double(), dim=1), F.normalize(txt.double(), dim=1)


def _nearest(queue: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """For each queue entry, its distance to the closest of ``keys``."""
    return torch.cdist(queue.double(), keys).min(dim=1).values


def test_a_queued_infonce_run_enqueues_the_momentum_keys(tmp_path):
    data = tiny_data(tmp_path / "data")
    # momentum 1: the copy never moves, so its keys are the initial model's
    overrides = [*QUEUE, "train.momentum_encoder=1.0", "train.epochs=2", "train.validate=false"]
    config = tiny_config(data, tmp_path / "out", [*overrides, "train.device=cpu"])
    with Trainer(config, print_fn=None) as trainer:
        trainer.fit()
        loss = trainer.loss_fn
        assert loss.img_queue is not None and loss.txt_queue is not None
        assert loss.img_queue.is_full and bool((loss.img_queue.ids >= 0).all())
        copy_img, copy_txt = _keys_of_every_item(trainer.momentum_encoder.module, trainer.train_set)
        online_img, online_txt = _keys_of_every_item(trainer.model, trainer.train_set)
        for queue, copy, online in (
            (loss.img_queue.keys, copy_img, online_img),
            (loss.txt_queue.keys, copy_txt, online_txt),
        ):
            assert float(_nearest(queue, copy).max()) < 1e-5  # every entry a key of the copy
            assert float(_nearest(queue, online).min()) > 1e-3  # none the trained model's


def test_the_config_takes_the_momentum_encoder_only_with_the_queue(tmp_path):
    data = tiny_data(tmp_path / "data")
    tiny_config(data, tmp_path / "out", [*QUEUE, "train.momentum_encoder=0.99"])
    with pytest.raises(ConfigError, match="train.momentum_encoder"):
        tiny_config(data, tmp_path / "out", ["loss.name=infonce", "train.momentum_encoder=0.99"])
