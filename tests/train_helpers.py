"""Tiny data and configs shared by the training tests (not a test module)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from vlret.data.writers import make_tiny_precomp
from vlret.train.config import RunConfig, apply_overrides, config_from_dict

SIZES = {"train": 8, "dev": 2, "test": 2, "testall": 5}


def tiny_data(root: Path) -> Path:
    make_tiny_precomp(root, sizes=SIZES, feature_shape=(4, 16), seed=0)
    return root


def tiny_raw(data: Path, out: Path, **loss: Any) -> dict[str, Any]:
    return {
        "output_dir": str(out),
        "data": {"root": str(data), "format": "precomp", "min_count": 1},
        "model": {
            "embed_dim": 16,
            "image": {"kind": "precomp", "in_dim": 16, "pooling": "max"},
            "text": {"kind": "gru", "word_dim": 8, "bidirectional": True, "pooling": "last"},
        },
        "loss": {"name": "triplet", **loss},
        "optim": {"name": "adam", "lr": 1e-3, "decay_epochs": [2], "warmup_steps": 3},
        "train": {
            "epochs": 3,
            "batch_size": 8,
            "seed": 0,
            "log_every": 2,
            "progress": False,
        },
    }


def tiny_config(data: Path, out: Path, overrides: list[str] | None = None, **loss) -> RunConfig:
    return config_from_dict(apply_overrides(tiny_raw(data, out, **loss), overrides))


def model_params(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def assert_same_params(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], atol=0.0) -> None:
    assert a.keys() == b.keys()
    for k in a:
        if not isinstance(a[k], torch.Tensor):  # extra state: plain values (NaN-safe compare)
            assert repr(a[k]) == repr(b[k]), k
        elif atol == 0.0:
            assert torch.equal(a[k], b[k]), k
        else:
            torch.testing.assert_close(a[k], b[k], atol=atol, rtol=0, msg=k)
