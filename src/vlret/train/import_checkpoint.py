"""Import the released checkpoints of SCAN, BFAN and SGRAF as vlret checkpoints.

``vlret import-checkpoint PATH --arch scan|bfan|sgraf --vocab VOCAB_JSON --out model.pt``
reads a ``model_best.pth.tar`` written by the reference code (kuanghuei/SCAN,
CrossmodalGroup/BFAN, Paranioar/SGRAF), whose ``train.py`` saves::

    {"epoch": int, "model": [img_enc.state_dict(), txt_enc.state_dict()(, sim_enc.state_dict())],
     "best_rsum": float, "opt": argparse.Namespace, "Eiters": int}

and writes a checkpoint that ``vlret eval`` and :func:`vlret.train.evaluate.load_trained_model`
read: the model's state, a run config built from ``opt``, the caption encoder and the
vocabulary size, plus an ``imported_from`` record (file, SHA-256, reference epoch, best dev
rsum, every plain ``opt`` value).

**Safety.** The file is read with ``torch.load(weights_only=True)`` and only
``argparse.Namespace`` allow-listed; a pickle that holds any other object (a class of the
training script, a ``posix.system`` reduce) is refused with the global it tried to load,
before anything in it runs. SCAN's and BFAN's code is Python 2: a byte string there that is
not UTF-8 (a path in ``opt``) is read again with ``encoding="latin1"``, the decoding that maps
every byte to one character.

**Parameter names** (reference -> vlret):

========================================  ==============================================
``model[0]`` ``fc.weight`` / ``fc.bias``  ``image_encoder.fc.weight`` / ``.bias``
``model[1]`` ``embed.weight``             ``text_encoder.embed.weight``
``model[1]`` ``rnn.{w,b}_{ih,hh}_l<k>``   ``text_encoder.rnn.*`` (same suffix, ``_reverse``
(SGRAF: ``cap_rnn.*``)                    included; one GRU, directions averaged)
``model[2]`` ``<sim_enc name>``           the SGRAF scorer's own name, from
                                          :meth:`vlret.models.sgraf.SGRAFScorer.reference_names`
========================================  ==============================================

A missing or unexpected key, a shape that differs from the one ``opt`` implies and a
non-finite weight are errors naming the key. A BatchNorm ``num_batches_tracked`` counter
absent from a checkpoint of PyTorch before 0.4.1 is the one key filled in (with 0; evaluation
never reads it).

**Architecture** comes from ``opt`` (``embed_size``, ``word_dim``, ``img_dim``,
``num_layers``, ``bi_gru``; SCAN ``cross_attn``, ``agg_func`` (``LogSumExp`` / ``Mean`` /
``Max`` / ``Sum`` -> ``lse`` / ``mean`` / ``max`` / ``sum``), ``lambda_lse``,
``lambda_softmax``; BFAN ``focal_type``, ``lambda_softmax`` (its text GRU is always
bidirectional); SGRAF ``module_name`` (``SGR`` / ``SAF``), ``sgr_step``, ``sim_dim``, with
the attention's lambda 9 and the dropout 0.4 that its code fixes). Settings vlret does not
implement are refused naming the option: ``raw_feature_norm`` other than ``clipped_l2norm``,
``precomp_enc_type`` other than ``basic``, ``no_imgnorm`` or ``no_txtnorm`` set. The run
config records the training settings too (``data_path``/``data_name`` as the precomp root,
triplet loss with ``margin`` and ``max_violation`` as ``hardest``, Adam with
``learning_rate``, x0.1 every ``lr_update`` epochs, ``grad_clip``, ``num_epochs``,
``batch_size``), so ``vlret train`` can continue from the same settings.

**Vocabulary.** The JSON of those repositories (``{"word2idx", "idx2word", "idx"}``, indices
dense ``0..n-1``, ``<pad> <start> <end> <unk>`` = 0..3) is checked for agreement (see
:meth:`vlret.data.vocab.Vocabulary.load`) and against the embedding rows and ``opt.vocab_size``.
The reference encodes a caption as ``<start>``, the ids of NLTK ``word_tokenize`` of the
lower-cased caption (``<unk>`` for unknown words), ``<end>``: vlret's
:class:`~vlret.data.vocab.Vocabulary` adds the same ids, and its offline regex tokeniser gives
NLTK's tokens on the pre-tokenised precomp captions except where NLTK's Treebank rules differ
(``n't`` kept whole, ``cannot`` split, abbreviations such as ``mrs.`` keeping their period,
numbers such as ``3.5`` kept whole, ``"`` turned into `````` / ``''``); the stored encoder state
names the reference tokeniser under ``"tokenizer"`` for that reason.
"""

from __future__ import annotations

import argparse
import hashlib
import math
import pickle
import re
import sys
import warnings
import zipfile
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..data.vocab import Vocabulary
from .checkpoint import CHECKPOINT_VERSION, save_checkpoint
from .config import config_from_dict

ARCHS = ("scan", "bfan", "sgraf")
#: the public repository whose ``train.py`` wrote each architecture's checkpoints
REFERENCE_CODE = {
    "scan": "kuanghuei/SCAN",
    "bfan": "CrossmodalGroup/BFAN",
    "sgraf": "Paranioar/SGRAF",
}
#: ``checkpoint["model"]``: the state dicts each reference ``state_dict()`` returns, in order
STATE_PARTS = {
    "scan": ("img_enc", "txt_enc"),
    "bfan": ("img_enc", "txt_enc"),
    "sgraf": ("img_enc", "txt_enc", "sim_enc"),
}
#: the reference text encoder's GRU attribute
REFERENCE_RNN = {"scan": "rnn", "bfan": "rnn", "sgraf": "cap_rnn"}
#: SCAN ``opt.agg_func`` -> vlret ``aggregation``
AGGREGATIONS = {"LogSumExp": "lse", "Mean": "mean", "Max": "max", "Sum": "sum"}
#: SGRAF ``opt.module_name`` -> vlret ``module``
SGRAF_MODULES = {"SGR": "sgr", "SAF": "saf"}
#: what SGRAF's code fixes rather than reads from ``opt``
SGRAF_LAMBDA_SOFTMAX = 9.0
SGRAF_DROPOUT = 0.4
#: the encoder-state name of the reference caption tokeniser (see the module docstring)
REFERENCE_TOKENIZER = "nltk_word_tokenize"
_BN_COUNTER = "num_batches_tracked"


class CheckpointImportError(ValueError):
    """A reference checkpoint or vocabulary that cannot be imported; the message names the
    file and the key or option at fault."""


# --------------------------------------------------------------------------------------------
# Reading the reference file
# --------------------------------------------------------------------------------------------


def _refusal(path: Path, err: BaseException) -> str:
    text = str(err)
    found = re.search(r"GLOBAL ([\w.]+)", text)
    if found:
        return (
            f"{path}: refused: the pickle loads {found.group(1)}; a reference checkpoint holds "
            "only tensors, plain values and argparse.Namespace (nothing in it was run)"
        )
    detail = re.search(r"(Can only [^\n]*|Unsupported operand \d+)", text)
    shown = detail.group(1) if detail else type(err).__name__
    return f"{path}: refused by the safe unpickler (weights_only=True): {shown}"


def load_reference_checkpoint(path: str | Path) -> dict[str, Any]:
    """The dict a reference ``train.py`` saved, read with ``torch.load(weights_only=True)`` and
    ``argparse.Namespace`` as the only allow-listed class (a Python-2 byte string that is not
    UTF-8 is decoded as latin1). Anything else in the pickle raises
    :class:`CheckpointImportError` naming the file and what it tried to load."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: missing; expected a reference model_best.pth.tar")
    if not path.is_file():
        raise CheckpointImportError(f"{path}: is a folder; expected a checkpoint file")
    with open(path, "rb") as fh:
        head = fh.read(2)
    if not zipfile.is_zipfile(path) and head[:1] != b"\x80":  # zip, or a legacy pickle
        raise CheckpointImportError(
            f"{path}: not a PyTorch checkpoint ({path.stat().st_size} bytes, neither a zip "
            "archive nor a pickle)"
        )

    def load(**kwargs: Any) -> Any:
        with torch.serialization.safe_globals([argparse.Namespace]), warnings.catch_warnings():
            # torch warns that pickle arguments need weights_only=False; the safe unpickler
            # does honour ``encoding``.
            warnings.filterwarnings("ignore", message="pickle_load_args only works")
            return torch.load(path, map_location="cpu", weights_only=True, **kwargs)

    try:
        try:
            state = load()
        except UnicodeDecodeError:  # a Python-2 str holding non-UTF-8 bytes
            state = load(encoding="latin1")
    except pickle.UnpicklingError as err:
        raise CheckpointImportError(_refusal(path, err)) from None
    except Exception as err:  # not a torch file, truncated, ...
        first = (str(err).strip().splitlines() or [""])[0]
        raise CheckpointImportError(
            f"{path}: not a readable PyTorch checkpoint ({type(err).__name__}: {first})"
        ) from None
    if not isinstance(state, dict):
        raise CheckpointImportError(
            f"{path}: top level is {type(state).__name__}; expected the dict of a reference "
            "train.py ({'model': [...], 'opt': Namespace, ...})"
        )
    return state


def check_reference_layout(
    state: dict[str, Any], *, arch: str, path: str | Path = "<checkpoint>"
) -> tuple[list[dict[str, torch.Tensor]], argparse.Namespace]:
    """``(state dicts, opt)`` of a reference checkpoint of ``arch``; the number of state dicts
    and their types are checked (the keys in :func:`convert_state`)."""
    arch = check_arch(arch)
    parts = STATE_PARTS[arch]
    for key in ("model", "opt"):
        if key not in state:
            raise CheckpointImportError(
                f"{path}: no {key!r} key (found {sorted(map(str, state))}); expected a "
                f"{REFERENCE_CODE[arch]} checkpoint {{'model': [{', '.join(parts)}], 'opt': ...}}"
            )
    model, opt = state["model"], state["opt"]
    if not isinstance(opt, argparse.Namespace):
        raise CheckpointImportError(
            f"{path}: 'opt' is {type(opt).__name__}; expected the argparse.Namespace of train.py"
        )
    if not isinstance(model, (list, tuple)):
        raise CheckpointImportError(
            f"{path}: 'model' is {type(model).__name__}; expected a list of state dicts "
            f"[{', '.join(parts)}]"
        )
    if len(model) != len(parts):
        others = [a for a in ARCHS if len(STATE_PARTS[a]) == len(model)]
        hint = f" (a {' or '.join(others)} checkpoint?)" if others else ""
        raise CheckpointImportError(
            f"{path}: 'model' holds {len(model)} state dicts; --arch {arch} expects "
            f"{len(parts)} [{', '.join(parts)}]{hint}"
        )
    for name, part in zip(parts, model, strict=True):
        if not isinstance(part, dict):
            raise CheckpointImportError(
                f"{path}: model[{parts.index(name)}] ({name}) is {type(part).__name__}; "
                "expected a state dict"
            )
        for key, value in part.items():
            if not isinstance(value, torch.Tensor):
                raise CheckpointImportError(
                    f"{path}: {name}.{key} is {type(value).__name__}; expected a tensor"
                )
    return [dict(p) for p in model], opt


def check_arch(arch: str) -> str:
    if arch not in ARCHS:
        raise ValueError(f"arch must be one of {', '.join(ARCHS)}, got {arch!r}")
    return arch


# --------------------------------------------------------------------------------------------
# opt -> vlret configs
# --------------------------------------------------------------------------------------------

_MISSING = object()


def _opt(opt: argparse.Namespace, name: str, kind: type, *, default: Any = _MISSING) -> Any:
    """``opt.<name>`` checked against ``kind`` (int, float, bool or str)."""
    value = getattr(opt, name, _MISSING)
    if value is _MISSING:
        if default is _MISSING:
            found = ", ".join(sorted(vars(opt))) or "nothing"
            raise CheckpointImportError(f"opt.{name}: missing (opt has {found})")
        return default
    if kind is bool:
        if isinstance(value, bool) or (isinstance(value, int) and value in (0, 1)):
            return bool(value)
    elif kind is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif kind is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if math.isfinite(value):
                return float(value)
    elif isinstance(value, kind):
        return value
    raise CheckpointImportError(f"opt.{name}: expected {kind.__name__}, got {value!r}")


def _positive(opt: argparse.Namespace, name: str) -> int:
    value = _opt(opt, name, int)
    if value < 1:
        raise CheckpointImportError(f"opt.{name}: expected a positive integer, got {value!r}")
    return value


def _choice(opt: argparse.Namespace, name: str, choices: Any, *, default: Any = _MISSING) -> str:
    value = _opt(opt, name, str, default=default)
    if value not in choices:
        raise CheckpointImportError(
            f"opt.{name} = {value!r}: vlret implements {', '.join(map(repr, choices))}"
        )
    return value


def _refuse_unsupported(opt: argparse.Namespace, arch: str) -> None:
    """Settings of the reference code that vlret does not implement, each named."""
    if arch == "scan":
        _choice(opt, "raw_feature_norm", ("clipped_l2norm",), default="clipped_l2norm")
    if arch in ("scan", "bfan"):
        _choice(opt, "precomp_enc_type", ("basic",), default="basic")
    for flag in ("no_imgnorm", "no_txtnorm"):
        if _opt(opt, flag, bool, default=False):
            raise CheckpointImportError(
                f"opt.{flag} = True: vlret's encoders always L2-normalise their outputs"
            )


def model_config_from_opt(
    opt: argparse.Namespace, *, arch: str, bidirectional: bool | None = None
) -> dict[str, Any]:
    """The vlret ``[model]`` section of a reference ``opt`` (see the module docstring).

    ``bidirectional`` is used where ``opt`` has no ``bi_gru`` (the state's ``_reverse``
    weights tell); BFAN's GRU is bidirectional whatever ``opt`` says."""
    arch = check_arch(arch)
    _refuse_unsupported(opt, arch)
    if arch == "bfan":
        bi = True
    else:
        bi = _opt(opt, "bi_gru", bool, default=_MISSING if bidirectional is None else bidirectional)
    text = {
        "word_dim": _positive(opt, "word_dim"),
        "num_layers": _positive(opt, "num_layers"),
        "bidirectional": bi,
    }
    cfg: dict[str, Any] = {"kind": arch, "embed_dim": _positive(opt, "embed_size")}
    if arch == "scan":
        agg = _choice(opt, "agg_func", tuple(AGGREGATIONS))
        cfg.update(
            direction=_choice(opt, "cross_attn", ("t2i", "i2t")),
            lambda_softmax=_opt(opt, "lambda_softmax", float),
            aggregation=AGGREGATIONS[agg],
            lambda_lse=_opt(opt, "lambda_lse", float),
        )
    elif arch == "bfan":
        cfg.update(
            focal=_choice(opt, "focal_type", ("equal", "prob")),
            lambda_softmax=_opt(opt, "lambda_softmax", float),
        )
    else:
        module = _choice(opt, "module_name", tuple(SGRAF_MODULES))
        cfg.update(
            module=SGRAF_MODULES[module],
            sim_dim=_positive(opt, "sim_dim"),
            sgr_steps=_positive(opt, "sgr_step") if hasattr(opt, "sgr_step") else 3,
            lambda_softmax=SGRAF_LAMBDA_SOFTMAX,
            dropout=SGRAF_DROPOUT,
        )
    cfg["image"] = {"in_dim": _positive(opt, "img_dim")}
    cfg["text"] = text
    return cfg


def run_config_from_opt(
    opt: argparse.Namespace,
    model: dict[str, Any],
    *,
    vocab: str | Path,
    output_dir: str,
) -> dict[str, Any]:
    """A vlret run config (file layout) with ``model`` and the reference training settings."""
    data_path = getattr(opt, "data_path", None)
    data_name = getattr(opt, "data_name", None)
    name = data_name if isinstance(data_name, str) and data_name else "precomp"
    root = str(Path(data_path) / name) if isinstance(data_path, str) and data_path else name
    epochs = _opt(opt, "num_epochs", int, default=30)
    lr_update = _opt(opt, "lr_update", int, default=0)
    grad_clip = _opt(opt, "grad_clip", float, default=2.0)
    return {
        "output_dir": output_dir,
        "data": {"root": root, "format": "precomp", "vocab": str(vocab)},
        "model": model,
        "loss": {
            "name": "triplet",
            "margin": _opt(opt, "margin", float, default=0.2),
            "hardest": _opt(opt, "max_violation", bool, default=False),
        },
        "optim": {
            "name": "adam",
            "lr": _opt(opt, "learning_rate", float, default=2e-4),
            # the reference multiplies lr by 0.1 ** (epoch // lr_update)
            "decay_epochs": list(range(lr_update, epochs, lr_update)) if lr_update > 0 else [],
            "decay_factor": 0.1,
            "grad_clip": grad_clip if grad_clip > 0 else None,
        },
        "train": {
            "epochs": max(1, epochs),
            "batch_size": max(2, _opt(opt, "batch_size", int, default=128)),
        },
    }


def plain_opt(opt: argparse.Namespace) -> dict[str, Any]:
    """``opt`` as plain values (anything else as its ``repr``), for the ``imported_from``
    record."""

    def plain(value: Any) -> Any:
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        if isinstance(value, (list, tuple)) and all(
            v is None or isinstance(v, (bool, int, float, str)) for v in value
        ):
            return list(value)
        return repr(value)

    return {str(k): plain(v) for k, v in sorted(vars(opt).items())}


# --------------------------------------------------------------------------------------------
# State dicts
# --------------------------------------------------------------------------------------------


def _scorer_prefix(model: nn.Module) -> str:
    from ..models.sgraf import SGRAFScorer

    found = [name for name, m in model.named_modules() if isinstance(m, SGRAFScorer)]
    if len(found) != 1:
        raise RuntimeError(f"the SGRAF model holds {len(found)} SGRAFScorer modules, not 1")
    return f"{found[0]}." if found[0] else ""


def reference_key_map(
    model: nn.Module, *, arch: str, module: str = "sgr", sgr_steps: int = 3
) -> dict[str, tuple[int, str]]:
    """vlret state key -> ``(index into checkpoint["model"], reference key)`` for every entry
    of ``model.state_dict()``; ``module`` and ``sgr_steps`` select SGRAF's scorer names."""
    arch = check_arch(arch)
    rnn = REFERENCE_RNN[arch]
    keys = list(model.state_dict())
    sim: dict[str, str] = {}
    if arch == "sgraf":
        from ..models.sgraf import SGRAFScorer

        prefix = _scorer_prefix(model)
        for ref, mine in SGRAFScorer.reference_names(module, sgr_steps).items():
            ref = ref[len("sim_enc.") :] if ref.startswith("sim_enc.") else ref
            sim[mine if mine in keys and not prefix else f"{prefix}{mine}"] = ref
    out: dict[str, tuple[int, str]] = {}
    for key in keys:
        if key in sim:
            out[key] = (2, sim[key])
        elif key.startswith("image_encoder."):
            out[key] = (0, key[len("image_encoder.") :])
        elif key.startswith("text_encoder.rnn."):
            out[key] = (1, f"{rnn}.{key[len('text_encoder.rnn.') :]}")
        elif key.startswith("text_encoder."):
            out[key] = (1, key[len("text_encoder.") :])
        else:
            raise RuntimeError(f"vlret model key {key} has no reference counterpart")
    return out


def convert_state(
    states: list[dict[str, torch.Tensor]],
    model: nn.Module,
    *,
    arch: str,
    module: str = "sgr",
    sgr_steps: int = 3,
    path: str | Path = "<checkpoint>",
) -> dict[str, torch.Tensor]:
    """``model``'s state dict filled from the reference ``states`` (``module`` and
    ``sgr_steps``: SGRAF's); a missing, unexpected, misshapen or non-finite entry raises
    :class:`CheckpointImportError` naming the key."""
    parts = STATE_PARTS[check_arch(arch)]
    own = model.state_dict()
    mapping = reference_key_map(model, arch=arch, module=module, sgr_steps=sgr_steps)
    used: set[tuple[int, str]] = set()
    out: dict[str, torch.Tensor] = {}
    for key, (part, ref) in mapping.items():
        where = f"{parts[part]}.{ref}"
        if ref not in states[part]:
            if ref.rsplit(".", 1)[-1] == _BN_COUNTER:  # PyTorch < 0.4.1 had no counter
                out[key] = own[key].clone()
                continue
            near = _near_keys(ref, states[part])
            raise CheckpointImportError(
                f"{path}: missing {where} (for vlret {key}); --arch {arch} with this opt "
                f"expects it{near}"
            )
        value = states[part][ref]
        used.add((part, ref))
        if tuple(value.shape) != tuple(own[key].shape):
            raise CheckpointImportError(
                f"{path}: {where} has shape {tuple(value.shape)}; --arch {arch} with this opt "
                f"expects {tuple(own[key].shape)} (vlret {key})"
            )
        if value.is_floating_point() and not bool(torch.isfinite(value).all()):
            raise CheckpointImportError(f"{path}: {where} holds NaN or infinite values")
        out[key] = value.to(own[key].dtype)
    for part, state in enumerate(states):
        extra = [k for k in state if (part, k) not in used]
        if extra:
            raise CheckpointImportError(
                f"{path}: unexpected {parts[part]}.{extra[0]}"
                f"{f' (and {len(extra) - 1} more)' if len(extra) > 1 else ''}: --arch {arch} "
                "with this opt has no such parameter"
            )
    return out


def _near_keys(ref: str, state: dict[str, torch.Tensor]) -> str:
    stem = ref.split(".", 1)[0]
    keys = sorted(state)
    same = [k for k in keys if k.split(".", 1)[0] == stem]
    shown = same or keys
    if not shown:
        return "; that state dict is empty"
    return f"; found {', '.join(shown[:4])}{' ...' if len(shown) > 4 else ''}"


# --------------------------------------------------------------------------------------------
# Vocabulary
# --------------------------------------------------------------------------------------------


def load_reference_vocab(path: str | Path) -> Vocabulary:
    """The JSON vocabulary of the reference repositories, checked: ``word2idx`` and
    ``idx2word`` agree, ``idx`` is their size, indices are dense ``0..idx-1`` and the first
    four are ``<pad> <start> <end> <unk>`` (what the reference code encodes with)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: missing; expected the reference vocabulary JSON")
    try:
        return Vocabulary.load(path)
    except ValueError as err:  # DataFormatError names the file already
        raise CheckpointImportError(str(err)) from None


def encoder_state(vocab: Vocabulary) -> dict[str, Any]:
    """The ``encoder`` entry of the checkpoint (see the module docstring on tokenisation)."""
    return {"kind": "vocab", "idx2word": list(vocab.idx2word), "tokenizer": REFERENCE_TOKENIZER}


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# --------------------------------------------------------------------------------------------
# The import
# --------------------------------------------------------------------------------------------


def import_reference_checkpoint(
    path: str | Path,
    *,
    arch: str,
    vocab: str | Path,
    out: str | Path,
    overwrite: bool = False,
) -> Path:
    """Read the reference checkpoint ``path`` of ``arch`` with its vocabulary JSON ``vocab``
    and write the vlret checkpoint ``out`` atomically; returns ``out``.

    An existing ``out`` is refused unless ``overwrite``. Errors: ``FileNotFoundError`` for a
    missing input, :class:`CheckpointImportError` (a ``ValueError``) naming the file and the
    key or option for everything else (see the module docstring)."""
    arch = check_arch(arch)
    path, vocab_path, out = Path(path), Path(vocab), Path(out)
    if out.is_dir():
        raise CheckpointImportError(f"{out}: --out is a folder; expected a file such as model.pt")
    if out.exists() and not overwrite:
        raise FileExistsError(f"{out}: exists; pass --overwrite to replace it")
    state = load_reference_checkpoint(path)
    states, opt = check_reference_layout(state, arch=arch, path=path)
    words = load_reference_vocab(vocab_path)

    rnn = REFERENCE_RNN[arch]
    has_reverse = any(k.startswith(f"{rnn}.") and k.endswith("_reverse") for k in states[1])
    try:
        model_cfg = model_config_from_opt(opt, arch=arch, bidirectional=has_reverse)
    except CheckpointImportError as err:
        raise CheckpointImportError(f"{path}: {err} (--arch {arch})") from None
    _check_vocab_size(states[1], opt, words, path=path, vocab_path=vocab_path)

    output_dir = str(out.parent / out.stem)
    raw_config = run_config_from_opt(
        opt, model_cfg, vocab=vocab_path.resolve(), output_dir=output_dir
    )
    config = config_from_dict(raw_config, source=f"{path} (opt)")
    from ..models import build_model

    try:
        model = build_model(config.model, vocab_size=len(words))
    except (ValueError, TypeError) as err:
        raise CheckpointImportError(f"{path}: vlret cannot build the model of opt: {err}") from None
    weights = convert_state(
        states,
        model,
        arch=arch,
        module=config.model.get("module", "sgr"),
        sgr_steps=config.model.get("sgr_steps", 3),
        path=path,
    )
    model.load_state_dict(weights, strict=True)

    record = {
        "path": str(path.resolve()),
        "sha256": _sha256(path),
        "arch": arch,
        "code": REFERENCE_CODE[arch],
        "epoch": _plain_number(state.get("epoch")),
        "best_rsum": _plain_number(state.get("best_rsum")),
        "Eiters": _plain_number(state.get("Eiters")),
        "opt": plain_opt(opt),
        "vocab": str(vocab_path.resolve()),
        "vocab_sha256": _sha256(vocab_path),
        "tokenizer": REFERENCE_TOKENIZER,
    }
    checkpoint = {
        "version": CHECKPOINT_VERSION,
        "model": model.state_dict(),
        "config": config.to_dict(),
        "encoder": encoder_state(words),
        "vocab_size": len(words),
        "imported_from": record,
    }
    return save_checkpoint(checkpoint, out)


def _plain_number(value: Any) -> int | float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return value


def _check_vocab_size(
    txt: dict[str, torch.Tensor],
    opt: argparse.Namespace,
    vocab: Vocabulary,
    *,
    path: Path,
    vocab_path: Path,
) -> None:
    embed = txt.get("embed.weight")
    if embed is None or embed.dim() != 2:
        got = "missing" if embed is None else f"shape {tuple(embed.shape)}"
        raise CheckpointImportError(
            f"{path}: txt_enc.embed.weight {got}; expected the (vocab_size, word_dim) word "
            "embedding"
        )
    rows = int(embed.shape[0])
    if rows != len(vocab):
        raise CheckpointImportError(
            f"{vocab_path}: {len(vocab)} words but {path} txt_enc.embed.weight has {rows} rows; "
            "pass the vocabulary the model was trained with"
        )
    size = getattr(opt, "vocab_size", None)
    if size is not None and size != rows:
        raise CheckpointImportError(
            f"{path}: opt.vocab_size = {size!r} but txt_enc.embed.weight has {rows} rows"
        )


# --------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------


def add_import_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``import-checkpoint`` on the ``vlret`` sub-command parsers."""
    p = subparsers.add_parser(
        "import-checkpoint",
        help="convert a released SCAN / BFAN / SGRAF checkpoint into a vlret checkpoint",
        description=(
            "Read a model_best.pth.tar of kuanghuei/SCAN, CrossmodalGroup/BFAN or "
            "Paranioar/SGRAF safely (weights_only, only argparse.Namespace allowed) and write "
            "a checkpoint that vlret eval reads."
        ),
    )
    p.add_argument("checkpoint", type=Path, metavar="PATH", help="the reference checkpoint")
    p.add_argument("--arch", required=True, choices=ARCHS, help="the system that wrote it")
    p.add_argument(
        "--vocab",
        required=True,
        type=Path,
        metavar="VOCAB_JSON",
        help="its vocabulary JSON (e.g. vocab/f30k_precomp_vocab.json of the reference code)",
    )
    p.add_argument("--out", required=True, type=Path, help="the vlret checkpoint to write")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    p.set_defaults(func=_cmd_import)
    return p


def _cmd_import(args: argparse.Namespace) -> int:
    try:
        out = import_reference_checkpoint(
            args.checkpoint,
            arch=args.arch,
            vocab=args.vocab,
            out=args.out,
            overwrite=args.overwrite,
        )
    except (FileNotFoundError, FileExistsError, ValueError) as err:
        print(f"vlret import-checkpoint: {err}", file=sys.stderr)
        return 2
    print(out)
    return 0


__all__ = [
    "AGGREGATIONS",
    "ARCHS",
    "REFERENCE_CODE",
    "STATE_PARTS",
    "CheckpointImportError",
    "add_import_parser",
    "check_reference_layout",
    "convert_state",
    "import_reference_checkpoint",
    "load_reference_checkpoint",
    "load_reference_vocab",
    "model_config_from_opt",
    "reference_key_map",
    "run_config_from_opt",
]
