"""Reading run config files (TOML, YAML with a safe loader, JSON) and typing ``--set``
values; :class:`ConfigError`, the error of every config check (:mod:`vlret.train.config`)."""

from __future__ import annotations

import functools
import json
import re
import sys
from pathlib import Path
from typing import Any

from .._extras import require
from ..configs import shipped_config

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

_EXPONENT_FLOAT = re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$")


def _yaml(what: str) -> Any:
    """PyYAML, imported when a YAML file is read or written (the ``train`` extra)."""
    return require("yaml", what)


@functools.cache
def _safe_loader() -> Any:
    """``yaml.SafeLoader`` that also reads ``1e-3`` / ``5E+4`` (no dot) as floats (YAML 1.2)."""
    yaml = _yaml("a YAML run config")
    loader: Any = type("_SafeLoader", (yaml.SafeLoader,), {})
    loader.add_implicit_resolver("tag:yaml.org,2002:float", _EXPONENT_FLOAT, list("-+0123456789"))
    return loader


class _YAMLParseError(ValueError):
    """A ``yaml.YAMLError``, caught where PyYAML is imported (it is imported lazily)."""


def _load_yaml(text: str) -> Any:
    yaml = _yaml("a YAML run config")
    try:
        return yaml.load(text, Loader=_safe_loader())  # noqa: S506 (a SafeLoader subclass)
    except yaml.YAMLError as err:
        raise _YAMLParseError(str(err)) from None


class ConfigError(ValueError):
    """A config file or override that does not hold what the schema requires."""

    def __init__(self, source: str | Path, key: str, message: str) -> None:
        self.source = str(source)
        self.key = key
        where = f"{source}: {key}" if key else str(source)
        super().__init__(f"{where}: {message}")


def read_config_file(path: str | Path) -> dict[str, Any]:
    """The raw mapping of a ``.toml`` / ``.yaml`` / ``.yml`` / ``.json`` file."""
    path = Path(path)
    if not path.is_file():  # a shipped config's name (or its path in a source checkout)
        path = shipped_config(path) or path
    if not path.is_file():
        raise FileNotFoundError(
            f"{path}: missing; expected a TOML or YAML run config or the name of a shipped one "
            "(`vlret configs` lists them)"
        )
    suffix = path.suffix.lower()
    text = path.read_text(encoding="utf-8")
    try:
        if suffix == ".toml":
            raw = tomllib.loads(text)
        elif suffix in (".yaml", ".yml"):
            raw = _load_yaml(text)
        elif suffix == ".json":
            raw = json.loads(text)
        else:
            raise ConfigError(path, "", "unknown extension; expected .toml, .yaml, .yml or .json")
    except (tomllib.TOMLDecodeError, _YAMLParseError, json.JSONDecodeError) as err:
        raise ConfigError(path, "", f"cannot parse: {err}") from None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(path, "", f"expected a mapping of sections, got {type(raw).__name__}")
    return raw


def parse_value(text: str) -> Any:
    """Type an override value: TOML literal syntax (``3``, ``1e-4``, ``true``, ``[10, 15]``,
    ``{a = 1}``, ``"quoted"``), ``null``/``none`` for None, anything else a plain string."""
    stripped = text.strip()
    if stripped.lower() in ("null", "none", "~"):
        return None
    try:
        return tomllib.loads(f"v = {stripped}")["v"]
    except tomllib.TOMLDecodeError:
        pass
    if stripped.lower() in ("true", "false"):  # YAML-style capitalisation
        return stripped.lower() == "true"
    return stripped


__all__ = ["ConfigError", "parse_value", "read_config_file"]
