"""An export's folder: checked before any work, filled in a temporary sibling, then renamed
into place, so that a reader (or a failed export) sees the old folder or the new one whole.

An existing ``--out`` is refused unless ``overwrite``; with it, the folder is replaced only
when it holds nothing but files an export writes (:data:`EXPORT_FILES`), so that a mistyped
``--out`` (the home folder, a run folder) is refused instead of deleted.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

from ..._files import OutputPathError, check_output_dir, refuse_non_regular, signals_deferred

#: Every file ``vlret export`` writes in either format (``transformers``' ``save_pretrained``
#: of a CLIP model and processor; open_clip's weights and configs; vlret's record).
EXPORT_FILES = frozenset(
    {
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "processor_config.json",
        "preprocessor_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "vocab.json",
        "merges.txt",
        "chat_template.jinja",
        "open_clip_pytorch_model.bin",
        "open_clip_config.json",
        "open_clip_model_config.json",
        "vlret_export.json",
    }
)


def check_export_dir(out: str | Path, *, overwrite: bool, flag: str = "--out") -> Path:
    """Refuse ``out`` before the model is read: a file, a symbolic link, an unwritable place,
    or an existing non-empty folder without ``overwrite`` (with it: one holding a file an
    export does not write).

    Raises:
        OutputPathError: One line naming ``out`` and what is wrong.
    """
    out = Path(out)
    if out.is_symlink():
        raise OutputPathError(f"{out}: {flag} is a symbolic link; give the folder itself")
    check_output_dir(out, flag)
    if not out.is_dir():
        return out
    held = sorted(p.name for p in out.iterdir())
    if held and not overwrite:
        raise OutputPathError(
            f"{out}: {flag} exists and holds files; pass --overwrite to replace it"
        )
    foreign = [name for name in held if name not in EXPORT_FILES]
    if foreign:
        raise OutputPathError(
            f"{out}: {flag} holds {foreign[0]}, which vlret export does not write; refusing to "
            "replace the folder (remove it or choose another --out)"
        )
    for name in held:
        refuse_non_regular(out / name, flag)
    return out


def write_export_dir(
    out: str | Path, fill: Callable[[Path], Iterable[str] | None], *, overwrite: bool
) -> Path:
    """Run ``fill(tmp)`` on a new temporary folder beside ``out``, then put it at ``out``.

    ``out`` is checked first (:func:`check_export_dir`). An existing ``out`` is moved aside,
    the new folder renamed into its place and the old one deleted, with SIGINT and SIGTERM
    held for the two renames; the temporary folder is removed when ``fill`` fails.

    Args:
        out: The export folder.
        fill: Writes the export's files into the folder it is given.
        overwrite: Replace an existing export folder.

    Returns:
        ``out``.

    Raises:
        OutputPathError: ``out`` is refused (:func:`check_export_dir`).
    """
    out = check_export_dir(out, overwrite=overwrite)
    parent = out.parent if str(out.parent) else Path(".")
    parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=parent))
    old: Path | None = None
    try:
        fill(tmp)
        os.chmod(tmp, 0o777 & ~_umask())
        with signals_deferred():
            if out.exists():
                old = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".old", dir=parent))
                os.rename(out, old / out.name)
            os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None and not out.exists():
            os.rename(old / out.name, out)  # put the previous export back
            shutil.rmtree(old, ignore_errors=True)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return out


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


__all__ = ["EXPORT_FILES", "check_export_dir", "write_export_dir"]
