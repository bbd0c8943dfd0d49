"""Reading run config files (TOML, YAML with a safe loader, JSON) and typing ``--set``
values; :class:`ConfigError`, the error of every config check (:mod:`vlret.run.config`).

What is read is bounded before anything walks or expands it (:func:`check_tree`): a config
file is UTF-8 text of at most :data:`MAX_BYTES`, YAML aliases (``*name``) are refused where
they are read (an alias bomb expands to billions of values from a few lines), the nesting
depth is at most :data:`MAX_DEPTH` levels (real configs nest 3) and the values, counted as if
every shared table were written out, at most :data:`MAX_VALUES`. Each refusal is one
:class:`ConfigError` naming the file.
"""

from __future__ import annotations

import functools
import json
import math
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

#: The nesting depth a config may have (a section is level 1; real configs nest 3).
MAX_DEPTH = 32
#: The number of values (tables, lists and leaves) a config may hold, shared ones counted
#: at every place they appear: far above any real config, far below an alias bomb.
MAX_VALUES = 100_000
#: The size of a config file (real ones are a few KB).
MAX_BYTES = 16 * 2**20

_EXPONENT_FLOAT = re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$")


def _yaml(what: str) -> Any:
    """PyYAML, imported when a YAML file is read or written (the ``train`` extra)."""
    return require("yaml", what)


class _YAMLAlias(ValueError):
    """A YAML alias, refused where the composer meets it (before anything expands it)."""


@functools.cache
def _safe_loader() -> Any:
    """``yaml.SafeLoader`` that also reads ``1e-3`` / ``5E+4`` (no dot) as floats (YAML 1.2)
    and refuses aliases (``*name``), anchors' only use (and an alias bomb's means)."""
    yaml = _yaml("a YAML run config")

    def compose_node(self: Any, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise _YAMLAlias(
                f"line {event.start_mark.line + 1}: YAML alias *{event.anchor} refused (a run "
                "config writes its values out; aliases can expand a few lines into billions)"
            )
        return yaml.SafeLoader.compose_node(self, parent, index)

    loader: Any = type("_SafeLoader", (yaml.SafeLoader,), {"compose_node": compose_node})
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


def _dotted(keys: list[str]) -> str:
    """A key path for a message (``a.b[0].c``), its middle left out when it is long."""
    text = "".join(k if k.startswith("[") or i == 0 else f".{k}" for i, k in enumerate(keys))
    if len(keys) <= 6:
        return text
    return f"{_dotted(keys[:3])}...{keys[-1]}"


def check_tree(raw: Any, source: str | Path, key: str = "", *, finite: bool = True) -> int:
    """Refuse a raw config nested deeper than :data:`MAX_DEPTH`, holding more than
    :data:`MAX_VALUES` values (a table or list shared by several keys counted at each, as a
    walk of the tree would meet it), referring to itself, or (with ``finite``) holding a number
    that is not finite (``lr = inf`` or ``nan`` name their key); returns the count. Each table
    and list object is visited once, so shared structure costs its size, never its expansion.
    ``key``: where ``raw`` sits in a config (a ``--set`` value's dotted key)."""
    seen: dict[int, tuple[int, int]] = {}  # id -> (values, height) of a finished container
    active: set[int] = set()

    def visit(node: Any, keys: list[str], depth: int) -> tuple[int, int]:
        if finite and isinstance(node, float) and not math.isfinite(node):
            raise ConfigError(source, _dotted(keys), f"expected a finite number, got {node!r}")
        if not isinstance(node, (dict, list, tuple)):
            return 1, 0
        if id(node) in seen:
            count, height = seen[id(node)]
        elif id(node) in active:
            raise ConfigError(source, _dotted(keys), "refers to itself (a cycle)")
        else:
            if depth > MAX_DEPTH:
                raise ConfigError(
                    source,
                    _dotted(keys),
                    f"nested more than {MAX_DEPTH} levels deep (a run config nests 3)",
                )
            active.add(id(node))
            count, height = 1, 1  # height: the levels of tables / lists, this one included
            items = node.items() if isinstance(node, dict) else enumerate(node)
            for k, v in items:
                child = f"[{k}]" if isinstance(node, (list, tuple)) else str(k)
                n, h = visit(v, [*keys, child], depth + 1)
                count, height = count + n, max(height, h + 1)
                if count > MAX_VALUES:
                    raise ConfigError(
                        source,
                        _dotted(keys),
                        f"holds more than {MAX_VALUES} values (tables shared by several keys "
                        "counted at each); a run config holds about a hundred",
                    )
            active.discard(id(node))
            seen[id(node)] = (count, height)
        if depth + height - 1 > MAX_DEPTH:  # reached again deeper than first met
            raise ConfigError(
                source,
                _dotted(keys),
                f"nested more than {MAX_DEPTH} levels deep (a run config nests 3)",
            )
        return count, height

    return visit(raw, [key] if key else [], key.count(".") + 1 if key else 0)[0]


def resolve_config_path(path: str | Path) -> Path:
    """The file ``path`` names: an existing file, else a shipped config's bare name
    (``NAME`` or ``NAME.toml``, no folder). A path with a folder part that does not exist is an
    error naming it, never a shipped config of the same name (a typo of one's own copy under
    ``configs/`` must not train the shipped one); the message says how to ask for that one.

    Raises:
        FileNotFoundError: Nothing is at ``path`` and it is no shipped config's name.
        ConfigError: ``path`` is a folder.
    """
    path = Path(path)
    if path.is_file():
        return path
    bare = path.parent == Path(".") and path.name not in ("", ".", "..")
    shipped = shipped_config(path.name) if path.suffix in ("", ".toml") else None
    if bare and shipped is not None:
        return shipped
    if path.is_dir():
        raise ConfigError(path, "", "is a folder; expected a TOML, YAML or JSON run config file")
    if path.exists():  # a device, a pipe, a socket
        raise ConfigError(path, "", "not a regular file; expected a TOML, YAML or JSON run config")
    if shipped is not None:
        raise FileNotFoundError(
            f"{path}: no such file; to use the shipped config {shipped.stem!r}, give its bare "
            f"name: {shipped.stem}"
        )
    if bare:
        raise FileNotFoundError(
            f"{path}: no such file, nor a shipped config's name; expected a TOML, YAML or JSON "
            "run config or a shipped config's name (`vlret configs` lists them)"
        )
    raise FileNotFoundError(f"{path}: no such file; expected a TOML, YAML or JSON run config")


def _read_text(path: Path) -> str:
    """The file's text: UTF-8 of at most :data:`MAX_BYTES`, else a :class:`ConfigError`
    naming the file (and the offending byte's offset)."""
    try:
        size = path.stat().st_size
        if size > MAX_BYTES:
            why = f"{size} bytes; a run config is text of at most {MAX_BYTES} bytes (a few KB)"
            raise ConfigError(path, "", why)
        data = path.read_bytes()
    except OSError as err:  # permission, a folder on a dead mount, ...
        raise ConfigError(path, "", f"cannot read ({err.strerror or err})") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(
            path,
            "",
            f"not a text config: byte 0x{data[err.start]:02x} at offset {err.start} is not "
            "UTF-8 (expected a TOML, YAML or JSON file)",
        ) from None
    if "\x00" in text:
        offset = data.index(b"\x00")
        raise ConfigError(
            path,
            "",
            f"not a text config: a NUL byte at offset {offset} (expected a TOML, YAML or JSON "
            "file)",
        )
    return text


def read_config_file(path: str | Path) -> dict[str, Any]:
    """The raw mapping of a ``.toml`` / ``.yaml`` / ``.yml`` / ``.json`` file, or of a shipped
    config given by its bare name (:func:`resolve_config_path`), checked by
    :func:`check_tree`."""
    path = resolve_config_path(path)
    suffix = path.suffix.lower()
    if suffix not in (".toml", ".yaml", ".yml", ".json"):
        raise ConfigError(path, "", "unknown extension; expected .toml, .yaml, .yml or .json")
    text = _read_text(path)
    try:
        if suffix == ".toml":
            raw = tomllib.loads(text)
        elif suffix == ".json":
            raw = json.loads(text)
        else:
            raw = _load_yaml(text)
    except (tomllib.TOMLDecodeError, _YAMLParseError, json.JSONDecodeError) as err:
        raise ConfigError(path, "", f"cannot parse: {err}") from None
    except _YAMLAlias as err:
        raise ConfigError(path, "", str(err)) from None
    except RecursionError:
        raise ConfigError(path, "", _TOO_DEEP_TO_PARSE) from None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(path, "", f"expected a mapping of sections, got {type(raw).__name__}")
    check_tree(raw, path)
    return raw


_TOO_DEEP_TO_PARSE = (
    f"nested too deeply to parse (more than Python's recursion limit; a run config nests at "
    f"most {MAX_DEPTH} levels)"
)


def override_keys(dotted: str) -> list[str]:
    """The key path of a ``--set KEY=VALUE`` override: ``KEY`` split at its dots, where a part
    may be a TOML quoted key holding dots itself (``optim.lr_multipliers."text_encoder.bert"``,
    or with single quotes), so two overlapping ``lr_multipliers`` prefixes can both be set.
    Parts are stripped; an empty one is left in for the caller to refuse with the key.

    Raises:
        ConfigError: A quoted key that TOML does not read (an unclosed quote), naming ``--set``.
    """
    text = dotted.strip()
    if '"' not in text and "'" not in text:
        return [k.strip() for k in text.split(".")]  # any characters, as before quoting
    try:
        node: Any = tomllib.loads(f"{text} = 0")
    except tomllib.TOMLDecodeError as err:
        why = f'cannot read the quoted key ({err}); expected parts like a."b.c".d'
        raise ConfigError("--set", text, why) from None
    keys = []
    while isinstance(node, dict):  # one key per level: {"a": {"b.c": {"d": 0}}}
        ((key, node),) = node.items()
        keys.append(key)
    return keys


def set_override(
    raw: dict[str, Any],
    keys: list[str],
    value: Any,
    *,
    given: list[tuple[str, ...]],
    dotted: str,
) -> None:
    """Set ``raw[keys[0]][keys[1]]...`` to ``value``, making the tables on the way.
    ``given``: the key paths earlier overrides of the same command line set.

    Raises:
        ConfigError: A part on the way holds a value, not a table, or ``value`` (not a table)
            would replace a table an earlier override filled (``x.y.z=1`` then ``x.y=2``): the
            message says how to quote a key holding dots (two overlapping prefixes).
    """
    node = raw
    for i, k in enumerate(keys[:-1]):
        child = node.setdefault(k, {})
        if not isinstance(child, dict):
            where = ".".join(keys[: i + 1])
            why = f"{where} holds {child!r}, not a table; {_quoted_hint(keys, i)}"
            raise ConfigError("--set", dotted, why)
        node = child
    earlier = [p for p in given if len(p) > len(keys) and list(p[: len(keys)]) == keys]
    if earlier and not isinstance(value, dict):
        why = (
            f"would replace {'.'.join(earlier[0])} set by an earlier --set; "
            f"{_quoted_hint(list(earlier[0]), len(keys) - 1)}"
        )
        raise ConfigError("--set", dotted, why)
    node[keys[-1]] = value


def delete_override(raw: dict[str, Any], keys: list[str], *, dotted: str) -> None:
    """Delete ``raw[keys[0]][keys[1]]...`` (``--set section.key=null``): the key's declared
    default applies again. A key that is not there is left absent.

    Raises:
        ConfigError: A part on the way holds a value, not a table.
    """
    node = raw
    for i, k in enumerate(keys[:-1]):
        child = node.get(k)
        if child is None:
            return
        if not isinstance(child, dict):
            where = ".".join(keys[: i + 1])
            why = f"{where} holds {child!r}, not a table; {_quoted_hint(keys, i)}"
            raise ConfigError("--set", dotted, why)
        node = child
    node.pop(keys[-1], None)


def _quoted_hint(keys: list[str], at: int) -> str:
    """How to give ``keys`` with its parts from ``at`` on as one quoted key (a prefix holding
    dots, beside a shorter one)."""
    head = "".join(f"{k}." for k in keys[:at])
    return f"a key holding dots is quoted: --set '{head}\"{'.'.join(keys[at:])}\"=VALUE'"


def stderr_note(line: str) -> None:
    """Print a one-line note of what reading the config changed (on stderr, beside the run's
    output)."""
    print(line, file=sys.stderr)


def parse_value(text: str, key: str = "") -> Any:
    """Type an override value: TOML literal syntax (``3``, ``1e-4``, ``true``, ``[10, 15]``,
    ``{a = 1}``, ``"quoted"``), ``null``/``none``/``~`` for None (``--set`` then deletes the key,
    :func:`vlret.run.config.apply_overrides`), anything else a plain string.
    A value nested deeper than :data:`MAX_DEPTH` is a :class:`ConfigError` naming ``--set``
    and ``key``."""
    stripped = text.strip()
    if stripped.lower() in ("null", "none", "~"):
        return None
    try:
        value = tomllib.loads(f"v = {stripped}")["v"]
    except tomllib.TOMLDecodeError:
        pass
    except RecursionError:
        raise ConfigError("--set", key, _TOO_DEEP_TO_PARSE) from None
    else:
        check_tree(value, "--set", key, finite=False)  # inf is refused where it is used
        return value
    if stripped.lower() in ("true", "false"):  # YAML-style capitalisation
        return stripped.lower() == "true"
    return stripped


__all__ = [
    "MAX_BYTES",
    "MAX_DEPTH",
    "MAX_VALUES",
    "ConfigError",
    "check_tree",
    "delete_override",
    "override_keys",
    "parse_value",
    "read_config_file",
    "resolve_config_path",
    "set_override",
    "stderr_note",
]
