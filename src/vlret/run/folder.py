"""The run folder: what may be written where, and what a resumed run must agree with.

A run folder (``output_dir``) holds :data:`RUN_FILES` (``noise_index.npy`` and ``noise.json``
only with noisy correspondence: :func:`save_run_files`), and ``epoch_<N>.pt`` for the epochs
``train.keep_epochs`` lists. Rules:

* an empty ``output_dir``, a path that is a file, or a folder that cannot be written is refused
  before any data is read;
* one process at a time: the folder is locked (:mod:`.lock`) before anything in it is read
  or deleted, and a folder in use by a live run is refused;
* a ``--resume`` checkpoint that does not exist is refused as missing, naming the checkpoints
  the folder does hold;
* a folder that already holds a run is refused unless the run resumes from a checkpoint of that
  folder, or ``overwrite`` is set (the old run's files, :data:`RUN_FILES` and its
  ``epoch_<N>.pt``, are then deleted by :func:`clear_run_folder` once every check of the new
  run has passed, so no record of the old run is mixed into the new one and a refused run
  deletes nothing); the refusal names ``last.pt`` to resume from only when the folder holds it;
* ``overwrite`` is refused, naming the key, when an input of the run (:func:`run_input_paths`:
  ``train.init_from``, ``data.noise_index``, ``data.offline_negatives``, the captions files,
  ``--resume`` from another folder, the data and model paths) lies in ``output_dir``: the
  folder it would clear;
* temporary files left by a killed atomic write are removed;
* a resumed run must have the checkpoint's model, loss, optimiser and batch schedule
  (:data:`FROZEN_KEYS`); other keys (epochs, logging, device, data location) may change;
* a run on webdataset shards also keeps the keys its epoch order is a function of
  (:data:`SHARD_FROZEN_KEYS`: the readers and the stream) and its number of ranks
  (:func:`check_stream_resume`), since :mod:`vlret.data.formats.shards` resumes by replaying the
  epoch's stream; the shards' location may change (the files must be the same, in the same
  order: not checked).

Checkpoint order: at the end of an epoch that improves the selection metric
(``train.select_on``: the dev rsum, or T->I R@1 on person search) ``best.pt`` is written
before ``last.pt``, and both record ``best_epoch``. A kill between the two leaves ``best.pt``
ahead of ``last.pt``; the resumed run repeats the epoch exactly and writes it again. A
``best.pt`` that is missing or behind the checkpoint's ``best_epoch`` (resuming into another
folder, or an older vlret) is restored by :func:`restore_best` where the data allow.
"""

from __future__ import annotations

import copy
import os
import shlex
import shutil
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .._files import atomic_write, remove_stale_temporaries
from ..data.checks import read_npy_header
from ..data.formats import format_names, get_format
from ..data.noisy import NOISE_INDEX_FILE, NOISE_SUMMARY_FILE, save_noise_record
from ..data.paths import DATA_PATH_KEYS
from .checkpoint import load_checkpoint, torch_load_quietly
from .config import ConfigError, config_from_dict, save_config
from .lock import check_unlocked

RUN_FILES = (
    "config.yaml",
    "vocab.json",
    NOISE_INDEX_FILE,
    NOISE_SUMMARY_FILE,
    "metrics.jsonl",
    "last.pt",
    "best.pt",
)

#: Dotted config keys (a section name covers all its keys) that a resumed run cannot change.
FROZEN_KEYS = (
    "model",
    "loss",
    "optim",
    "train.batch_size",
    "train.seed",
    "train.all_negatives_epochs",
    "train.momentum_encoder",
    "train.freeze",
    "train.freeze_epochs",
    "train.freeze_bn",
    "train.lock",
    "train.drop_last",
    "train.procedure",
    "train.procedure_options",
    "data.format",
    "data.train_split",
    "data.vocab",
    "data.tokenizer",
    "data.min_count",
    "data.captions_per_image",
    "data.captions_per_video",
    "data.protocol",
    "data.noise_index",
    "data.noise_format",
    "data.noise_ratio",
    "data.noise_seed",
)

#: The keys of a ``data.format = "webdataset"`` run that its epoch order depends on (the
#: number of ranks too): a resume replays the stream, so it needs the same ones.
SHARD_FROZEN_KEYS = (
    "data.num_workers",
    "data.shuffle_buffer",
    "data.resampled",
    "data.train_num_samples",
    # which samples are skipped as over the cap decides the replayed stream
    "data.max_image_pixels",
)


class RunFolderError(ValueError):
    """An output folder or a resume that would lose or mix up a run's files."""


#: The keys of :class:`~vlret.data.config.DataConfig` that name files or folders the run
#: reads: the root, the shard patterns (a pattern's braces and anything after them are not part
#: of the path) and every single-path key of :data:`vlret.data.paths.DATA_PATH_KEYS`.
DATA_INPUT_KEYS = ("root", "shards", "dev_shards", *DATA_PATH_KEYS)
#: The keys of :class:`~vlret.run.config.TrainConfig` that name what the run reads.
TRAIN_INPUT_KEYS = ("init_from", "zeroshot_root")
#: The keys, at any depth of the ``[model]`` section, whose string value is a local path.
MODEL_INPUT_KEYS = ("path", "tokenizer")


def _streams(name: Any) -> bool:
    """Whether a stored ``data.format`` streams its training split (resumed by position)."""
    return name in format_names() and get_format(name).streams


def _local_paths(value: Any) -> list[str]:
    """The local paths a config value names: a string or a list of them; URLs, ``pipe:``
    commands and empty strings are none; a shard pattern is cut at its first brace."""
    items = value if isinstance(value, (list, tuple)) else [value]
    paths = []
    for item in items:
        if not isinstance(item, str) or not item.strip():
            continue
        if "://" in item or item.startswith("pipe:"):
            continue
        paths.append(item.split("{", 1)[0] or ".")
    return paths


def _model_paths(node: Any, prefix: str, out: dict[str, list[str]]) -> None:
    if isinstance(node, dict):
        for key, value in node.items():
            dotted = f"{prefix}.{key}"
            if key in MODEL_INPUT_KEYS and _local_paths(value):
                out[dotted] = _local_paths(value)
            else:
                _model_paths(value, dotted, out)


def run_input_paths(config: Any, *, resume: str | Path | None = None) -> dict[str, list[str]]:
    """Every local path a run reads, by the config key (or ``--resume``) that names it: the
    :data:`DATA_INPUT_KEYS`, :data:`TRAIN_INPUT_KEYS` and the ``path`` / ``tokenizer`` keys of
    the ``[model]`` section."""
    found: dict[str, list[str]] = {}
    for section, keys in (("data", DATA_INPUT_KEYS), ("train", TRAIN_INPUT_KEYS)):
        for key in keys:
            paths = _local_paths(getattr(getattr(config, section), key, None))
            if paths:
                found[f"{section}.{key}"] = paths
    _model_paths(getattr(config, "model", None), "model", found)
    if resume is not None:
        found["--resume"] = [str(resume)]
    return found


def _inside(path: Path, folder: Path) -> bool:
    """Whether ``path`` (links resolved) is ``folder`` or lies in it."""
    try:
        resolved, root = path.resolve(), folder.resolve()
    except (OSError, RuntimeError):  # pragma: no cover - a link loop
        return False
    return resolved == root or root in resolved.parents


def check_overwrite_inputs(folder: Path, inputs: dict[str, list[str]]) -> None:
    """Refuse ``--overwrite`` of ``folder`` when one of the run's ``inputs`` (key -> paths)
    lies in it, naming the key: the folder it would clear is one the run reads from."""
    for key, paths in inputs.items():
        for text in paths:
            if _inside(Path(text), folder):
                raise RunFolderError(
                    f"{folder}: --overwrite would clear the folder that {key} = {text} is read "
                    f"from; move {text} out of output_dir first, or choose another output_dir"
                )


def replaces_run(folder: Path, *, resume: str | Path | None, overwrite: bool) -> bool:
    """Whether the run clears ``folder``'s old run (``overwrite`` and not resumed from it)."""
    return overwrite and not (resume is not None and _same_folder(Path(resume).parent, folder))


def clear_run_folder(folder: str | Path) -> list[str]:
    """Delete the old run's :data:`RUN_FILES` and its kept ``epoch_<N>.pt`` checkpoints
    (``train.keep_epochs``) in ``folder`` (``--overwrite``; nothing else is deleted, the run's
    inputs included); returns the names deleted."""
    folder = Path(folder)
    removed = []
    kept = sorted(p.name for p in folder.glob("epoch_*.pt") if p.name[6:-3].isdigit())
    for name in (*RUN_FILES, *kept):
        path = folder / name
        if path.is_file() or path.is_symlink():  # a link is removed, never what it leads to
            path.unlink()
            removed.append(name)
    return removed


def missing_folders(path: str | Path) -> list[Path]:
    """The folders of ``path`` that do not exist yet, ``path`` first, then its missing parents:
    what creating it makes, and what a run refused before writing anything removes again."""
    missing: list[Path] = []
    folder = Path(path)
    while not folder.exists() and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    return missing


def prepare_run_folder(
    output_dir: str | Path,
    *,
    resume: str | Path | None = None,
    overwrite: bool = False,
    create: bool = True,
    lock: Callable[[Path], object] | None = None,
    inputs: dict[str, list[str]] | None = None,
) -> Path:
    """Check (and with ``create`` make) ``output_dir`` for a run; see the module docstring.

    ``create=False`` only checks (the ranks of a distributed run other than rank 0).
    ``lock(folder)`` is called once the folder exists and before anything in it is read
    (:func:`vlret.run.lock.acquire_run_lock`: a folder in use is refused there).
    ``inputs``: the run's input paths by key (:func:`run_input_paths`), refused in the folder
    that ``overwrite`` would clear. Nothing of an old run is deleted here: the caller clears
    the folder (:func:`clear_run_folder`) once every check has passed
    (:func:`replaces_run` says whether).
    """
    folder = Path(output_dir)
    if not str(output_dir).strip():
        raise RunFolderError("output_dir is empty; expected a run folder")
    if folder.exists() and not folder.is_dir():
        raise RunFolderError(f"{folder}: output_dir is a file, not a folder")
    if create:
        try:
            folder.mkdir(parents=True, exist_ok=True)
            fd, probe = tempfile.mkstemp(prefix=".write-check.", dir=folder)
            os.close(fd)
            os.unlink(probe)
        except OSError as err:
            raise RunFolderError(
                f"{folder}: cannot write the output folder ({err.strerror or err})"
            ) from None
    if lock is not None:
        try:
            lock(folder)
        except OSError as err:
            raise RunFolderError(
                f"{folder}: cannot lock the output folder ({err.strerror or err})"
            ) from None
    if resume is not None and not Path(resume).exists():
        raise RunFolderError(missing_checkpoint(Path(resume), folder))
    found = [name for name in RUN_FILES if (folder / name).exists()]
    same_run = resume is not None and _same_folder(Path(resume).parent, folder)
    if found and not overwrite and not same_run:
        raise RunFolderError(
            f"{folder}: holds another run ({', '.join(found)}); {_continue_hint(folder, resume)}"
            "replace it with --overwrite, or choose another output_dir"
        )
    if replaces_run(folder, resume=resume, overwrite=overwrite):
        check_overwrite_inputs(folder, inputs or {})
    if not create:
        return folder
    remove_stale_temporaries(folder, RUN_FILES)
    return folder


def check_folder_unwritten(folder: Path) -> None:
    """What :func:`prepare_run_folder` with ``create`` and the run lock would refuse, found
    without creating, probing or locking anything (:func:`vlret.train.check_run`): the folder,
    or the nearest of its parents that exists, must be a folder this process may write, and no
    live run may hold it (:func:`vlret.run.lock.check_unlocked`)."""
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise RunFolderError(f"{existing}: is a file, so output_dir {folder} cannot be created")
    if not os.access(existing, os.W_OK | os.X_OK):
        what = "output folder" if existing == folder else f"folder that would hold {folder}"
        raise RunFolderError(f"{existing}: cannot write the {what} (permission denied)")
    if existing == folder:
        check_unlocked(folder)


def _continue_hint(folder: Path, resume: str | Path | None) -> str:
    """How the run a folder holds could be continued: only a checkpoint it holds is named."""
    if resume is not None:
        return "it is not the folder of the resumed checkpoint; "
    held = [folder / name for name in ("last.pt", "best.pt") if (folder / name).is_file()]
    if held:
        return f"continue it with --resume {held[0]}, "
    return "it holds no checkpoint to continue from; "


def save_run_files(config: Any, encoder: Any, train_set: Any, folder: Path) -> None:
    """What a run folder records of the run's setup when training starts: ``config.yaml`` (the
    resolved config), ``vocab.json`` (an encoder with a ``save``: a vocabulary) and, when the
    training pairs were re-paired, ``noise_index.npy`` + ``noise.json``
    (:func:`vlret.data.noisy.save_noise_record`: the applied index, reusable as
    ``data.noise_index``, and which captions it corrupted).

    A run resumed in its folder must train on the pairs its checkpoint was trained on: a
    ``noise_index.npy`` there that differs from the index now applied (the file behind
    ``data.noise_index`` was replaced) is refused before anything is written
    (:func:`check_noise_record`, which the trainer also calls with its other checks)."""
    check_noise_record(train_set, folder)
    save_config(config, folder / "config.yaml")
    if hasattr(encoder, "save"):
        encoder.save(folder / "vocab.json")
    save_noise_record(train_set, folder)


def check_noise_record(train_set: Any, folder: Path) -> None:
    """Refuse a ``folder/noise_index.npy`` (a resumed run's) that differs from the index
    ``train_set`` applies now; nothing to check without one or without noise."""
    noise = getattr(train_set, "noise", None)
    recorded = folder / NOISE_INDEX_FILE
    if noise is not None and recorded.is_file():
        try:
            # the header first: a forged one would have numpy allocate what it promises
            header = read_npy_header(recorded, "the run's noise index")
            same = (
                header.shape == tuple(noise.index.shape)
                and header.data_bytes >= header.expected_bytes
                and np.array_equal(np.load(recorded, allow_pickle=False), noise.index)
            )
        except (OSError, ValueError):
            same = False
        if not same:
            raise RunFolderError(
                f"{recorded}: the run was trained with this noise index, and the one applied "
                f"now ({noise.source or 'generated'}) re-pairs other captions; restore the file "
                "or train into a new output_dir"
            )


def _checkpoints_in(folder: Path) -> list[Path]:
    try:
        return sorted(p for p in folder.glob("*.pt") if p.is_file())
    except OSError:  # pragma: no cover
        return []


def missing_checkpoint(resume: Path, folder: Path) -> str:
    """The one line for a ``--resume`` checkpoint that does not exist: the checkpoints that
    the output folder (and the checkpoint's own folder, when another) do hold."""
    line = f"--resume {resume}: checkpoint missing"
    places = [folder]
    if resume.parent.is_dir() and not _same_folder(resume.parent, folder):
        places.insert(0, resume.parent)
    held = [p for place in places if place.is_dir() for p in _checkpoints_in(place)]
    if held:
        return line + f"; checkpoints found: {', '.join(str(p) for p in held)}"
    where = " or ".join(str(p) for p in places if p.is_dir()) or str(resume.parent)
    return line + f"; {where} holds no checkpoint (*.pt)"


def _same_folder(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve()
    except OSError:  # pragma: no cover
        return False


# --------------------------------------------------------------------------------------------
# Resume
# --------------------------------------------------------------------------------------------


def _flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(node, dict) and node:
        out: dict[str, Any] = {}
        for k, v in node.items():
            out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: node}


def _frozen(key: str) -> bool:
    return any(key == f or key.startswith(f + ".") for f in FROZEN_KEYS)


def changed_frozen_keys(stored: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """Dotted keys under :data:`FROZEN_KEYS` whose values differ between two configs in the
    file layout (``RunConfig.to_dict()``); a key missing on one side counts as changed."""
    a, b = _flatten(stored), _flatten(current)
    return sorted(k for k in set(a) | set(b) if _frozen(k) and a.get(k, "<unset>") != b.get(k))


def _with_current_defaults(stored: dict[str, Any], checkpoint: str | Path) -> dict[str, Any]:
    """``stored`` read as this vlret reads a config: a key added since the checkpoint was
    written (``optim.decay_every``) takes its default, as it would have had, instead of
    counting as changed. A stored config this vlret cannot read is compared as it is, so the
    keys that differ are still named."""
    try:
        return config_from_dict(
            copy.deepcopy(stored), source=f"{checkpoint} (its run config)"
        ).to_dict()
    except ConfigError:
        return stored


def check_resume_config(
    stored: dict[str, Any] | None, current: dict[str, Any], checkpoint: str | Path
) -> None:
    """Refuse to resume ``checkpoint`` (whose run config is ``stored``) with a config that
    changes the model, the loss, the optimiser or the batch schedule, naming the keys."""
    if stored is None:
        raise RunFolderError(f"{checkpoint}: holds no run config; not a `vlret train` checkpoint")
    stored = _with_current_defaults(stored, checkpoint)
    keys = changed_frozen_keys(stored, current)
    if not keys:
        return
    a, b = _flatten(stored), _flatten(current)
    shown = "; ".join(f"{k}: {a.get(k, '<unset>')!r} -> {b.get(k, '<unset>')!r}" for k in keys[:6])
    more = f" (and {len(keys) - 6} more)" if len(keys) > 6 else ""
    raise RunFolderError(
        f"{checkpoint}: this run's config differs from the checkpoint's in {shown}{more}; a "
        "resumed run must keep its model, loss, optimiser and batch schedule (start a new run "
        "in another output_dir instead)"
    )


def check_stream_resume(
    stored: dict[str, Any] | None,
    current: dict[str, Any],
    checkpoint: str | Path,
    *,
    stored_world: int | None,
    world: int,
) -> None:
    """Refuse to resume a run on webdataset shards with other readers or another stream.

    The order of a shard epoch is a function of the seed, the epoch, the number of ranks and
    of DataLoader workers, the shuffle buffer, resampling and the epoch length
    (:mod:`vlret.data.formats.shards`); a resume skips the batches the checkpoint trained, so with
    another of these it would repeat some samples and skip others. Nothing to check for the
    other formats (their sampler's order does not depend on the workers).

    Args:
        stored: The checkpoint's run config (file layout).
        current: This run's.
        checkpoint: The checkpoint, named in the error.
        stored_world: The checkpoint's number of ranks (None: not recorded, not checked).
        world: This run's.

    Raises:
        RunFolderError: One line naming what changed.
    """
    if stored is None:
        return
    a = _flatten(_with_current_defaults(stored, checkpoint))
    b = _flatten(current)
    if not (_streams(a.get("data.format")) and _streams(b.get("data.format"))):
        return
    changed = [
        f"{k}: {a.get(k, '<unset>')!r} -> {b.get(k, '<unset>')!r}"
        for k in SHARD_FROZEN_KEYS
        if a.get(k, "<unset>") != b.get(k)
    ]
    if stored_world is not None and int(stored_world) != world:
        changed.append(f"written by a run of {int(stored_world)} ranks, resumed on {world}")
    if changed:
        raise RunFolderError(
            f"{checkpoint}: {'; '.join(changed)}; a run on webdataset shards resumes exactly "
            f"only with the checkpoint's {', '.join(SHARD_FROZEN_KEYS)} and number of ranks "
            "(the epoch's order depends on them)"
        )


def _best_epoch_in(path: Path) -> int | None:
    """``best_epoch`` recorded in ``path``, or None when missing or unreadable."""
    if not path.is_file():
        return None
    try:
        state = torch_load_quietly(path, map_location="cpu", mmap=True)
    except Exception:
        return None
    value = state.get("best_epoch") if isinstance(state, dict) else None
    return int(value) if value is not None else None


def restore_best(checkpoint: str | Path, state: dict[str, Any], folder: str | Path) -> str | None:
    """Make ``folder/best.pt`` hold the best epoch that the resumed ``state`` records.

    Nothing to do when ``best.pt`` holds that epoch or a later one. Otherwise it is copied from
    the checkpoint's own folder when that one holds it, or written from ``checkpoint`` itself
    when that is the end-of-epoch checkpoint of the best epoch. Returns a one-line note of what
    was done or could not be done (None when nothing was needed).
    """
    best_epoch = state.get("best_epoch")
    if best_epoch is None:
        return None
    folder, checkpoint = Path(folder), Path(checkpoint)
    target = folder / "best.pt"
    held = _best_epoch_in(target)
    if held is not None and held >= best_epoch:
        return None
    source = checkpoint.parent / "best.pt"
    if not _same_folder(source, target) and _best_epoch_in(source) == best_epoch:
        _copy_atomic(source, target)
        return f"best.pt (epoch {best_epoch}) copied from {source}"
    if int(state.get("epoch", -1)) == best_epoch + 1 and int(state.get("batch_in_epoch", 1)) == 0:
        _copy_atomic(checkpoint, target)
        return f"best.pt (epoch {best_epoch}) restored from {checkpoint}"
    return (
        f"best.pt of epoch {best_epoch} is missing and cannot be restored from {checkpoint}; "
        "the next epoch that improves the selection metric writes it"
    )


def check_select_on(state: dict[str, Any], select_on: str, checkpoint: str | Path) -> None:
    """Refuse to resume ``checkpoint`` (its ``state``) with another selection metric than the
    one its ``best.pt`` was chosen on (a checkpoint without ``select_on`` chose on rsum):
    the best value it carries would be compared with another metric's."""
    from .checkpoint import best_selection

    stored = best_selection(state)[0]
    if stored != select_on:
        raise RunFolderError(
            f"{checkpoint}: its best.pt is selected on dev {stored} and this run's "
            f"train.select_on is {select_on!r}; a resumed run keeps its selection metric (set "
            f'train.select_on = "{stored}", or start a new run in another output_dir)'
        )


def _copy_atomic(source: Path, target: Path) -> None:
    with open(source, "rb") as fh:
        atomic_write(target, lambda out: shutil.copyfileobj(fh, out))


def read_state(path: str | Path, device: torch.device) -> dict[str, Any]:
    """The checkpoint to resume from (a run checkpoint: with its config)."""
    state = load_checkpoint(path, map_location=device)
    if "config" not in state or "epoch" not in state:
        raise RunFolderError(f"{path}: not a `vlret train` checkpoint (no config or epoch)")
    return state


def resume_command(
    config_path: str | Path,
    overrides: list[str],
    checkpoint: Any,
    *,
    options: Sequence[str] = (),
) -> str:
    """The shell command that continues an interrupted ``vlret train`` run with the same
    config file, ``--set`` overrides and other ``options`` (``--log-gradients N``: a resumed
    run keeps logging), each shell-quoted."""
    parts = ["vlret", "train", str(config_path)]
    for item in overrides:
        parts += ["--set", item]
    parts += [*options, "--resume", str(checkpoint)]
    return " ".join(shlex.quote(p) for p in parts)
