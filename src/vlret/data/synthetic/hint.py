"""How to train on a written synthetic world: the ``train_config_hint`` of ``synthetic.json``
and the ``--set`` overrides that point a shipped config at the world (``vlret synth`` prints
them after writing).

The shipped configs name real data folders and feature sizes (2048-d BUTD regions, the
64-d f30k-like world); a world's own folder, format and feature size come from its
``synthetic.json``, so the overrides are derived from it, never hard-coded.
"""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

#: The side file that describes a written world (``vlret.data.synthetic``).
META_FILE = "synthetic.json"
#: The shipped config (by name: ``vlret train NAME`` finds it wherever vlret is installed)
#: that trains on a world of each format once the overrides are applied: the demo's model for
#: features, CLIP for the rendered images.
EXAMPLE_CONFIGS = {
    "precomp": "synth_f30k_compare",
    "msrvtt": "synth_f30k_compare",
    "karpathy": "clip_unified_f30k",
}
#: The shipped configs for a multi-expert world (``video-experts``): a CE model (``[model] kind
#: = "ce"``), and an MMT one, whose text side is the world's random BERT.
EXPERTS_CONFIG = "synth_video_experts_ce"
MMT_CONFIG = "synth_video_experts_mmt"
#: The folder inside a world where ``vlret synth --random-bert`` writes MMT's text encoder.
RANDOM_BERT_DIR = "random-bert"
#: The shipped config that pre-trains a small CLIP from scratch on a world's shards
#: (``vlret synth --webdataset``).
SHARDS_CONFIG = "synth_clip_pretrain"


def config_hint(
    *,
    root: Path,
    format: str,
    files: Mapping[str, Any],
    captions_per_image: int,
    feature_dim: int,
    has_dev: bool,
    experts: Mapping[str, int] | None = None,
) -> dict[str, Any]:
    """``train_config_hint`` of ``synthetic.json``: the ``data`` section for ``vlret train``
    and ``image_in_dim``, the feature size the image encoder reads.

    Args:
        root: The world's folder.
        format: Its on-disk format.
        files: The format's file names (``format_files`` of ``synthetic.json``).
        captions_per_image: Captions per image or video.
        feature_dim: The region or frame feature size.
        has_dev: Whether the world has a dev split.
        experts: A multi-expert world's ``name -> dim`` (in order): the hint then has
            ``data.experts = "all"`` and ``experts``, the ``[model] experts`` table of a CE or
            MMT model, with ``image_in_dim`` None.

    Returns:
        ``{"data": {...}, "image_in_dim": int | None}`` (plus ``"experts"``).
    """
    data: dict[str, Any] = {"root": str(root), "format": format}
    if format == "precomp":
        data["captions_per_image"] = captions_per_image
        if not has_dev:
            data["dev_split"] = None
    elif format == "msrvtt":
        data["captions_per_video"] = captions_per_image
        if experts is not None:
            data["experts"] = "all"
    else:
        data["karpathy_json"] = str(root / files["json"])
        data["captions_per_image"] = captions_per_image
        if "image_root" in files:
            data["image_root"] = str(root / files["image_root"])
    if experts is not None:
        return {"data": data, "image_in_dim": None, "experts": dict(experts)}
    return {"data": data, "image_in_dim": feature_dim}


def shard_hint(root: Path, shards: Mapping[str, Any]) -> dict[str, Any]:
    """``webdataset_config_hint`` of ``synthetic.json``: the ``data`` section that trains on
    the world's shards (``data.format = "webdataset"``, ``shards`` and ``dev_shards`` as brace
    patterns under ``root``, ``train_num_samples``, the train shards' sample count, which no
    file of the img2dataset layout gives).

    Args:
        root: The world's folder.
        shards: The ``webdataset`` entry of ``synthetic.json``
            (:func:`~vlret.data.synthetic.pixels.write_pixels`).

    Returns:
        ``{"data": {...}}``.
    """
    splits = shards["splits"]
    data: dict[str, Any] = {"format": "webdataset"}
    if "train" in splits:
        data["shards"] = str(root / splits["train"]["pattern"])
    if "dev" in splits:
        data["dev_shards"] = str(root / splits["dev"]["pattern"])
    if "train" in splits:
        data["train_num_samples"] = int(splits["train"]["samples"])
    return {"data": data}


def _reads_back(text: str) -> bool:
    """Whether ``--set key=TEXT`` gives the plain string ``TEXT``: the rule of
    :func:`vlret.train.config.parse_value` (a null word, a TOML literal or a ``true``/``false``
    in any case is typed; anything else is kept as stripped), restated here because
    ``vlret.data`` must not import ``vlret.train``."""
    if text != text.strip() or text.lower() in ("null", "none", "~", "true", "false"):
        return False
    try:
        tomllib.loads(f"v = {text}")
    except tomllib.TOMLDecodeError:
        return True
    return False


def _value(value: Any) -> str:
    """``value`` as ``--set`` reads it back (:func:`vlret.train.config.parse_value`)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str) and not _reads_back(value):
        return json.dumps(value)  # a folder named like a number or a list: a TOML string
    return str(value)


def train_overrides(meta: Mapping[str, Any]) -> list[str]:
    """The ``section.key=value`` overrides a shipped config of the world's format needs to train
    on the world described by ``meta`` (its ``synthetic.json``): every key of the ``data`` hint
    and, for feature formats, ``model.image.in_dim``; for a multi-expert world
    ``model.experts={name = dim, ...}`` (the whole table, so a config's other experts go)."""
    hint = meta["train_config_hint"]
    out = [f"data.{key}={_value(value)}" for key, value in hint["data"].items()]
    if hint.get("experts"):
        table = ", ".join(f"{name} = {int(dim)}" for name, dim in hint["experts"].items())
        out.append(f"model.experts={{{table}}}")
    elif hint["data"].get("format") != "karpathy":  # rendered images go through the model's own
        out.append(f"model.image.in_dim={int(hint['image_in_dim'])}")
    return out


def mmt_overrides(meta: Mapping[str, Any], root: str | Path) -> list[str]:
    """:func:`train_overrides` plus ``model.text.path``, the world's random BERT
    (``root/random-bert``): what :data:`MMT_CONFIG` needs on a multi-expert world (its own
    ``text.path`` names the world's default folder, ``runs/data-video-experts``)."""
    text = str(Path(root) / RANDOM_BERT_DIR)
    return [*train_overrides(meta), f"model.text.path={_value(text)}"]


def _command(config: str, overrides: list[str]) -> str:
    sets = " ".join(f"--set {shlex.quote(item)}" for item in overrides)
    return f"vlret train {config} {sets}"


def pixel_hint_lines(root: str | Path, meta: Mapping[str, Any]) -> list[str]:
    """The lines of :func:`train_hint_lines` for a world's pictures: a ``vlret train`` command
    that pre-trains :data:`SHARDS_CONFIG` on its shards, and the ``vlret zeroshot`` command
    that classifies its test image folder (empty when neither was written)."""
    lines = []
    if meta.get("webdataset_config_hint"):
        data = meta["webdataset_config_hint"]["data"]
        overrides = [f"data.{key}={_value(value)}" for key, value in data.items()]
        lines.append(f"train CLIP on the shards: {_command(SHARDS_CONFIG, overrides)}")
    folders = (meta.get("imagefolder") or {}).get("kinds") or {}
    if folders:
        base = Path(root) / meta["imagefolder"]["folder"]
        split = "test" if any("test" in splits for splits in folders.values()) else None
        split = split or next(iter(next(iter(folders.values()))), None)
        if split is not None:
            first, *others = list(folders)
            line = (
                f"vlret zeroshot --model PATH --dataset imagefolder --data-root "
                f"{shlex.quote(str(base / first / split))}"
            )
            lines.append(f"zero-shot classification: {line}")
            for kind in others:
                lines.append(f"  (by {kind}: --data-root {shlex.quote(str(base / kind / split))})")
            lines.append("  (PATH: a vlret checkpoint or a local Hugging Face CLIP folder)")
    return lines


def train_hint_lines(root: str | Path) -> list[str]:
    """What ``vlret synth`` prints after writing ``root``: a ``vlret train`` command line that
    runs a shipped config on the world (for a multi-expert world, one for CE and one for MMT),
    and for its pictures (``--webdataset``, ``--imagefolder``) :func:`pixel_hint_lines`.
    Empty when ``root`` holds no ``synthetic.json``."""
    path = Path(root) / META_FILE
    if not path.is_file():
        return []
    meta = json.loads(path.read_text(encoding="utf-8"))
    return [*_format_hint_lines(root, meta), *pixel_hint_lines(root, meta)]


def _format_hint_lines(root: str | Path, meta: Mapping[str, Any]) -> list[str]:
    """The ``vlret train`` lines for the world's own format (:func:`train_hint_lines`)."""
    fmt = meta["train_config_hint"]["data"].get("format", "precomp")
    if meta["train_config_hint"].get("experts"):
        lines = [
            f"train on it: {_command(EXPERTS_CONFIG, train_overrides(meta))}",
            "  (add --set data.protocol=1k-A for the 1k-A split)",
            f"or with MMT: {_command(MMT_CONFIG, mmt_overrides(meta, root))}",
        ]
        bert = Path(root) / RANDOM_BERT_DIR
        if not (bert / "config.json").is_file():
            lines.append(
                f"  (MMT's text side, {bert}, is written by vlret synth with --random-bert)"
            )
        return lines
    config = EXAMPLE_CONFIGS.get(fmt, EXAMPLE_CONFIGS["precomp"])
    lines = [f"train on it: {_command(config, train_overrides(meta))}"]
    if fmt == "karpathy":
        lines.append("  (plus --set model.path=DIR, a local CLIP folder: the images are pixels)")
    else:
        lines.append(
            "  (the other feature configs (vlret configs) and vlret compare take these too)"
        )
    return lines
