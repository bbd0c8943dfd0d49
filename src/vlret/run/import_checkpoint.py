"""Import the released checkpoints of SCAN, BFAN and SGRAF as vlret checkpoints.

``vlret import-checkpoint PATH --arch scan|bfan|sgraf --vocab VOCAB_JSON --out model.pt`` reads
a ``model_best.pth.tar`` of kuanghuei/SCAN, CrossmodalGroup/BFAN or Paranioar/SGRAF, whose
``train.py`` saves ``{"epoch", "model": [img_enc, txt_enc(, sim_enc)] (state dicts),
"best_rsum", "opt": argparse.Namespace, "Eiters"}``, and writes what
:func:`vlret.run.builders.load_trained_model` reads: the model state, a run config built from
``opt``, the caption encoder, the vocabulary size and an ``imported_from`` record (file and
SHA-256, reference epoch and best dev rsum, every ``opt`` value).

**Safety.** ``torch.load(weights_only=True)`` with only ``argparse.Namespace`` allow-listed: a
pickle holding anything else (a class of a training script, a ``posix.system`` reduce) is
refused, naming the global it tried to load, before anything in it runs. SCAN's and BFAN's
code is Python 2; a byte string there that is not UTF-8 (a path in ``opt``) is read again with
``encoding="latin1"``, which maps every byte to one character.

**Bounds.** Nothing in the file is expanded or built before it is bounded: its containers
(``opt`` values included) nest at most :data:`MAX_NESTING` levels and hold at most
:data:`MAX_ELEMENTS` elements counted through shared references (a list of a list ... shared at
each level is tiny saved and exponential walked); every option the builder uses is in a sane
range and agrees with the shapes of the state's own tensors, and the state holds at most
:data:`~vlret.run.import_options.MAX_WEIGHTS` values, before any module is built
(:mod:`vlret.run.import_options`). Each refusal is one line naming the file, the option and
its value, e.g. ``ckpt.pth.tar: opt.num_layers = 1000000000 is outside 1..64 (--arch scan)``.
A truncated or foreign file is named as such with its size.

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
import pickle
import re
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .._files import check_output_file
from ..data.formats.experts.pickles import container_bounds_problem
from ..data.vocab import Vocabulary
from .checkpoint import (
    CHECKPOINT_VERSION,
    checkpoint_file_problem,
    load_error_reason,
    save_checkpoint,
    torch_load_quietly,
)
from .config import config_from_dict
from .import_options import (
    AGGREGATIONS,
    ARCHS,
    CheckpointImportError,
    OptionError,
    check_arch,
    check_opt_against_state,
    model_config_from_opt,
    near_keys,
    plain,
    plain_opt,
    run_config_from_opt,
    shown,
)

#: the repository whose ``train.py`` wrote each architecture's checkpoints
REFERENCE_CODE = dict(scan="kuanghuei/SCAN", bfan="CrossmodalGroup/BFAN", sgraf="Paranioar/SGRAF")
#: ``checkpoint["model"]``: the state dicts the reference ``state_dict()`` returns, in order
STATE_PARTS: dict[str, tuple[str, ...]] = dict(
    scan=("img_enc", "txt_enc"), bfan=("img_enc", "txt_enc")
)
STATE_PARTS["sgraf"] = ("img_enc", "txt_enc", "sim_enc")
#: the reference text encoder's GRU attribute
REFERENCE_RNN = {"scan": "rnn", "bfan": "rnn", "sgraf": "cap_rnn"}
#: the encoder-state name of the reference caption tokeniser (see the module docstring)
REFERENCE_TOKENIZER = "nltk_word_tokenize"


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
    problem = checkpoint_file_problem(path)
    if problem:
        raise CheckpointImportError(f"{path}: {problem}")

    def load(**kwargs: Any) -> Any:
        with torch.serialization.safe_globals([argparse.Namespace]):
            # ``encoding``: torch warns it needs weights_only=False; the safe unpickler uses it
            return torch_load_quietly(path, map_location="cpu", **kwargs)

    try:
        try:
            state = load()
        except UnicodeDecodeError:  # a Python-2 str holding non-UTF-8 bytes
            state = load(encoding="latin1")
    except pickle.UnpicklingError as err:
        raise CheckpointImportError(_refusal(path, err)) from None
    except Exception as err:  # a damaged archive, a pickle cut short, ...
        raise CheckpointImportError(
            f"{path}: not a readable PyTorch checkpoint: {load_error_reason(path, err)}"
        ) from None
    _check_bounds(state, path)
    if not isinstance(state, dict):
        raise CheckpointImportError(
            f"{path}: top level is {type(state).__name__}; expected the dict of a reference "
            "train.py ({'model': [...], 'opt': Namespace, ...})"
        )
    return state


#: the bounds of a reference checkpoint's containers: its opt holds plain values, its state
#: dicts a few hundred tensors; a shared list of a shared list ... (tiny saved, exponential
#: walked or copied) or a deep nesting is refused before anything reads it
MAX_NESTING, MAX_ELEMENTS = 32, 1_000_000


def _check_bounds(state: Any, path: Path) -> None:
    """Refuse containers out of bounds (:data:`MAX_NESTING`, :data:`MAX_ELEMENTS`), naming the
    ``opt`` option that holds them where one does."""
    opt = state.get("opt") if isinstance(state, dict) else None
    if isinstance(opt, argparse.Namespace):
        for name, value in vars(opt).items():
            problem = container_bounds_problem(
                value, max_nesting=MAX_NESTING, max_elements=MAX_ELEMENTS
            )
            if problem:
                raise CheckpointImportError(f"{path}: refused: opt.{name} {problem}")
    problem = container_bounds_problem(
        state, max_nesting=MAX_NESTING, max_elements=MAX_ELEMENTS, walk=(argparse.Namespace,)
    )
    if problem:
        raise CheckpointImportError(f"{path}: refused: the checkpoint {problem}")


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
            near = near_keys(ref, states[part])
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
    check_output_file(out, "--out", "model.pt")
    if out.exists() and not overwrite:
        raise FileExistsError(f"{out}: exists; pass --overwrite to replace it")
    state = load_reference_checkpoint(path)
    states, opt = check_reference_layout(state, arch=arch, path=path)
    words = load_reference_vocab(vocab_path)

    rnn = REFERENCE_RNN[arch]
    has_reverse = any(k.startswith(f"{rnn}.") and k.endswith("_reverse") for k in states[1])
    output_dir = str(out.parent / out.stem)
    try:  # every option checked, and against the tensors, before any module is built
        model_cfg = model_config_from_opt(opt, arch=arch, bidirectional=has_reverse)
        check_opt_against_state(model_cfg, states, arch=arch, parts=STATE_PARTS[arch], rnn=rnn)
        raw_config = run_config_from_opt(
            opt, model_cfg, vocab=vocab_path.resolve(), output_dir=output_dir
        )
    except OptionError as err:
        raise CheckpointImportError(f"{path}: {err} (--arch {arch})") from None
    _check_vocab_size(states[1], opt, len(words), path, vocab_path)
    if arch == "sgraf":  # VisualSA's BatchNorm1d over the region slots (36 in the reference)
        slots = states[2].get("v_global_w.embedding_local.1.weight")
        model_cfg["num_regions"] = int(slots.shape[0]) if slots is not None and slots.dim() else 36

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
        **{k: plain(state.get(k)) for k in ("epoch", "best_rsum", "Eiters")},
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
            f"{vocab}: {n} words but {path} {where} {rows if rows != n else shown(size)}; pass "
            "the vocabulary the model was trained with"
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
