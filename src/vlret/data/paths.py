"""Relative paths: one rule for every config key and every command.

**A relative path is relative to the current folder** (the working directory the command runs
in), as for any command-line tool: every config key that names a file or folder (``output_dir``,
``data.root``, ``data.shards``, ``data.dev_shards``, ``data.csv``, ``data.dev_csv``,
``data.karpathy_json``, ``data.image_root``, ``data.features_dir``, ``data.annotations``,
``data.vocab``, ``data.tokenizer``, ``data.noise_index``, ``data.offline_negatives``, the
captions files, ``train.init_from``, ``train.zeroshot_root``, ``model.path`` ...) and every
command-line path (a checkpoint or run folder, ``--data``, ``--out``, ``--json``,
``--model-dir`` ...). Never relative to ``data.root``, to another key or to the config file's
folder; an absolute path is itself. So ``vlret synth tiny --out runs/w`` followed by a config
naming ``runs/w/webdataset/train/00000.tar`` works from the folder both ran in.

What a data set's own layout names is not a setting and stays where the layout puts it: a
precomp folder's ``{split}_ims.npy`` / ``{split}_caps.txt`` and an MSR-VTT folder's files in
``data.root``, a person-search set's default annotation file and ``imgs/`` in ``data.root``, the
image files a Karpathy JSON or a CSV names under ``data.image_root`` (a CSV's default: its own
folder).

Until this rule, ``data.shards``, ``data.dev_shards``, ``data.csv`` and ``data.dev_csv``
started from ``data.root``. Such a config now names a missing file; where the file exists under
``data.root`` the error says so, for these keys and every other path key
(:func:`check_data_paths`, :func:`relative_path_hint`): ``data.shards: ...: missing; ... is
relative to the current folder, not to data.root; did you mean 'ROOT/...'?``. A run folder's
stored config keeps the paths as they were given, relative to the folder the run was trained
from (``vlret eval RUN`` run elsewhere names ``--data``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

#: The ``[data]`` keys that name one file or folder (besides ``root`` itself; the shard patterns
#: are checked file by file, :func:`vlret.data.formats.shards.expand_shards`).
DATA_PATH_KEYS = (
    "features_dir",
    "karpathy_json",
    "image_root",
    "vocab",
    "tokenizer",
    "csv",
    "dev_csv",
    "annotations",
    "noise_index",
    "offline_negatives",
    "train_captions",
    "semantic_captions",
    "dev_captions",
    "test_captions",
)


def relative_path_hint(
    path: str | Path, *, data_root: str | Path | None, pattern: str | None = None
) -> str:
    """The fix for a missing relative ``path`` that exists under ``data_root`` (a config written
    for the old rule), as a clause to append to the error; ``""`` otherwise.

    Args:
        path: The path as the config or command line gives it.
        data_root: The config's ``data.root`` (``None``: no hint).
        pattern: What the key holds when ``path`` is one file of it (a shard pattern such as
            ``webdataset/train/{00000..00003}.tar``): the suggestion prefixes it instead.

    Returns:
        ``"; PATH is relative to the current folder, not to data.root; did you mean
        'ROOT/PATH'?"``, or ``""`` when ``path`` is absolute, exists, or is missing under
        ``data_root`` too.
    """
    given = Path(path)
    if data_root is None or given.is_absolute() or given.exists():
        return ""
    if not (Path(data_root) / given).exists():
        return ""
    shown = pattern if pattern is not None else str(path)
    return (
        f"; {shown} is relative to the current folder, not to data.root; did you mean "
        f"{str(Path(data_root) / shown)!r}?"
    )


def check_data_paths(data: Any) -> None:
    """Refuse a ``[data]`` section (:class:`~vlret.data.config.DataConfig`) one of whose
    :data:`DATA_PATH_KEYS` names a relative path that is missing from the current folder but
    found under ``data.root``: the config was written as if paths started from ``data.root``.

    Raises:
        FileNotFoundError: ``data.KEY: PATH: missing; PATH is relative to the current folder,
            not to data.root; did you mean 'ROOT/PATH'?``.
    """
    root = getattr(data, "root", None)
    for key in DATA_PATH_KEYS:
        value = getattr(data, key, None)
        if isinstance(value, str) and value.strip():
            hint = relative_path_hint(value, data_root=root)
            if hint:
                raise FileNotFoundError(f"data.{key}: {value}: missing{hint}")


__all__ = ["DATA_PATH_KEYS", "check_data_paths", "relative_path_hint"]
