"""``vlret export --format open_clip``: a vlret CLIP as open_clip's ``CLIP`` state dict and
model config.

The folder holds ``open_clip_pytorch_model.bin`` (a plain state dict, ``torch.save``, which
open_clip's ``load_checkpoint`` reads), ``open_clip_model_config.json`` (the format of
open_clip's ``src/open_clip/model_configs/*.json``: ``embed_dim``, ``quick_gelu``,
``vision_cfg``, ``text_cfg``; ``open_clip.add_model_config`` registers it under the name
``open_clip_model_config``) and ``open_clip_config.json`` (the Hub layout open_clip's
``hf-hub:`` loader reads: ``model_cfg`` and the ``preprocess_cfg`` of the image transform).

**Keys.** open_clip's ViT ``CLIP`` names the vision tower ``visual.*`` (``conv1``,
``class_embedding``, ``positional_embedding``, ``ln_pre``, ``transformer.resblocks.N``,
``ln_post``, ``proj``) and keeps the text tower at the top (``token_embedding``,
``positional_embedding``, ``transformer.resblocks.N``, ``ln_final``, ``text_projection``),
with ``logit_scale``. A residual block is ``ln_1``, ``attn`` (``torch.nn.MultiheadAttention``:
``in_proj_weight`` / ``in_proj_bias`` are ``transformers``' ``q_proj``, ``k_proj``,
``v_proj`` stacked in that order; ``out_proj``), ``ln_2`` and ``mlp.c_fc`` / ``mlp.c_proj``
(``fc1`` / ``fc2``). Its projections are ``(width, embed_dim)`` matrices used as
``x @ proj``: ``transformers``' ``weight`` transposed.

**What open_clip cannot express** (refused in one line, besides :mod:`.parts`'s refusals):
an activation other than GELU or CLIP's QuickGELU, or different ones in the two towers
(open_clip has one ``quick_gelu`` switch); a LayerNorm epsilon other than open_clip's 1e-5;
an MLP width that is not ``int(width * mlp_ratio)``; a vision width that its heads do not
divide; and a tokenizer other than open_clip's own: open_clip tokenizes with OpenAI's
49,408-token BPE (start 49406, end 49407), pools the text tower at the largest id
(``pool_type = "argmax"``) behind a causal mask, so vlret's byte tokenizer and any other
vocabulary are refused (export those with ``--format hf``).

**Image preprocessing.** open_clip's evaluation transform (``resize_mode = "shortest"``)
resizes the shorter side with PIL's filter and centre-crops with torchvision's rounded offsets,
which is vlret's preset CLIP transform; ``preprocess_cfg`` carries the size, mean, std and
filter. A CLIP loaded from a folder crops at ``transformers``' floor offsets instead (the
returned note says so).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch

from ..._files import atomic_write, atomic_write_text
from ..clip import CLIPByteTokenizer
from .folder import write_export_dir
from .hf import DEFAULT_LOGIT_SCALE
from .parts import CLIPParts, ExportRefused, clip_parts

#: open_clip's tokenizer: OpenAI's BPE size and its start / end of text ids.
OPEN_CLIP_VOCAB, OPEN_CLIP_BOS, OPEN_CLIP_EOS = 49408, 49406, 49407
#: ``transformers``' activation name -> open_clip's ``quick_gelu`` switch.
ACTIVATIONS = {"gelu": False, "quick_gelu": True}
#: open_clip's LayerNorm epsilon (torch's default).
OPEN_CLIP_LN_EPS = 1e-5
#: The files this format writes.
WEIGHTS_FILE = "open_clip_pytorch_model.bin"
MODEL_CONFIG_FILE = "open_clip_model_config.json"
HUB_CONFIG_FILE = "open_clip_config.json"


def _check_tokenizer(encoder: Any, text_config: dict[str, Any]) -> None:
    if isinstance(encoder, CLIPByteTokenizer):
        raise ExportRefused(
            "the model reads vlret's byte tokenizer; open_clip tokenizes with its own OpenAI "
            "BPE and cannot load another vocabulary (export with --format hf instead)"
        )
    tokenizer = getattr(encoder, "tokenizer", None)
    if tokenizer is None:
        raise ExportRefused(f"the caption encoder {type(encoder).__name__} is not a CLIP tokenizer")
    size = len(tokenizer)
    ids = (getattr(tokenizer, "bos_token_id", None), getattr(tokenizer, "eos_token_id", None))
    if size != OPEN_CLIP_VOCAB or ids != (OPEN_CLIP_BOS, OPEN_CLIP_EOS):
        raise ExportRefused(
            f"the model's tokenizer has {size} tokens, start/end ids {ids[0]}/{ids[1]}; "
            f"open_clip's own is OpenAI's BPE ({OPEN_CLIP_VOCAB} tokens, "
            f"{OPEN_CLIP_BOS}/{OPEN_CLIP_EOS}), the only one its model config can name"
        )
    if text_config.get("eos_token_id") not in (OPEN_CLIP_EOS, 2):
        raise ExportRefused(
            f"text_config eos_token_id {text_config.get('eos_token_id')} is not the largest id "
            f"({OPEN_CLIP_EOS}): open_clip pools at the largest id, this model at its eos"
        )


def _mlp_ratio(config: dict[str, Any], tower: str) -> float:
    width, inner = int(config["hidden_size"]), int(config["intermediate_size"])
    ratio = inner / width
    if int(width * ratio) != inner:
        raise ExportRefused(
            f"{tower} intermediate_size {inner} is not int(width * mlp_ratio) for width {width}"
        )
    return ratio


def open_clip_model_config(parts: CLIPParts) -> dict[str, Any]:
    """open_clip's model config (``model_configs/*.json`` format) of the parts.

    Raises:
        ExportRefused: What open_clip's config cannot say (module docstring).
    """
    vision, text = parts.vision_config, parts.text_config
    acts = (vision.get("hidden_act"), text.get("hidden_act"))
    if acts[0] not in ACTIVATIONS or acts[0] != acts[1]:
        raise ExportRefused(
            f"hidden_act is {acts[0]!r} (vision) and {acts[1]!r} (text); open_clip has one "
            "switch for both towers, GELU or QuickGELU"
        )
    for tower, config in (("vision_config", vision), ("text_config", text)):
        eps = float(config.get("layer_norm_eps", OPEN_CLIP_LN_EPS))
        if eps != OPEN_CLIP_LN_EPS:
            raise ExportRefused(f"{tower} layer_norm_eps {eps} is not open_clip's 1e-5")
    heads = int(vision["num_attention_heads"])
    if int(vision["hidden_size"]) % heads:
        raise ExportRefused(f"vision_config hidden_size is not a multiple of its {heads} heads")
    return {
        "embed_dim": parts.projection_dim,
        "quick_gelu": ACTIVATIONS[acts[0]],
        "vision_cfg": {
            "image_size": parts.image_size,
            "layers": int(vision["num_hidden_layers"]),
            "width": int(vision["hidden_size"]),
            "head_width": int(vision["hidden_size"]) // heads,
            "mlp_ratio": _mlp_ratio(vision, "vision_config"),
            "patch_size": int(vision["patch_size"]),
        },
        "text_cfg": {
            "context_length": int(text["max_position_embeddings"]),
            "vocab_size": int(text["vocab_size"]),
            "width": int(text["hidden_size"]),
            "heads": int(text["num_attention_heads"]),
            "layers": int(text["num_hidden_layers"]),
            "mlp_ratio": _mlp_ratio(text, "text_config"),
        },
    }


def preprocess_config(transform: Any) -> dict[str, Any]:
    """open_clip's ``preprocess_cfg`` of a :class:`~vlret.models.clip.CLIPImageTransform`."""
    return {
        "size": int(transform.crop[0]),
        "mode": "RGB",
        "mean": [float(v) for v in transform.mean.tolist()],
        "std": [float(v) for v in transform.std.tolist()],
        "interpolation": transform.resample,
        "resize_mode": "shortest",
        "fill_color": 0,
    }


def _block(prefix: str, source: dict[str, torch.Tensor], layer: int, out: dict) -> None:
    """One residual block: ``transformers``' ``encoder.layers.N`` -> open_clip's
    ``transformer.resblocks.N`` (module docstring)."""
    src, dst = f"encoder.layers.{layer}.", f"{prefix}transformer.resblocks.{layer}."
    for part in ("weight", "bias"):
        out[dst + f"attn.in_proj_{part}"] = torch.cat(
            [source[src + f"self_attn.{p}_proj.{part}"] for p in ("q", "k", "v")], dim=0
        )
        out[dst + f"attn.out_proj.{part}"] = source[src + f"self_attn.out_proj.{part}"]
        out[dst + f"ln_1.{part}"] = source[src + f"layer_norm1.{part}"]
        out[dst + f"ln_2.{part}"] = source[src + f"layer_norm2.{part}"]
        out[dst + f"mlp.c_fc.{part}"] = source[src + f"mlp.fc1.{part}"]
        out[dst + f"mlp.c_proj.{part}"] = source[src + f"mlp.fc2.{part}"]


def _tensors(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().to("cpu", torch.float32) for k, v in module.state_dict().items()}


def open_clip_state_dict(parts: CLIPParts, logit_scale: float) -> dict[str, torch.Tensor]:
    """open_clip ``CLIP``'s state dict of the parts (module docstring), contiguous float32."""
    vision, text = _tensors(parts.vision_model), _tensors(parts.text_model)
    out: dict[str, torch.Tensor] = {
        "visual.conv1.weight": vision["embeddings.patch_embedding.weight"],
        "visual.class_embedding": vision["embeddings.class_embedding"],
        "visual.positional_embedding": vision["embeddings.position_embedding.weight"],
    }
    for part in ("weight", "bias"):
        out[f"visual.ln_pre.{part}"] = vision[f"pre_layrnorm.{part}"]
        out[f"visual.ln_post.{part}"] = vision[f"post_layernorm.{part}"]
    for layer in range(int(parts.vision_config["num_hidden_layers"])):
        _block("visual.", vision, layer, out)
    out["visual.proj"] = parts.visual_projection.weight.detach().to("cpu", torch.float32).T
    out["token_embedding.weight"] = text["embeddings.token_embedding.weight"]
    out["positional_embedding"] = text["embeddings.position_embedding.weight"]
    for layer in range(int(parts.text_config["num_hidden_layers"])):
        _block("", text, layer, out)
    for part in ("weight", "bias"):
        out[f"ln_final.{part}"] = text[f"final_layer_norm.{part}"]
    out["text_projection"] = parts.text_projection.weight.detach().to("cpu", torch.float32).T
    out["logit_scale"] = torch.tensor(float(logit_scale))
    return {k: v.contiguous().clone() for k, v in out.items()}


def export_open_clip(
    model: Any,
    *,
    encoder: Any,
    out: str | Path,
    logit_scale: float | None = None,
    overwrite: bool = False,
) -> list[str]:
    """Write ``model`` as open_clip's weights and configs (module docstring).

    Args:
        model: A vlret CLIP (:func:`~vlret.models.build_model`, e.g. rebuilt from a checkpoint).
        encoder: Its caption encoder (must be OpenAI's BPE, open_clip's own).
        out: The folder to write (refused if it exists, unless ``overwrite``).
        logit_scale: ``log(1 / temperature)`` for ``logit_scale``; None: CLIP's initial value.
        overwrite: Replace an existing export folder.

    Returns:
        Notes for the user (the crop offsets of a CLIP loaded from a folder).

    Raises:
        ExportRefused: What open_clip cannot express (module docstring, :mod:`.parts`).
        OutputPathError: ``out`` is refused (:func:`~.folder.check_export_dir`).
    """
    parts = clip_parts(model)
    _check_tokenizer(encoder, parts.text_config)
    config = open_clip_model_config(parts)
    scale = DEFAULT_LOGIT_SCALE if logit_scale is None else float(logit_scale)
    if not math.isfinite(scale):
        raise ValueError(f"logit_scale must be finite, got {logit_scale!r}")
    state = open_clip_state_dict(parts, scale)
    hub = {"model_cfg": config, "preprocess_cfg": preprocess_config(parts.image_transform)}

    def fill(folder: Path) -> None:
        atomic_write(folder / WEIGHTS_FILE, lambda fh: torch.save(state, fh))
        atomic_write_text(folder / MODEL_CONFIG_FILE, json.dumps(config, indent=2) + "\n")
        atomic_write_text(folder / HUB_CONFIG_FILE, json.dumps(hub, indent=2) + "\n")

    write_export_dir(out, fill, overwrite=overwrite)
    notes = []
    if parts.image_transform.crop_offsets == "floor" and parts.image_transform.do_center_crop:
        notes.append(
            "crop offsets: open_clip crops at round((H - h) / 2), this model (read from a "
            "transformers folder) at floor((H - h) / 2); images whose resized longer side "
            "exceeds the crop by 3, 7, 11, ... pixels are cropped one pixel apart"
        )
    return notes


__all__ = [
    "ACTIVATIONS",
    "HUB_CONFIG_FILE",
    "MODEL_CONFIG_FILE",
    "OPEN_CLIP_BOS",
    "OPEN_CLIP_EOS",
    "OPEN_CLIP_VOCAB",
    "WEIGHTS_FILE",
    "export_open_clip",
    "open_clip_model_config",
    "open_clip_state_dict",
    "preprocess_config",
]
