"""The run configs shipped with vlret: every paper's setting and the demo's, as package data.

``vlret configs`` lists them (name and a one-line description), ``vlret configs show NAME``
prints one and ``vlret configs copy NAME DIR`` writes it for editing. Wherever a command takes a
config file (``vlret train``, ``vlret compare``), a shipped config's name works too, as does
the path it has in a source checkout (``configs/NAME.toml``); an existing file always wins.
"""

from __future__ import annotations

import sys
from importlib import resources
from pathlib import Path

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
    """The shipped config that ``name`` means (``NAME``, ``NAME.toml`` or a path
    ``.../configs/NAME.toml``, where a source checkout kept them before they moved into the
    package), or None."""
    path = Path(name)
    if path.parent != Path(".") and path.parent.name != "configs":
        return None
    if path.suffix not in ("", ".toml"):
        return None
    return shipped_configs().get(path.stem)


def describe(path: Path) -> str:
    """One line: the file's first comment line, then its loss and data format."""
    text = path.read_text(encoding="utf-8")
    first = next((ln[1:].strip() for ln in text.splitlines() if ln.startswith("#")), "")
    raw = tomllib.loads(text)
    loss = raw.get("loss", {}).get("name", "triplet")
    data = raw.get("data", {}).get("format", "precomp")
    compared = raw.get("compare", {}).get("losses")
    what = f"compare {len(compared)} losses" if compared else f"loss {loss}"
    return f"{first} [{what}; data {data}]"


def copy_config(name: str, folder: str | Path) -> Path:
    """Write shipped config ``name`` into ``folder`` (created) for editing; an existing file of
    that name is not replaced.

    Raises:
        KeyError: No shipped config is called ``name``.
        FileExistsError: ``folder/NAME.toml`` exists.
    """
    source = shipped_config(name)
    if source is None:
        raise KeyError(f"{name!r} is not a shipped config; `vlret configs` lists them")
    target = Path(folder) / source.name
    if target.exists():
        raise FileExistsError(f"{target}: exists; not replaced")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(source.read_text(encoding="utf-8"), encoding="utf-8")
    return target


__all__ = ["copy_config", "describe", "shipped_config", "shipped_configs"]
