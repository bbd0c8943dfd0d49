"""The options of a reference checkpoint (``opt``, the ``argparse.Namespace`` of the SCAN /
BFAN / SGRAF ``train.py``), read for :mod:`vlret.run.import_checkpoint`.

Every option the model builder uses is checked before any module is built: its type, a sane
range (:data:`INT_RANGES`, :data:`FLOAT_RANGES`; e.g. ``opt.num_layers = 1000000000 is outside
1..64``) and, by :func:`check_opt_against_state`, the shapes of the checkpoint's own tensors
(``opt.embed_size = 200000`` with a ``fc.weight`` of 1024 rows is refused), and the state
holds at most :data:`MAX_WEIGHTS` values: the model built is then the size of the weights the
file holds. Values are shown in errors with :mod:`reprlib` (a few levels, a few items), never
expanded.
"""

from __future__ import annotations

import argparse
import math
import reprlib
from pathlib import Path
from typing import Any

import torch

ARCHS = ("scan", "bfan", "sgraf")
#: vlret name of each reference ``agg_func``
AGGREGATIONS = {"LogSumExp": "lse", "Mean": "mean", "Max": "max", "Sum": "sum"}
SGRAF_MODULES = {"SGR": "sgr", "SAF": "saf"}
#: what SGRAF's code fixes rather than reads from ``opt``: attention lambda, dropout
SGRAF_LAMBDA_SOFTMAX, SGRAF_DROPOUT = 9.0, 0.4
#: the integer options read, with the values accepted (the released models use 1024, 300,
#: 2048, 1 layer, 256, 3 steps, 30 / 15 epochs, 128)
INT_RANGES: dict[str, tuple[int, int]] = {
    "embed_size": (1, 8192),
    "word_dim": (1, 8192),
    "img_dim": (1, 16384),
    "num_layers": (1, 64),
    "sim_dim": (1, 8192),
    "sgr_step": (1, 64),
    "num_epochs": (1, 10000),
    "lr_update": (1, 10000),
    "batch_size": (1, 1 << 20),
}
#: the float options read, with the values accepted
FLOAT_RANGES: dict[str, tuple[float, float]] = {
    "lambda_softmax": (1e-6, 1e4),
    "lambda_lse": (1e-6, 1e4),
    "margin": (0.0, 1e4),
    "learning_rate": (0.0, 1e3),
    "grad_clip": (-1e12, 1e12),
}
#: the most weight values a reference state may hold (the released SCAN models hold about
#: 13 million, two-layer ones about 32 million); the model built holds as many
MAX_WEIGHTS = 100_000_000

_MISSING = object()
_SHOWN = reprlib.Repr()
_SHOWN.maxlevel, _SHOWN.maxstring, _SHOWN.maxother = 3, 60, 60


def shown(value: Any) -> str:
    """A short repr of ``value`` for an error message (bounded whatever ``value`` holds)."""
    return _SHOWN.repr(value)


class CheckpointImportError(ValueError):
    """A reference checkpoint or vocabulary that cannot be imported; the message names the
    file and the key or option at fault."""


class OptionError(CheckpointImportError):
    """An ``opt`` value that is missing, of another type, out of range or disagrees with the
    checkpoint's tensors; the message names the option and the value."""


def check_arch(arch: str) -> str:
    if arch not in ARCHS:
        raise ValueError(f"arch must be one of {', '.join(ARCHS)}, got {arch!r}")
    return arch


_KINDS: dict[type, Any] = {  # every integer option read here is a positive size or count
    bool: lambda v: isinstance(v, bool) or (type(v) is int and v in (0, 1)),
    int: lambda v: type(v) is int and v >= 1,
    float: lambda v: type(v) in (int, float) and math.isfinite(v),
    str: lambda v: isinstance(v, str),
}


def opt_value(opt: argparse.Namespace, name: str, kind: type, *, default: Any = _MISSING) -> Any:
    """``opt.<name>`` checked against ``kind`` (bool, positive int, finite float or str) and,
    for the options of :data:`INT_RANGES` / :data:`FLOAT_RANGES`, their range."""
    value: Any = getattr(opt, name, _MISSING)
    if value is _MISSING:
        if default is _MISSING:
            found = ", ".join(sorted(vars(opt))) or "nothing"
            raise OptionError(f"opt.{name}: missing (opt has {shown(found)})")
        return default
    if not _KINDS[kind](value):
        what = "a positive int" if kind is int else kind.__name__
        raise OptionError(f"opt.{name}: expected {what}, got {shown(value)}")
    ranges: dict[str, tuple[float, float]] = {**INT_RANGES} if kind is int else FLOAT_RANGES
    bounds = ranges.get(name) if kind in (int, float) else None
    if bounds is not None and not bounds[0] <= float(value) <= bounds[1]:
        raise OptionError(f"opt.{name} = {value!r} is outside {bounds[0]}..{bounds[1]}")
    return kind(value)


def opt_choice(opt: argparse.Namespace, name: str, choices: Any, *, default: Any = _MISSING) -> str:
    value = opt_value(opt, name, str, default=default)
    if value not in choices:
        raise OptionError(
            f"opt.{name} = {shown(value)}: vlret implements {', '.join(map(repr, choices))}"
        )
    return value


def _refuse_unsupported(opt: argparse.Namespace, arch: str) -> None:
    """Settings of the reference code that vlret does not implement, each named."""
    if arch == "scan":
        opt_choice(opt, "raw_feature_norm", ("clipped_l2norm",), default="clipped_l2norm")
    if arch in ("scan", "bfan"):
        opt_choice(opt, "precomp_enc_type", ("basic",), default="basic")
    for flag in ("no_imgnorm", "no_txtnorm"):
        if opt_value(opt, flag, bool, default=False):
            raise OptionError(
                f"opt.{flag} = True: vlret's encoders always L2-normalise their outputs"
            )


def model_config_from_opt(
    opt: argparse.Namespace, *, arch: str, bidirectional: bool | None = None
) -> dict[str, Any]:
    """The vlret ``[model]`` section of a reference ``opt`` (see
    :mod:`vlret.run.import_checkpoint`); every value is checked (type and range).

    ``bidirectional`` is used where ``opt`` has no ``bi_gru`` (the state's ``_reverse``
    weights tell); BFAN's GRU is bidirectional whatever ``opt`` says."""
    arch = check_arch(arch)
    _refuse_unsupported(opt, arch)
    if arch == "bfan":
        bi = True
    else:
        default = _MISSING if bidirectional is None else bidirectional
        bi = opt_value(opt, "bi_gru", bool, default=default)
    text = {
        "word_dim": opt_value(opt, "word_dim", int),
        "num_layers": opt_value(opt, "num_layers", int),
        "bidirectional": bi,
    }
    cfg: dict[str, Any] = {"kind": arch, "embed_dim": opt_value(opt, "embed_size", int)}
    if arch == "scan":
        agg = opt_choice(opt, "agg_func", tuple(AGGREGATIONS))
        cfg.update(
            direction=opt_choice(opt, "cross_attn", ("t2i", "i2t")),
            lambda_softmax=opt_value(opt, "lambda_softmax", float),
            aggregation=AGGREGATIONS[agg],
            lambda_lse=opt_value(opt, "lambda_lse", float),
        )
    elif arch == "bfan":
        cfg.update(
            focal=opt_choice(opt, "focal_type", ("equal", "prob")),
            lambda_softmax=opt_value(opt, "lambda_softmax", float),
        )
    else:
        module = opt_choice(opt, "module_name", tuple(SGRAF_MODULES))
        cfg.update(
            module=SGRAF_MODULES[module],
            sim_dim=opt_value(opt, "sim_dim", int),
            sgr_steps=opt_value(opt, "sgr_step", int, default=3),
            lambda_softmax=SGRAF_LAMBDA_SOFTMAX,
            dropout=SGRAF_DROPOUT,
        )
    cfg["image"] = {"in_dim": opt_value(opt, "img_dim", int)}
    cfg["text"] = text
    return cfg


def near_keys(ref: str, state: dict[str, torch.Tensor]) -> str:
    keys = sorted(state)
    shown = [k for k in keys if k.split(".", 1)[0] == ref.split(".", 1)[0]] or keys
    return f"; found {', '.join(shown[:4])}{' ...' if len(shown) > 4 else ''}" if keys else ""


def _expect(
    states: list[dict[str, torch.Tensor]],
    parts: tuple[str, ...],
    part: int,
    key: str,
    shape: tuple[int, ...],
    options: str,
) -> None:
    where = f"{parts[part]}.{key}"
    value = states[part].get(key)
    if value is None:
        raise OptionError(
            f"missing {where}, which {options} imply has shape {shape}"
            f"{near_keys(key, states[part])}"
        )
    if tuple(value.shape) != shape:
        raise OptionError(
            f"{options} imply {where} of shape {shape}, but it has shape {tuple(value.shape)}"
        )


def check_opt_against_state(
    model: dict[str, Any],
    states: list[dict[str, torch.Tensor]],
    *,
    arch: str,
    parts: tuple[str, ...],
    rnn: str,
) -> None:
    """Before any module is built: the sizes of ``model`` (from ``opt``) against the shapes of
    the reference ``states``, every size the builder uses tied to a tensor of the file, and the
    state's size against :data:`MAX_WEIGHTS`. Raises :class:`OptionError` naming the option,
    its value and the tensor."""
    total = sum(t.numel() for state in states for t in state.values())
    if total > MAX_WEIGHTS:
        raise OptionError(
            f"the state dicts hold {total} weight values; a reference model holds at most "
            f"{MAX_WEIGHTS}"
        )
    e, img = model["embed_dim"], model["image"]["in_dim"]
    text = model["text"]
    word, layers, bi = text["word_dim"], text["num_layers"], text["bidirectional"]
    _expect(states, parts, 0, "fc.weight", (e, img), f"opt.embed_size = {e}, opt.img_dim = {img}")
    embed = states[1].get("embed.weight")
    rows = int(embed.shape[0]) if embed is not None and embed.dim() == 2 else 0
    _expect(states, parts, 1, "embed.weight", (rows, word), f"opt.word_dim = {word}")
    for layer in range(layers):
        in_dim = word if layer == 0 else e * (2 if bi else 1)
        for sfx in ("", "_reverse") if bi else ("",):
            said = f"opt.num_layers = {layers}, opt.embed_size = {e}"
            key = f"{rnn}.weight_ih_l{layer}{sfx}"
            _expect(states, parts, 1, key, (3 * e, in_dim), f"{said}, opt.word_dim = {word}")
            _expect(states, parts, 1, f"{rnn}.weight_hh_l{layer}{sfx}", (3 * e, e), said)
    if arch != "sgraf":
        return
    sim, steps = model["sim_dim"], model["sgr_steps"]
    said = f"opt.sim_dim = {sim}, opt.embed_size = {e}"
    _expect(states, parts, 2, "sim_tranloc_w.weight", (sim, e), said)
    if model["module"] == "sgr":
        for step in range(steps):
            key = f"SGR_module.{step}.graph_query_w.weight"
            said = f"opt.sgr_step = {steps}, opt.sim_dim = {sim}"
            _expect(states, parts, 2, key, (sim, sim), said)
    else:
        key, said = "SAF_module.attn_sim_w.weight", f"opt.sim_dim = {sim}"
        _expect(states, parts, 2, key, (1, sim), said)


def run_config_from_opt(
    opt: argparse.Namespace,
    model: dict[str, Any],
    *,
    vocab: str | Path,
    output_dir: str,
) -> dict[str, Any]:
    """A vlret run config (file layout) with ``model`` and the reference training settings
    (each checked: type and range)."""
    data_path = getattr(opt, "data_path", None)
    data_name = getattr(opt, "data_name", None)
    name = data_name if isinstance(data_name, str) and data_name else "precomp"
    root = str(Path(data_path) / name) if isinstance(data_path, str) and data_path else name
    epochs = opt_value(opt, "num_epochs", int, default=30)
    lr_update = opt_value(opt, "lr_update", int, default=0)
    grad_clip = opt_value(opt, "grad_clip", float, default=2.0)
    return {
        "output_dir": output_dir,
        "data": {"root": root, "format": "precomp", "vocab": str(vocab)},
        "model": model,
        "loss": {
            "name": "triplet",
            "margin": opt_value(opt, "margin", float, default=0.2),
            "hardest": opt_value(opt, "max_violation", bool, default=False),
        },
        "optim": {
            "name": "adam",
            "lr": opt_value(opt, "learning_rate", float, default=2e-4),
            # the reference multiplies lr by 0.1 ** (epoch // lr_update)
            "decay_epochs": list(range(lr_update, epochs, lr_update)) if lr_update > 0 else [],
            "decay_factor": 0.1,
            "grad_clip": grad_clip if grad_clip > 0 else None,
        },
        "train": {
            "epochs": max(1, epochs),
            "batch_size": max(2, opt_value(opt, "batch_size", int, default=128)),
        },
    }


_PLAIN = (type(None), bool, int, float, str)


def plain(value: Any) -> Any:
    """``value`` if a plain value, else its (bounded) repr."""
    return value if isinstance(value, _PLAIN) else shown(value)


def plain_opt(opt: argparse.Namespace) -> dict[str, Any]:
    """``opt`` as plain values (anything else as a short ``repr``) for ``imported_from``."""
    return {str(k): plain(v) for k, v in sorted(vars(opt).items())}


__all__ = [
    "AGGREGATIONS",
    "ARCHS",
    "CheckpointImportError",
    "check_arch",
    "FLOAT_RANGES",
    "INT_RANGES",
    "MAX_WEIGHTS",
    "OptionError",
    "check_opt_against_state",
    "model_config_from_opt",
    "opt_choice",
    "opt_value",
    "plain_opt",
    "run_config_from_opt",
    "shown",
]
