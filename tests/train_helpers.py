"""Tiny data and configs shared by the training tests (not a test module)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader

from vlret.data.writers import make_tiny_msrvtt, make_tiny_precomp
from vlret.run.config import RunConfig, apply_overrides, config_from_dict

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


# -- two gloo ranks against one process (test_train_cross, test_train_experts) -----------------


def rank_env(rank: int, world: int, port: int) -> None:
    """A forked gloo rank's torchrun environment, one thread, float64 (the DDP equality tests)."""
    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float64)


def steps_state(trainer: Any, steps: int, *, every_grad: bool = True) -> dict[str, torch.Tensor]:
    """Run ``steps`` training steps of epoch 0 and return what they did: the initial and final
    model (``init.model.*``, ``model.*``), the loss's tensor buffers (``loss.*``), the model's
    gradients (``grad.model.*``; with ``every_grad`` each parameter must have one), the last
    loss and the local batch size."""
    state = {f"init.model.{k}": v for k, v in model_params(trainer.model).items()}
    trainer.sampler.set_epoch(0)
    loader = DataLoader(
        trainer.train_set, batch_sampler=trainer.sampler, collate_fn=trainer.train_set.collate
    )
    batches = iter(loader)
    for _ in range(steps):
        batch = next(batches)
        loss, _ = trainer.train_step(batch)
    trainer.close()
    state.update({f"model.{k}": v for k, v in model_params(trainer.model).items()})
    for k, v in trainer.loss_fn.state_dict().items():
        if isinstance(v, torch.Tensor):
            state[f"loss.{k}"] = v.detach().clone()
    for k, p in trainer.model.named_parameters():
        if p.grad is not None or every_grad:
            state[f"grad.model.{k}"] = p.grad.detach().clone()
    state["loss_value"] = torch.tensor(loss)
    state["local_batch"] = torch.tensor(len(batch.img_index))
    return state


def assert_steps_equal(state: dict, single: dict, tol: float) -> None:
    """A rank's :func:`steps_state` equals one process's: the same initial model, and what the
    steps changed (the moved weights, buffers, gradients, loss) within ``tol`` times each
    tensor's scale. The initial values cancel exactly (the same on both)."""
    assert state.keys() == single.keys()
    init = {k: v for k, v in single.items() if k.startswith("init.")}
    assert_same_params({k: state[k] for k in init}, init)
    moved = {k: v - single[f"init.{k}"] for k, v in single.items() if k.startswith("model.")}
    for k, want in single.items():
        if k.startswith("init.") or k == "local_batch":
            continue
        if k.startswith("model."):
            got, want = state[k] - single[f"init.{k}"], moved[k]
        else:
            got = state[k]
        if not want.is_floating_point():
            assert torch.equal(got, want), k
            continue
        ref = moved if k.startswith("model.") else single
        scale = want.abs().max().item()
        if k.endswith(".bias") and f"{k[:-5]}.weight" in ref:
            # A bias's gradient sums the output gradients that its weight's sums against the
            # inputs (unit vectors, tanh: entries <= 1). Where they cancel (a bias in front of a
            # softmax over regions, words, SGR's keys or NetVLAD's clusters sums to zero by
            # shift invariance) only rounding is left: at the weight's scale.
            scale = max(scale, ref[f"{k[:-5]}.weight"].abs().max().item())
        scale = max(scale, 1e-300)
        torch.testing.assert_close(
            got, want, rtol=0, atol=tol * scale, msg=lambda m, k=k: f"{k}: {m}"
        )


def tiny_msrvtt_run_config(tmp_path: Path) -> tuple[Path, Path]:
    """A tiny MSR-VTT data set (4 / 2 / 3 videos x 4 captions) under ``tmp_path / "msrvtt"``
    and a one-epoch mean-pooled video run config on it (``tmp_path / "run.yaml"``, its run
    folder ``tmp_path / "run"``): ``(data root, config path)``."""
    root = tmp_path / "msrvtt"
    make_tiny_msrvtt(root, sizes={"train": 4, "validate": 2, "test": 3}, captions_per_video=4)
    raw = tiny_raw(root, tmp_path / "run")
    raw["data"].update(format="msrvtt", protocol="full", captions_per_video=4)
    raw["model"]["image"] = {"kind": "video", "in_dim": 8, "pooling": "mean"}
    raw["train"]["epochs"] = 1
    cfg = tmp_path / "run.yaml"
    cfg.write_text(json.dumps(raw))  # JSON is valid YAML
    return root, cfg
