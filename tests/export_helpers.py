"""Shared by the export tests: a tiny CLIP checkpoint written as ``vlret train`` writes one
(its resolved config, encoder state, model and loss state dicts, :func:`save_checkpoint`),
and PIL images of several modes and sizes saved by PIL."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch

from vlret.configs import shipped_config
from vlret.models import build_model
from vlret.run.builders import build_encoder, encoder_state
from vlret.run.checkpoint import save_checkpoint
from vlret.run.config import load_config

#: synth_clip_pretrain's CLIP, narrower (the shipped config's other sections unchanged).
TINY = {
    "projection_dim": 16,
    "vision_config": {
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "image_size": 32,
        "patch_size": 8,
    },
    "text_config": {
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "max_position_embeddings": 77,
    },
}
#: The temperature the checkpoint's loss "learned".
LEARNED_TEMPERATURE = 0.05


def tiny_clip_checkpoint(folder: Path, *, model_overrides: dict | None = None) -> Path:
    """``folder/best.pt`` of a randomly initialised tiny byte-tokenized CLIP, as training
    writes it; returns the run folder."""
    sets = ["model.config=" + _toml(TINY)]
    for key, value in (model_overrides or {}).items():
        sets.append(f"model.{key}={_toml(value)}")
    config = load_config(shipped_config("synth_clip_pretrain"), sets, note=None)
    torch.manual_seed(0)
    model = build_model(config.model)
    with torch.no_grad():  # trained-looking biases and norms, not transformers' zeros / ones
        for name, param in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                param.add_(0.1 * torch.randn_like(param))
    encoder = build_encoder(config.data, model=config.model)
    raw = config.to_dict()
    raw["model"] = {**dict(model.config), "scoring": model.scoring}
    state = {
        "version": 1,
        "config": raw,
        "encoder": encoder_state(encoder, config),
        "model": model.state_dict(),
        "loss": {"log_scale": torch.tensor(math.log(1 / LEARNED_TEMPERATURE))},
        "vocab_size": None,
        "epoch": 0,
    }
    folder.mkdir(parents=True, exist_ok=True)
    save_checkpoint(state, folder / "best.pt")
    return folder


def _toml(value) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    return repr(value)


def pil_images(folder: Path, sizes: list[tuple[int, int]]) -> list[Path]:
    """Noise images of ``(height, width)`` saved by PIL in turn as RGB PNG, grey PNG, RGBA
    PNG, palette PNG and RGB JPEG."""
    from PIL import Image

    rng = np.random.default_rng(1)
    modes = [("RGB", "png"), ("L", "png"), ("RGBA", "png"), ("P", "png"), ("RGB", "jpg")]
    paths = []
    folder.mkdir(parents=True, exist_ok=True)
    for i, (h, w) in enumerate(sizes):
        mode, ext = modes[i % len(modes)]
        rgb = Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8), "RGB")
        image = rgb.convert(mode) if mode != "P" else rgb.quantize(colors=64)
        path = folder / f"{i}_{mode}.{ext}"
        image.save(path)
        paths.append(path)
    return paths
