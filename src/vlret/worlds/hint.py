"""How to train on a written synthetic world: the ``train_config_hint`` of ``synthetic.json``
and the ``--set`` overrides that point a shipped config at the world (``vlret synth`` prints
them after writing).

The shipped configs name real data folders and feature sizes (2048-d BUTD regions, the
64-d f30k-like world); a world's own folder, format and feature size come from its
``synthetic.json``, so the overrides are derived from it, never hard-coded.

The printed commands run as printed from the folder ``vlret synth`` ran in: the world's paths
are the ``--out`` folder as given, relative to the current folder like every path
(:mod:`vlret.data.paths`); each ``vlret train`` line is followed by the ``vlret eval`` of the run
it writes (the run folder is the shipped config's ``output_dir``, the data folder and split
come from the run and the protocol) and the zero-shot line names the CLIP a printed command
trains.
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

#: The side file that describes a written world (``vlret.worlds``).
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
#: (``vlret synth --webdataset``), and on a Karpathy-format world's images (its run folder
#: then :data:`KARPATHY_RUN`, beside the shards' run).
SHARDS_CONFIG = "synth_clip_pretrain"
KARPATHY_RUN = "runs/synth_clip_karpathy"
#: The protocol ``vlret eval`` scores a world's test split with, by the data set it imitates.
WORLD_PROTOCOLS = {"flickr30k": "f30k", "coco": "coco5k", "msrvtt": "msrvtt-full"}


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
            (:func:`~vlret.worlds.pixels.write_pixels`).

    Returns:
        ``{"data": {...}}``.
    """
    splits = shards["splits"]
    # data.root: the folder `vlret eval RUN` evaluates the run on (Karpathy JSON + images)
    data: dict[str, Any] = {"root": str(root), "format": "webdataset"}
    if "train" in splits:
        data["shards"] = str(root / splits["train"]["pattern"])
    if "dev" in splits:
        data["dev_shards"] = str(root / splits["dev"]["pattern"])
    if "train" in splits:
        data["train_num_samples"] = int(splits["train"]["samples"])
    return {"data": data}


def _reads_back(text: str) -> bool:
    """Whether ``--set key=TEXT`` gives the plain string ``TEXT``: the rule of
    :func:`vlret.run.config_files.parse_value` (a null word, a TOML literal or a ``true``/``false``
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
    """``value`` as ``--set`` reads it back (:func:`vlret.run.config_files.parse_value`)."""
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


def shipped_output_dir(config: str) -> str:
    """The ``output_dir`` of the shipped config ``config``: the run folder its printed ``vlret
    train`` line writes."""
    from ..configs import shipped_config

    path = shipped_config(config)
    if path is None:  # pragma: no cover - a name of this module's own tables
        raise ValueError(f"{config}: no shipped config of that name")
    return str(tomllib.loads(path.read_text(encoding="utf-8"))["output_dir"])


def world_protocol(meta: Mapping[str, Any]) -> str:
    """The protocol the world's test split is scored with: by the data set it imitates
    (:data:`WORLD_PROTOCOLS`), MSR-VTT's for any world written in the msrvtt format."""
    if meta["train_config_hint"]["data"].get("format") == "msrvtt":
        return WORLD_PROTOCOLS["msrvtt"]
    return WORLD_PROTOCOLS.get(str(meta.get("config", {}).get("dataset")), "f30k")


def _eval_line(run: str, protocol: str) -> str:
    return f"  then evaluate it: vlret eval {shlex.quote(run)} --protocol {protocol}"


def karpathy_clip_overrides(meta: Mapping[str, Any]) -> list[str]:
    """:func:`train_overrides` of a Karpathy-format world for :data:`SHARDS_CONFIG`: its data
    section pointed at the JSON and images instead of shards, its run folder
    :data:`KARPATHY_RUN`."""
    cleared = ["data.shards=null", "data.dev_shards=null", "data.train_num_samples=null"]
    return [*train_overrides(meta), *cleared, f"output_dir={KARPATHY_RUN}"]


def _trained_clip(meta: Mapping[str, Any]) -> str | None:
    """The run folder of the CLIP a printed line trains (the shards' run first), or None."""
    if meta.get("webdataset_config_hint"):
        return shipped_output_dir(SHARDS_CONFIG)
    if meta["train_config_hint"]["data"].get("format") == "karpathy":
        return KARPATHY_RUN
    return None


def pixel_hint_lines(root: str | Path, meta: Mapping[str, Any]) -> list[str]:
    """The lines of :func:`train_hint_lines` for a world's pictures: a ``vlret train`` command
    that pre-trains :data:`SHARDS_CONFIG` on its shards and its ``vlret eval`` (a world of
    another format than Karpathy holds no evaluation images: the line says how to write them),
    and the ``vlret zeroshot`` command that classifies its test image folder with the CLIP a
    printed line trains (empty when neither was written)."""
    lines = []
    if meta.get("webdataset_config_hint"):
        data = meta["webdataset_config_hint"]["data"]
        overrides = [f"data.{key}={_value(value)}" for key, value in data.items()]
        lines.append(f"train CLIP on the shards: {_command(SHARDS_CONFIG, overrides)}")
        if meta["train_config_hint"]["data"].get("format") == "karpathy":
            lines.append(_eval_line(shipped_output_dir(SHARDS_CONFIG), world_protocol(meta)))
        else:
            lines.append(
                "  (vlret eval scores this CLIP on Karpathy JSON + images: write the world with "
                "--format karpathy to get them beside the shards)"
            )
    folders = (meta.get("imagefolder") or {}).get("kinds") or {}
    if folders:
        base = Path(root) / meta["imagefolder"]["folder"]
        split = "test" if any("test" in splits for splits in folders.values()) else None
        split = split or next(iter(next(iter(folders.values()))), None)
        if split is not None:
            first, *others = list(folders)
            clip = _trained_clip(meta)
            model = shlex.quote(f"{clip}/best.pt") if clip is not None else "PATH"
            line = (
                f"vlret zeroshot --model {model} --dataset imagefolder --data-root "
                f"{shlex.quote(str(base / first / split))}"
            )
            lines.append(f"zero-shot classification: {line}")
            for kind in others:
                lines.append(f"  (by {kind}: --data-root {shlex.quote(str(base / kind / split))})")
            if clip is None:
                lines.append("  (PATH: a vlret checkpoint or a local Hugging Face CLIP folder)")
    return lines


def train_hint_lines(root: str | Path) -> list[str]:
    """What ``vlret synth`` prints after writing ``root``: a ``vlret train`` command line that
    runs a shipped config on the world (for a multi-expert world, one for CE and one for MMT),
    each followed by the ``vlret eval`` of its run, and for its pictures (``--webdataset``,
    ``--imagefolder``) :func:`pixel_hint_lines`. Empty when ``root`` holds no
    ``synthetic.json``."""
    path = Path(root) / META_FILE
    if not path.is_file():
        return []
    meta = json.loads(path.read_text(encoding="utf-8"))
    return [*_format_hint_lines(root, meta), *pixel_hint_lines(root, meta)]


def _format_hint_lines(root: str | Path, meta: Mapping[str, Any]) -> list[str]:
    """The ``vlret train`` lines for the world's own format (:func:`train_hint_lines`)."""
    fmt = meta["train_config_hint"]["data"].get("format", "precomp")
    protocol = world_protocol(meta)
    if meta["train_config_hint"].get("experts"):
        lines = [
            f"train on it: {_command(EXPERTS_CONFIG, train_overrides(meta))}",
            _eval_line(shipped_output_dir(EXPERTS_CONFIG), protocol),
            "  (add --set data.protocol=1k-A for the 1k-A split, evaluated with --protocol "
            "msrvtt-1ka)",
            f"or with MMT: {_command(MMT_CONFIG, mmt_overrides(meta, root))}",
            _eval_line(shipped_output_dir(MMT_CONFIG), protocol),
        ]
        bert = Path(root) / RANDOM_BERT_DIR
        if not (bert / "config.json").is_file():
            lines.append(
                f"  (MMT's text side, {bert}, is written by vlret synth with --random-bert)"
            )
        return lines
    if fmt == "karpathy":  # pixels: a small CLIP from scratch, as on the shards
        return [
            f"train a CLIP on it: {_command(SHARDS_CONFIG, karpathy_clip_overrides(meta))}",
            _eval_line(KARPATHY_RUN, protocol),
            f"  (or fine-tune a local pretrained CLIP: {EXAMPLE_CONFIGS['karpathy']} with the "
            "same data overrides plus --set model.path=DIR)",
        ]
    config = EXAMPLE_CONFIGS.get(fmt, EXAMPLE_CONFIGS["precomp"])
    return [
        f"train on it: {_command(config, train_overrides(meta))}",
        _eval_line(shipped_output_dir(config), protocol),
        "  (the other feature configs (vlret configs) and vlret compare take these too)",
    ]
