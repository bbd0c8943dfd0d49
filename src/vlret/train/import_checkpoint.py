"""Import the released checkpoints of SCAN, BFAN and SGRAF as vlret checkpoints.

``vlret import-checkpoint PATH --arch scan|bfan|sgraf --vocab VOCAB_JSON --out model.pt`` reads
a ``model_best.pth.tar`` of kuanghuei/SCAN, CrossmodalGroup/BFAN or Paranioar/SGRAF, whose
``train.py`` saves ``{"epoch", "model": [img_enc, txt_enc(, sim_enc)] (state dicts),
"best_rsum", "opt": argparse.Namespace, "Eiters"}``, and writes what
:func:`vlret.train.evaluate.load_trained_model` reads: the model state, a run config built from
``opt``, the caption encoder, the vocabulary size and an ``imported_from`` record (file and
SHA-256, reference epoch and best dev rsum, every ``opt`` value).

**Safety.** ``torch.load(weights_only=True)`` with only ``argparse.Namespace`` allow-listed: a
pickle holding anything else (a class of a training script, a ``posix.system`` reduce) is
refused, naming the global it tried to load, before anything in it runs. SCAN's and BFAN's
code is Python 2; a byte string there that is not UTF-8 (a path in ``opt``) is read again with
``encoding="latin1"``, which maps every byte to one character.

**Names** (reference -> vlret): ``img_enc`` ``fc.*`` -> ``image_encoder.fc.*``; ``txt_enc``
``embed.weight`` -> ``text_encoder.embed.weight`` and the GRU ``rnn.*`` (SGRAF: ``cap_rnn.*``)
-> ``text_encoder.rnn.*`` (same suffixes, ``_reverse`` and ``_l<k>`` included); ``sim_enc``
names -> the SGRAF scorer's own, from
:meth:`~vlret.models.sgraf.SGRAFScorer.reference_names`. A missing or unexpected key, a shape
other than the one ``opt`` implies and a non-finite weight are errors naming the key; only a
BatchNorm ``num_batches_tracked`` absent from a checkpoint of PyTorch < 0.4.1 is filled in (0).

**Architecture** from ``opt``: ``embed_size``, ``word_dim``, ``img_dim``, ``num_layers``,
``bi_gru``; SCAN ``cross_attn``, ``agg_func`` (``LogSumExp`` / ``Mean`` / ``Max`` / ``Sum`` ->
``lse`` / ``mean`` / ``max`` / ``sum``), ``lambda_lse``, ``lambda_softmax``; BFAN
``focal_type``, ``lambda_softmax`` (its GRU is always bidirectional); SGRAF ``module_name``
(``SGR`` / ``SAF``), ``sgr_step``, ``sim_dim`` (its code fixes lambda 9 and dropout 0.4).
Refused, naming the option: ``raw_feature_norm`` other than ``clipped_l2norm``,
``precomp_enc_type`` other than ``basic``, ``no_imgnorm`` / ``no_txtnorm`` set. The run config
also records the training settings: the precomp root ``data_path/data_name``, the triplet loss
with ``margin`` and ``max_violation`` as ``hardest``, Adam ``learning_rate`` x0.1 every
``lr_update`` epochs, ``grad_clip``, ``num_epochs``, ``batch_size``.

**Vocabulary.** The repositories' JSON (``word2idx``, ``idx2word``, ``idx``) must agree, be
dense ``0..idx-1`` with ``<pad> <start> <end> <unk>`` = 0..3
(:meth:`~vlret.data.vocab.Vocabulary.load`) and match the embedding rows and
``opt.vocab_size``. The reference encodes a caption as ``<start>``, the ids of NLTK
``word_tokenize`` of the lower-cased text (``<unk>`` if unknown), ``<end>``; the written
encoder state names that tokeniser (``"tokenizer": "nltk_word_tokenize"``), so the imported
:class:`~vlret.data.vocab.Vocabulary` tokenises with NLTK's Treebank rules (``pip install
vlret[nltk]``; :func:`~vlret.data.vocab.nltk_tokenize` states the one difference when punkt's
sentence data is not installed) and gives the reference ids.
"""

from __future__ import annotations

import argparse
import hashlib
import math
import pickle
import re
import warnings
import zipfile
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .._moved import moved_names
from ..data.vocab import Vocabulary
from .checkpoint import CHECKPOINT_VERSION, save_checkpoint
from .config import config_from_dict

ARCHS = ("scan", "bfan", "sgraf")
#: the repository whose ``train.py`` wrote each architecture's checkpoints
REFERENCE_CODE = dict(scan="kuanghuei/SCAN", bfan="CrossmodalGroup/BFAN", sgraf="Paranioar/SGRAF")
#: ``checkpoint["model"]``: the state dicts the reference ``state_dict()`` returns, in order
STATE_PARTS: dict[str, tuple[str, ...]] = dict(
    scan=("img_enc", "txt_enc"), bfan=("img_enc", "txt_enc")
)
STATE_PARTS["sgraf"] = ("img_enc", "txt_enc", "sim_enc")
#: the reference text encoder's GRU attribute
REFERENCE_RNN = {"scan": "rnn", "bfan": "rnn", "sgraf": "cap_rnn"}
AGGREGATIONS = {"LogSumExp": "lse", "Mean": "mean", "Max": "max", "Sum": "sum"}
SGRAF_MODULES = {"SGR": "sgr", "SAF": "saf"}
#: what SGRAF's code fixes rather than reads from ``opt``: attention lambda, dropout
SGRAF_LAMBDA_SOFTMAX, SGRAF_DROPOUT = 9.0, 0.4
#: the encoder-state name of the reference caption tokeniser (see the module docstring)
REFERENCE_TOKENIZER = "nltk_word_tokenize"


class CheckpointImportError(ValueError):
    """A reference checkpoint or vocabulary that cannot be imported; the message names the
    file and the key or option at fault."""


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
            # torch warns that ``encoding`` needs weights_only=False; the safe unpickler uses it
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


_MISSING = object()


_KINDS: dict[type, Any] = {  # every integer option read here is a positive size or count
    bool: lambda v: isinstance(v, bool) or (type(v) is int and v in (0, 1)),
    int: lambda v: type(v) is int and v >= 1,
    float: lambda v: type(v) in (int, float) and math.isfinite(v),
    str: lambda v: isinstance(v, str),
}


def _opt(opt: argparse.Namespace, name: str, kind: type, *, default: Any = _MISSING) -> Any:
    """``opt.<name>`` checked against ``kind`` (bool, positive int, finite float or str)."""
    value = getattr(opt, name, _MISSING)
    if value is _MISSING:
        if default is _MISSING:
            found = ", ".join(sorted(vars(opt))) or "nothing"
            raise CheckpointImportError(f"opt.{name}: missing (opt has {found})")
        return default
    if not _KINDS[kind](value):
        what = "a positive int" if kind is int else kind.__name__
        raise CheckpointImportError(f"opt.{name}: expected {what}, got {value!r}")
    return kind(value)


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
        "word_dim": _opt(opt, "word_dim", int),
        "num_layers": _opt(opt, "num_layers", int),
        "bidirectional": bi,
    }
    cfg: dict[str, Any] = {"kind": arch, "embed_dim": _opt(opt, "embed_size", int)}
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
            sim_dim=_opt(opt, "sim_dim", int),
            sgr_steps=_opt(opt, "sgr_step", int) if hasattr(opt, "sgr_step") else 3,
            lambda_softmax=SGRAF_LAMBDA_SOFTMAX,
            dropout=SGRAF_DROPOUT,
        )
    cfg["image"] = {"in_dim": _opt(opt, "img_dim", int)}
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


_PLAIN = (type(None), bool, int, float, str)


def _plain(value: Any) -> Any:
    return value if isinstance(value, _PLAIN) else repr(value)


def plain_opt(opt: argparse.Namespace) -> dict[str, Any]:
    """``opt`` as plain values (anything else as its ``repr``) for ``imported_from``."""
    return {str(k): _plain(v) for k, v in sorted(vars(opt).items())}


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

        (prefix,) = [f"{n}." for n, m in model.named_modules() if isinstance(m, SGRAFScorer)]
        names = SGRAFScorer.reference_names(module, sgr_steps)
        sim = {f"{prefix}{mine}": ref for ref, mine in names.items()}
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
            if ref.rsplit(".", 1)[-1] == "num_batches_tracked":  # PyTorch < 0.4.1 had no counter
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
    keys = sorted(state)
    shown = [k for k in keys if k.split(".", 1)[0] == ref.split(".", 1)[0]] or keys
    return f"; found {', '.join(shown[:4])}{' ...' if len(shown) > 4 else ''}" if keys else ""


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
    _check_vocab_size(states[1], opt, len(words), path, vocab_path)
    if arch == "sgraf":  # VisualSA's BatchNorm1d over the region slots (36 in the reference)
        slots = states[2].get("v_global_w.embedding_local.1.weight")
        model_cfg["num_regions"] = int(slots.shape[0]) if slots is not None and slots.dim() else 36

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
        **{k: _plain(state.get(k)) for k in ("epoch", "best_rsum", "Eiters")},
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


def _check_vocab_size(txt: dict, opt: argparse.Namespace, n: int, path: Path, vocab: Path) -> None:
    embed = txt.get("embed.weight")  # a missing or misshapen one is named by convert_state
    rows = int(embed.shape[0]) if embed is not None and embed.dim() == 2 else n
    size = getattr(opt, "vocab_size", rows)
    if rows != n or size != n:
        where = "txt_enc.embed.weight has" if rows != n else "opt.vocab_size says"
        raise CheckpointImportError(
            f"{vocab}: {n} words but {path} {where} {rows if rows != n else size}; pass the "
            "vocabulary the model was trained with"
        )


__all__ = [
    "AGGREGATIONS",
    "ARCHS",
    "REFERENCE_CODE",
    "STATE_PARTS",
    "CheckpointImportError",
    "check_reference_layout",
    "convert_state",
    "import_reference_checkpoint",
    "load_reference_checkpoint",
    "load_reference_vocab",
    "model_config_from_opt",
    "reference_key_map",
    "run_config_from_opt",
]

# The command moved into the command-line package (one module per command).
__getattr__ = moved_names(__name__, {"add_import_parser": "vlret.cli.import_checkpoint:add_parser"})
