"""The run configs shipped with vlret: every paper's setting and the demo's, as package data.

``vlret configs`` lists them (name and the first sentence of its description), ``vlret
configs show NAME`` prints one and ``vlret configs copy NAME DIR`` writes it for editing.
Wherever a command takes a config file (``vlret train``, ``vlret compare``, ``vlret sweep``),
a shipped config's bare name (``NAME`` or ``NAME.toml``, no folder part) works too; an existing
file always wins, and a path with a folder part is only ever that file (a missing one is an
error, never the shipped config of the same name). Every listed config trains with
``vlret train NAME`` (the comparison configs train their ``[loss]``; ``vlret compare NAME``
trains their ``[compare.losses]``).
"""

from __future__ import annotations

import re
import sys
from importlib import resources
from pathlib import Path

from .._files import OutputPathError, atomic_write_text, check_output_dir

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

#: The folder of the shipped ``.toml`` files inside the installed package.
_FOLDER = resources.files(__name__)


def shipped_configs() -> dict[str, Path]:
    """Name (file stem) -> path of every shipped config, sorted by name."""
    files = (Path(str(f)) for f in _FOLDER.iterdir() if f.name.endswith(".toml"))
    return {f.stem: f for f in sorted(files)}


def shipped_config(name: str | Path) -> Path | None:
    """The shipped config that the bare name ``name`` means (``NAME`` or ``NAME.toml``), or
    None (also for any name with a folder part: that is a path, not a name)."""
    path = Path(name)
    if path.parent != Path("."):
        return None
    if path.suffix not in ("", ".toml"):
        return None
    return shipped_configs().get(path.stem)


#: The end of a sentence: a full stop before a capital (or a quote) or the end of the text;
#: ``4.1. Adam`` ends one, ``et al. 2019`` and ``e.g. the`` do not.
_SENTENCE_END = re.compile(r"\.(?=\s+[A-Z`'\"(]|\s*$)")


def first_sentence(text: str) -> str:
    """The first sentence of the file's leading comment paragraph (its lines joined), whole;
    the paragraph ends at a line that is no comment, an empty comment or an indented one
    (a command example)."""
    block = []
    for line in text.splitlines():
        body = line[1:]
        if not line.startswith("#") or not body.strip() or body.startswith("  "):
            break
        block.append(body.strip())
    joined = " ".join(block)
    end = _SENTENCE_END.search(joined)
    return joined[: end.end()] if end else joined


def describe(path: Path) -> str:
    """One line: the first sentence of the file's leading comment, then its loss and data
    format."""
    text = path.read_text(encoding="utf-8")
    first = first_sentence(text)
    raw = tomllib.loads(text)
    loss = raw.get("loss", {}).get("name", "triplet")
    data = raw.get("data", {}).get("format", "precomp")
    compared = raw.get("compare", {}).get("losses")
    what = f"compare {len(compared)} losses" if compared else f"loss {loss}"
    return f"{first} [{what}; data {data}]"


def copy_config(name: str, folder: str | Path) -> Path:
    """Write shipped config ``name`` into ``folder`` (created) for editing, atomically; an
    existing file of that name is not replaced. The folder is checked before anything is
    written (:func:`vlret._files.check_output_dir`).

    Raises:
        KeyError: No shipped config is called ``name``.
        FileExistsError: ``folder/NAME.toml`` exists.
        vlret._files.OutputPathError: ``folder`` is a file, lies under one or cannot be written.
    """
    source = shipped_config(name)
    if source is None:
        raise KeyError(f"{name!r} is not a shipped config; `vlret configs` lists them")
    folder = check_output_dir(folder, "DIR")
    target = folder / source.name
    if target.exists() or target.is_symlink():
        raise FileExistsError(f"{target}: exists; not replaced")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise OutputPathError(f"{folder}: DIR cannot be created ({err.strerror})") from None
    return atomic_write_text(target, source.read_text(encoding="utf-8"))


__all__ = ["copy_config", "describe", "first_sentence", "shipped_config", "shipped_configs"]
