"""Import DIME's released checkpoints (LgQu/DIME, SIGIR 2021) as vlret checkpoints.

``import_dime_checkpoint(PATH, vocab=BERT_FOLDER, out=model.pt)`` reads a ``*.pth.tar`` of
the release (e.g. ``Flickr30K_DIME_it.pth.tar`` / ``..._ti.pth.tar``), whose ``train.py``
``save_checkpoint`` writes ``{"epoch", "model": [img_enc, txt_enc, itr_module] (state dicts),
"best_rsum", "best_r1", "opt": argparse.Namespace, "Eiters"}`` with ``torch.save`` under
Python 2.7 / PyTorch 1.0 (the legacy, non-zip serialisation), and writes what
:func:`vlret.run.builders.load_trained_model` (``vlret eval``) reads, as
:func:`~vlret.run.import_checkpoint.import_reference_checkpoint` does.

**Safety and bounds** are those of :mod:`vlret.run.import_checkpoint`
(:func:`~vlret.run.import_checkpoint.load_reference_checkpoint`: ``weights_only`` loading
with only ``argparse.Namespace`` allowed, the latin1 retry for Python-2 byte strings, the
container bounds, truncated or foreign files named), except the weight bound: DIME's
``txt_enc`` carries the whole frozen BERT-base (about 110 million values), so a DIME state may
hold up to :data:`DIME_MAX_WEIGHTS` values.

**vocab** is the local BERT folder the checkpoint was trained with (``save_pretrained`` of
bert-base-uncased: ``config.json`` and the tokenizer files; the release reads
``bert_config.json`` and ``vocab.txt`` from its ``--bert_path``), not a ``vocab.txt`` alone: the
imported model is rebuilt from the folder's BERT configuration and captions are tokenised
with its tokenizer, while every BERT weight comes from the checkpoint (the folder's own
weights are overwritten). Its configuration must match the checkpoint's BERT tensors (vocabulary,
width, layers, positions), each mismatch named.

**Names** (release -> vlret): ``img_enc.*`` -> ``image_encoder.*``; ``txt_enc.bert.*`` ->
``text_encoder.bert.*`` (the release's BERT follows Hugging Face's name tree; TF-style
``LayerNorm.gamma`` / ``beta`` are read as ``weight`` / ``bias``), ``txt_enc.{fc, convs1,
mapping}.*`` -> ``text_encoder.*``; ``itr_module.*`` -> ``interaction.*`` (``path_mapping``,
the path regulariser's, with ``model.path_hidden`` its width, so training can go on with the
``"dime"`` procedure). Not imported (no use): BERT's pooler and GLGC's ``fc_2`` (never called
by the release). Any other missing or unexpected key, a shape other
than the model's and a non-finite weight are errors naming the key; a BatchNorm
``num_batches_tracked`` absent from an old checkpoint is filled in (0).

**Options** read from ``opt``: ``direction``, ``embed_size``, ``img_dim``, ``max_words``,
``lambda_softmax_CMRC``, ``hid_router``, ``hid_IMRC``, ``num_head_IMRC``; refused, naming the
option: ``raw_feature_norm_CMRC`` other than ``clipped_l2norm`` and ``no_imgnorm`` set. The
run config records the release's training settings (triplet margin and ``max_violation``,
Adam ``learning_rate`` x0.1 every ``lr_update`` epochs, ``grad_clip``, ``num_epochs``,
``batch_size``) and ``data.max_caption_tokens = max_words - 2``.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

import torch

from .._files import check_output_file
from .checkpoint import CHECKPOINT_VERSION, save_checkpoint
from .config import config_from_dict
from .import_checkpoint import _sha256, load_reference_checkpoint
from .import_options import (
    CheckpointImportError,
    OptionError,
    opt_choice,
    opt_value,
    plain,
    plain_opt,
    run_config_from_opt,
    shown,
)

#: the repository whose ``train.py`` wrote the checkpoints
DIME_CODE = "LgQu/DIME"
#: ``checkpoint["model"]``: the state dicts of ``DIME.state_dict()``, in order
DIME_PARTS = ("img_enc", "txt_enc", "itr_module")
#: the vlret module each part maps onto
DIME_PREFIXES = {
    "img_enc": "image_encoder.",
    "txt_enc": "text_encoder.",
    "itr_module": "interaction.",
}
#: the most weight values a DIME state may hold: BERT-base (about 110 million) plus DIME's own
#: layers (about 4 million at D = 256), with room for a wider BERT's vocabulary
DIME_MAX_WEIGHTS = 150_000_000
#: release keys with no use in scoring (see the module docstring)
_DROPPED = re.compile(r"^(txt_enc\.bert\.pooler\.|itr_module\.[^.]+\.glgc\.fc_2\.)")
#: ranges of the options read (the release: 256, 2048, 32, 4 or 9, 512, 512, 16)
_INTS = {
    "embed_size": (1, 8192),
    "img_dim": (1, 16384),
    "max_words": (2, 512),
    "hid_router": (1, 65536),
    "hid_IMRC": (1, 65536),
    "num_head_IMRC": (1, 1024),
}


def _int(opt: argparse.Namespace, name: str, default: int) -> int:
    value = opt_value(opt, name, int, default=default)
    low, high = _INTS[name]
    if not low <= value <= high:
        raise OptionError(f"opt.{name} = {value!r} is outside {low}..{high}")
    return value


def model_config_from_dime_opt(opt: argparse.Namespace, *, bert: str | Path) -> dict[str, Any]:
    """The ``dime`` model config of a release ``opt`` (defaults: the release's argparse ones).

    Raises:
        OptionError: An option of the wrong type, out of range or not implemented (named).
    """
    opt_choice(opt, "raw_feature_norm_CMRC", ("clipped_l2norm",), default="clipped_l2norm")
    if opt_value(opt, "no_imgnorm", bool, default=False):
        raise OptionError("opt.no_imgnorm = True: vlret's DIME always normalises the image vector")
    dim, heads = _int(opt, "embed_size", 256), _int(opt, "num_head_IMRC", 16)
    if dim % heads:
        raise OptionError(f"opt.num_head_IMRC = {heads} does not divide opt.embed_size = {dim}")
    lam = opt_value(opt, "lambda_softmax_CMRC", float, default=4.0)
    if not 1e-6 <= lam <= 1e4:
        raise OptionError(f"opt.lambda_softmax_CMRC = {lam!r} is outside 1e-06..10000.0")
    return {
        "kind": "dime",
        "embed_dim": dim,
        "direction": opt_choice(opt, "direction", ("i2t", "t2i"), default="i2t"),
        "lambda_softmax": lam,
        "max_words": _int(opt, "max_words", 32),
        "router_hidden": _int(opt, "hid_router", 512),
        "imrc_hidden": _int(opt, "hid_IMRC", 512),
        "imrc_heads": heads,
        "image": {"in_dim": _int(opt, "img_dim", 2048)},
        "text": {"kind": "bert", "path": str(bert)},
    }


def _layout(state: dict[str, Any], path: Path) -> tuple[list[dict[str, torch.Tensor]], Any]:
    model, opt = state.get("model"), state.get("opt")
    if not isinstance(model, (list, tuple)) or len(model) != len(DIME_PARTS):
        got = (
            f"a list of {len(model)}" if isinstance(model, (list, tuple)) else type(model).__name__
        )
        raise CheckpointImportError(
            f"{path}: model is {got}; expected DIME's list of {len(DIME_PARTS)} state dicts "
            f"({', '.join(DIME_PARTS)})"
        )
    for part, sd in zip(DIME_PARTS, model, strict=True):
        if not isinstance(sd, dict) or not all(
            isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in sd.items()
        ):
            raise CheckpointImportError(f"{path}: model {part} is not a state dict of tensors")
    if not isinstance(opt, argparse.Namespace):
        raise CheckpointImportError(
            f"{path}: opt is {type(opt).__name__}; expected the release's argparse.Namespace"
        )
    total = sum(t.numel() for sd in model for t in sd.values())
    if total > DIME_MAX_WEIGHTS:
        raise CheckpointImportError(
            f"{path}: refused: the state holds {total} values, over the {DIME_MAX_WEIGHTS} a "
            "DIME checkpoint may hold"
        )
    return list(model), opt


def _bert_config(folder: Path) -> dict[str, Any]:
    if folder.is_file():
        raise CheckpointImportError(
            f"{folder}: is a file; vocab must be the local BERT folder the checkpoint was trained "
            "with (config.json and the tokenizer files, save_pretrained of bert-base-uncased)"
        )
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder}: missing; expected the local BERT folder (vocab)")
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise CheckpointImportError(
            f"{folder / 'config.json'}: unreadable BERT configuration ({type(err).__name__})"
        ) from None
    if not isinstance(config, dict):
        raise CheckpointImportError(f"{folder / 'config.json'}: not a JSON object")
    return config


def _check_bert(txt: dict[str, torch.Tensor], config: dict[str, Any], path: Path, folder: Path):
    """The folder's BERT configuration against the checkpoint's BERT tensors."""
    layers = {int(m.group(1)) for k in txt if (m := re.match(r"bert\.encoder\.layer\.(\d+)\.", k))}
    said = {
        "bert.embeddings.word_embeddings.weight": ("vocab_size", "hidden_size"),
        "bert.embeddings.position_embeddings.weight": ("max_position_embeddings", "hidden_size"),
        "bert.embeddings.token_type_embeddings.weight": ("type_vocab_size", "hidden_size"),
        "bert.encoder.layer.0.intermediate.dense.weight": ("intermediate_size", "hidden_size"),
    }
    for key, names in said.items():
        tensor = txt.get(key)
        if tensor is None:
            raise CheckpointImportError(f"{path}: missing txt_enc.{key}")
        want = tuple(config.get(n) for n in names)
        if tuple(tensor.shape) != want:
            raise CheckpointImportError(
                f"{folder}: config.json says {dict(zip(names, want, strict=True))} but {path} "
                f"has txt_enc.{key} of shape {tuple(tensor.shape)}; pass the BERT folder the "
                "checkpoint was trained with"
            )
    said_layers = config.get("num_hidden_layers")
    if len(layers) != said_layers:
        raise CheckpointImportError(
            f"{folder}: config.json says num_hidden_layers = {shown(said_layers)} but {path} "
            f"holds {len(layers)} BERT layers"
        )


def convert_dime_state(
    states: list[dict[str, torch.Tensor]], own: dict[str, torch.Tensor], *, path: Path
) -> dict[str, torch.Tensor]:
    """The release's three state dicts as the vlret model's state (``own``: its state dict)."""
    out: dict[str, torch.Tensor] = {}
    extra = []
    for part, sd in zip(DIME_PARTS, states, strict=True):
        for key, value in sd.items():
            if _DROPPED.match(f"{part}.{key}"):
                continue
            name = DIME_PREFIXES[part] + re.sub(r"LayerNorm\.gamma$", "LayerNorm.weight", key)
            name = re.sub(r"LayerNorm\.beta$", "LayerNorm.bias", name)
            if name not in own:
                extra.append(f"{part}.{key}")
                continue
            if tuple(value.shape) != tuple(own[name].shape):
                raise CheckpointImportError(
                    f"{path}: {part}.{key} has shape {tuple(value.shape)}; the model of this opt "
                    f"expects {tuple(own[name].shape)}"
                )
            if value.is_floating_point() and not bool(torch.isfinite(value).all()):
                raise CheckpointImportError(f"{path}: {part}.{key} holds non-finite values")
            out[name] = value.to(own[name].dtype)
    if extra:
        raise CheckpointImportError(
            f"{path}: unexpected {extra[0]}"
            f"{f' (and {len(extra) - 1} more)' if len(extra) > 1 else ''}: DIME with this opt has "
            "no such parameter"
        )
    for name, value in own.items():
        if name in out:
            continue
        if name.endswith("num_batches_tracked"):
            out[name] = torch.zeros_like(value)
            continue
        if name.endswith("embeddings.position_ids"):  # a constant buffer of the BERT
            out[name] = value
            continue
        part = next(p for p, pre in DIME_PREFIXES.items() if name.startswith(pre))
        raise CheckpointImportError(
            f"{path}: missing {part}.{name[len(DIME_PREFIXES[part]) :]} (the model's {name})"
        )
    return out


def import_dime_checkpoint(
    path: str | Path, *, vocab: str | Path, out: str | Path, overwrite: bool = False
) -> Path:
    """Read DIME's release checkpoint ``path`` with the BERT folder ``vocab`` it was trained
    with and write the vlret checkpoint ``out`` atomically; returns ``out``.

    Args:
        path: The release's ``*.pth.tar``.
        vocab: The local BERT folder (``config.json`` + tokenizer; see the module docstring).
        out: The vlret checkpoint to write.
        overwrite: Replace an existing ``out``.

    Returns:
        ``out``.

    Raises:
        FileNotFoundError: A missing input.
        FileExistsError: ``out`` exists and ``overwrite`` is false.
        CheckpointImportError: Anything else, naming the file and the key or option.
    """
    path, folder, out = Path(path), Path(vocab), Path(out)
    check_output_file(out, "--out", "model.pt")
    if out.exists() and not overwrite:
        raise FileExistsError(f"{out}: exists; pass --overwrite to replace it")
    state = load_reference_checkpoint(path)
    states, opt = _layout(state, path)
    bert_config = _bert_config(folder)
    try:
        model_cfg = model_config_from_dime_opt(opt, bert=folder.resolve())
        raw = run_config_from_opt(
            opt, model_cfg, vocab=folder.resolve(), output_dir=str(out.parent / out.stem)
        )
    except OptionError as err:
        raise CheckpointImportError(f"{path}: {err} (--arch dime)") from None
    raw["data"].pop("vocab")  # the tokenizer is the BERT folder's (model.text.path)
    mapping = states[2].get("path_mapping.weight")
    if mapping is not None and mapping.dim() == 2:
        raw["model"]["path_hidden"] = int(mapping.shape[0])
    raw["data"]["max_caption_tokens"] = model_cfg["max_words"] - 2
    _check_bert(states[1], bert_config, path, folder)
    config = config_from_dict(raw, source=f"{path} (opt)")
    from ..models import build_model

    try:
        model = build_model(config.model)
    except (ValueError, TypeError, OSError) as err:
        raise CheckpointImportError(f"{path}: vlret cannot build the model of opt: {err}") from None
    model.load_state_dict(convert_dime_state(states, model.state_dict(), path=path), strict=True)
    record = {
        "path": str(path.resolve()),
        "sha256": _sha256(path),
        "arch": "dime",
        "code": DIME_CODE,
        **{k: plain(state.get(k)) for k in ("epoch", "best_rsum", "best_r1", "Eiters")},
        "opt": plain_opt(opt),
        "vocab": str(folder.resolve()),
        "tokenizer": "bert",
    }
    checkpoint = {
        "version": CHECKPOINT_VERSION,
        "model": model.state_dict(),
        "config": config.to_dict(),
        "encoder": {"kind": "hf", "path": str(folder.resolve())},
        "vocab_size": None,
        "imported_from": record,
    }
    return save_checkpoint(checkpoint, out)


__all__ = [
    "DIME_CODE",
    "DIME_MAX_WEIGHTS",
    "DIME_PARTS",
    "convert_dime_state",
    "import_dime_checkpoint",
    "model_config_from_dime_opt",
]
