"""One declaration per setting: a dataclass field made by :func:`setting`, and the machinery
that reads every declared record from a config file's tables.

A field's :class:`Setting` holds its one-line description and its constraint, so the one
declaration feeds

* the dataclass (the default or factory, the type annotation),
* validation in a config file's words (:func:`build` reads a record from a mapping:
  ``section.key: expected ..., got ...``, an unknown key named with the known ones, a missing
  required key; :func:`check_values` checks a record already built),
* the generated key reference (:func:`declared` iterates the fields with their declarations,
  :meth:`Setting.constraint_text` says the constraint in words),
* defaults (:func:`defaults`).

Users: the sections of a run config (``[data]``: :class:`vlret.data.config.DataConfig`;
``[optim]``, ``[train]``: :mod:`vlret.run.config_sections`), each loss's parameters
(:func:`vlret.losses.params.param` is this declaration with the loss's argument order, and the
loss's record checks itself with the :mod:`vlret._checks` constraints) and the training
procedures' options (:mod:`vlret.train.procedures.options`, NCR's
:class:`~vlret.train.procedures.ncr.options.NCROptions`).

A constraint (``Setting.spec``) is a :mod:`vlret._checks` spec (``Number``, ``Flag``,
``Choice``) or one of the config-side specs here: :class:`Range` (a ``Number`` with its own
words, or a bound alone where the annotation types the value), :class:`OneOf`,
:class:`Items`, :class:`Text` and :class:`Checked`. A spec that says the type in its words
(``typed``) checks the value alone; otherwise the field's annotation types the value first
(``expected an integer, got 'x'``) and the spec checks what is left. ``sane`` bounds a count
far above any real run, so a value that would never let the run start is refused when the
config is read.

Two wordings, one constraint: a loss's record checks itself when it is built (in code as in a
config), so its :mod:`vlret._checks` spec speaks of the argument (``margin must be >= 0, got
-1``, a :class:`~vlret._checks.ParamError`); a record read here speaks of the config key
(:func:`spec_problem`: ``loss.margin`` is the loss's message under its key, ``train.epochs:
expected >= 1, got 0``, a :class:`SettingError`).
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from ._checks import Choice, Flag, Number, ParamSpec

_Record = TypeVar("_Record")

# ----------------------------------------------------------------------------- sane bounds
#
# Far above any real run: a value beyond one is a run that never ends or an allocation that
# fails when the model is built (vlret.run.config_checks reads the model sizes with them).

#: Epochs (and epoch counts) of a run.
MAX_EPOCHS = 100_000
#: Items of a batch (training, evaluation, a gradient-cache chunk).
MAX_BATCH = 2**20
#: Steps (per epoch, warm-up, logging and checkpoint periods).
MAX_STEPS = 10**9
#: Absolute value of a seed (seeds + epochs stay within torch's 64-bit seeds).
MAX_SEED = 2**62
#: DataLoader workers.
MAX_WORKERS = 1024
#: Captions per image or video.
MAX_CAPTIONS = 10_000


class SettingError(ValueError):
    """A value a declaration refuses: ``key`` is its dotted name (``train.batch_size``,
    ``train.procedure_options.hidden``, ``optim.decay_epochs[1]``), ``why`` what was expected
    and what was given; the message is ``"<key>: <why>"``."""

    def __init__(self, key: str, why: str) -> None:
        super().__init__(f"{key}: {why}" if key else why)
        self.key = key
        self.why = why


# ----------------------------------------------------------------------------- the specs


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


@dataclass(frozen=True)
class Range(Number):
    """A :class:`~vlret._checks.Number` with a config file's words.

    Attributes:
        words: What is expected, said instead of the default (``"a fraction in [0, 1]"``).
        typed: ``True``: the spec checks the type and says it with the range (``expected an
            integer >= 1, got 1.5``); ``False``: the field's annotation types the value first
            and a value out of range is told the bound it broke (``expected >= 0, got -1``).
    """

    words: str | None = None
    typed: bool = True

    def phrase(self) -> str:
        """What is expected, in a config file's words."""
        if self.words is not None:
            return self.words
        noun = "integer" if self.integer else "number"
        positive = self.gt == 0 and self.ge is None and self.lt is None and self.le is None
        if positive:
            return f"a positive {noun}"
        if not self.typed:
            return self.range_text()
        return f"{'an integer' if self.integer else 'a number'} {self.range_text()}".rstrip()


@dataclass(frozen=True)
class OneOf(Choice):
    """A :class:`~vlret._checks.Choice` with its own words (``"true or false, or one of bf16,
    fp16"``); without them ``one of a, b, c``."""

    words: str | None = None


@dataclass(frozen=True)
class Items:
    """A list whose items each meet ``item`` (and, with ``length``, that many of them); the
    annotation types the list first unless ``typed``. ``words`` says what is expected of the
    whole list (``"two numbers in [0, 1)"``); the value shown is the whole list."""

    item: ParamSpec
    length: int | None = None
    words: str | None = None
    typed: bool = False


@dataclass(frozen=True)
class Text:
    """A string that is not empty (or only spaces): ``what`` names what it should be
    (``"a .npy noise index"``); the annotation types it."""

    what: str
    typed: bool = False


@dataclass(frozen=True)
class Checked:
    """A value another module's check accepts: ``check(value)`` raises ``ValueError`` whose
    message is the error (a device name, a timeout); the annotation types it first."""

    check_value: Callable[[Any], Any]
    typed: bool = False


def spec_problem(spec: Any, value: Any, reason: str = "") -> str | None:
    """What ``spec`` refuses in ``value``, in a config file's words (``expected ..., got
    ...``), or ``None``. ``reason``: why the bound, said after what is expected."""
    why = f" ({reason})" if reason else ""
    if isinstance(spec, Range) and not spec.typed:
        if not _is_number(value) or _in_range(spec, value):
            return None  # a wrong type: the annotation said what is expected
        return f"expected {spec.phrase()}{why}, got {value!r}"
    if isinstance(spec, Number):
        words = (spec if isinstance(spec, Range) else _as_range(spec)).phrase()
        if spec.integer:
            ok = isinstance(value, int) and not isinstance(value, bool)
        else:
            ok = _is_number(value) and math.isfinite(value)
        if not ok or not _in_range(spec, value):
            return f"expected {words}{why}, got {value!r}"
        return None
    if isinstance(spec, Flag):
        return None if isinstance(value, bool) else f"expected true or false, got {value!r}"
    if isinstance(spec, Choice):
        if any(value == o and type(value) is type(o) for o in spec.options):
            return None
        words = getattr(spec, "words", None) or "one of " + ", ".join(map(str, spec.options))
        return f"expected {words}{why}, got {value!r}"
    if isinstance(spec, Items):
        bad = not isinstance(value, list | tuple)
        bad = bad or (spec.length is not None and len(value) != spec.length)
        if not bad and spec.words is not None:
            bad = any(spec_problem(spec.item, v) is not None for v in value)
        if bad:
            return f"expected {spec.words or 'a list'}{why}, got {value!r}"
        for i, v in enumerate(value):
            if (problem := spec_problem(spec.item, v, reason)) is not None:
                return f"[{i}]: {problem}"
        return None
    if isinstance(spec, Text):
        if isinstance(value, str) and not value.strip():
            return f"empty; expected {spec.what}"
        return None
    if isinstance(spec, Checked):
        try:
            spec.check_value(value)
        except ValueError as err:
            return str(err)
        return None
    return None


def _as_range(spec: Number) -> Range:
    return Range(spec.gt, spec.ge, spec.lt, spec.le, spec.integer, spec.optional)


def _in_range(spec: Number, value: Any) -> bool:
    return (
        (spec.gt is None or value > spec.gt)
        and (spec.ge is None or value >= spec.ge)
        and (spec.lt is None or value < spec.lt)
        and (spec.le is None or value <= spec.le)
    )


def spec_text(spec: Any) -> str:
    """A constraint in words for the key reference (``>= 1``, ``one of `a`, `b```)."""
    if isinstance(spec, Range):
        return spec.phrase()
    if isinstance(spec, Number):
        return spec.expected()
    if isinstance(spec, Flag):
        return "true or false"
    if isinstance(spec, OneOf) and spec.words is not None:
        return spec.words
    if isinstance(spec, Choice):
        return "one of " + ", ".join(f"`{o}`" for o in spec.options)
    if isinstance(spec, Items):
        return spec.words or f"a list of {spec_text(spec.item)}"
    if isinstance(spec, Text):
        return "not empty"
    return ""


# ----------------------------------------------------------------------------- the declaration


@dataclass(frozen=True)
class Setting:
    """What a :func:`setting` field declares besides its default.

    Attributes:
        doc: One line (or a few sentences) saying what the key does.
        spec: The constraint its values meet (module docstring); ``None``: the annotation's
            type only, or (a loss parameter) an object the record checks itself.
        reason: Why the constraint, said in its error and in the key reference.
        sane: ``(lowest, highest)`` of an integer (or of each item of a list of them), far
            beyond any real run (``expected an integer in [1, 100000], got ...``).
        constraint: What other code checks, in words (a relation to another key).
        config: Settable from a config file (``False``: an object built by the harness).
        passed: A loss parameter handed to the family's dense and tiled functions
            (:meth:`vlret.losses.params.LossParams.arguments`; ``False`` for module-only
            settings such as a learnable temperature's switch).
    """

    doc: str
    spec: Any = None
    reason: str = ""
    sane: tuple[int, int] | None = None
    constraint: str = ""
    config: bool = True
    passed: bool = True

    @property
    def choices(self) -> tuple[Any, ...] | None:
        """The values a :class:`~vlret._checks.Choice` spec allows (else ``None``)."""
        return self.spec.options if isinstance(self.spec, Choice) else None

    @property
    def at_least(self) -> float | None:
        """The lower bound of a :class:`~vlret._checks.Number` spec (else ``None``)."""
        return self.spec.ge if isinstance(self.spec, Number) else None

    def constraint_text(self) -> str:
        """The constraint in words: the spec's (with its reason), then the rest."""
        parts = []
        if text := spec_text(self.spec):
            parts.append(text + (f" ({self.reason})" if self.reason else ""))
        if self.constraint:
            parts.append(self.constraint)
        return "; ".join(parts)


def setting(
    default: Any = dataclasses.MISSING,
    doc: str = "",
    *,
    factory: Any = dataclasses.MISSING,
    spec: Any = None,
    choices: tuple[Any, ...] | None = None,
    at_least: float | None = None,
    reason: str = "",
    sane: tuple[int, int] | None = None,
    constraint: str = "",
    config: bool = True,
    passed: bool = True,
) -> Any:
    """A declared field: its default (or ``factory`` for a list or table; neither: a required
    key) and its :class:`Setting`. ``choices`` is short for ``spec=OneOf(choices)``;
    ``at_least`` for a lower bound on a value the annotation types (``Range(ge=at_least,
    typed=False)``)."""
    if choices is not None:
        spec = OneOf(tuple(choices))
    elif at_least is not None:
        spec = Range(ge=at_least, typed=False)
    declared = Setting(doc, spec, reason, sane, constraint, config, passed)
    if factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=factory, metadata={"vlret": declared})
    return dataclasses.field(default=default, metadata={"vlret": declared})


def info(f: dataclasses.Field) -> Setting:
    """The :class:`Setting` of a declared field."""
    return f.metadata["vlret"]


def declared(cls: type) -> Iterator[tuple[dataclasses.Field, Setting]]:
    """The fields of a declared record with their declarations, in file order."""
    for f in dataclasses.fields(cls):
        if isinstance(f.metadata.get("vlret"), Setting):
            yield f, info(f)


def default_of(f: dataclasses.Field) -> Any:
    """A field's default (a fresh one from its factory); ``dataclasses.MISSING``: required."""
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


def defaults(cls: type) -> dict[str, Any]:
    """Every declared key of ``cls`` with its default (``...`` for a required one)."""
    out = {}
    for f, _ in declared(cls):
        value = default_of(f)
        out[f.name] = ... if value is dataclasses.MISSING else value
    return out


# ----------------------------------------------------------------------------- reading records


def typed(value: Any, annotation: Any, key: str) -> Any:
    """``value`` checked against a field's annotation in a config file's types (a union tries
    each member, a list each item; an integer is a number and comes back as a float where a
    float is declared); a :class:`SettingError` naming ``key`` otherwise."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(annotation)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return typed(value, arg, key)
            except SettingError as err:
                errors.append(err)
        raise errors[0]
    if origin in (list, tuple):
        item = typing.get_args(annotation)[0]
        if not isinstance(value, list | tuple):
            raise SettingError(key, f"expected a list, got {value!r}")
        items = [typed(v, item, f"{key}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict or annotation is dict:
        if not isinstance(value, dict):
            raise SettingError(key, f"expected a table/mapping, got {value!r}")
        return value
    expected = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}
    if annotation in expected:
        ok = isinstance(value, bool) if annotation is bool else not isinstance(value, bool)
        ok = ok and isinstance(value, (int, float) if annotation is float else annotation)
        if not ok:
            raise SettingError(key, f"expected {expected[annotation]}, got {value!r}")
        return float(value) if annotation is float else value
    return value


def check_value(f: dataclasses.Field, annotation: Any, value: Any, key: str) -> Any:
    """One declared value checked (:func:`typed` by the annotation unless the spec says the
    type, then the spec, then the sane range) and returned as the record holds it (a float
    where a float is declared, a tuple where a tuple is)."""
    declared_ = info(f)
    spec = declared_.spec
    if value is None and _admits_none(annotation):
        return None
    if spec is None or not _says_type(spec):
        value = typed(value, annotation, key)
    if (problem := spec_problem(spec, value, declared_.reason)) is not None:
        sub, _, why = problem.partition(": ") if problem.startswith("[") else ("", "", problem)
        raise SettingError(key + sub, why)
    if declared_.sane is not None:
        low, high = declared_.sane
        for i, v in enumerate(value if isinstance(value, list) else [value]):
            if not low <= v <= high:
                where = f"{key}[{i}]" if isinstance(value, list) else key
                raise SettingError(where, f"expected an integer in [{low}, {high}], got {v!r}")
    if isinstance(spec, Number) and _says_type(spec) and not spec.integer and _is_number(value):
        return float(value)  # a typed number spec reads an integer as a float
    if typing.get_origin(annotation) is tuple and isinstance(value, list):
        return tuple(value)
    return value


def _says_type(spec: Any) -> bool:
    """Whether ``spec`` checks the value's type itself (the :mod:`vlret._checks` specs do)."""
    return bool(getattr(spec, "typed", True))


def _admits_none(annotation: Any) -> bool:
    return annotation is type(None) or (
        typing.get_origin(annotation) in (typing.Union, types.UnionType)
        and type(None) in typing.get_args(annotation)
    )


def build(
    cls: type[_Record],
    raw: Any,
    *,
    where: str,
    unknown: str | None = None,
) -> _Record:
    """The declared record ``cls`` read from the mapping ``raw`` (a config file's table),
    defaults filled in.

    Args:
        cls: A dataclass of :func:`setting` fields.
        raw: The table as read.
        where: Its dotted name (``train``, ``train.procedure_options``), the prefix of every
            key an error names.
        unknown: What an unknown key is called, before the list of the known ones (default
            ``"unknown key; known"``).

    Raises:
        SettingError: ``raw`` is no mapping, a key is unknown (the message lists the known
            ones), a required key is missing, or a value is refused by its declaration.
    """
    if not isinstance(raw, Mapping):
        raise SettingError(where, f"expected a table/mapping, got {raw!r}")
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    strange = [k for k in raw if k not in fields]
    if strange:
        known = ", ".join(fields)
        raise SettingError(f"{where}.{strange[0]}", f"{unknown or 'unknown key; known'}: {known}")
    hints = typing.get_type_hints(cls)
    values = {}
    for name, f in fields.items():
        key = f"{where}.{name}"
        if name not in raw:
            if default_of(f) is dataclasses.MISSING:
                raise SettingError(key, "required key is missing")
            continue
        values[name] = check_value(f, hints[name], raw[name], key)
    return cls(**values)


def check_values(record: Any, *, where: str) -> None:
    """Every declared value of a built ``record`` checked against its declaration (what
    :func:`build` checks, for a record made or changed in code)."""
    hints = typing.get_type_hints(type(record))
    for f, _ in declared(type(record)):
        check_value(f, hints[f.name], getattr(record, f.name), f"{where}.{f.name}")


__all__ = [
    "MAX_BATCH",
    "MAX_CAPTIONS",
    "MAX_EPOCHS",
    "MAX_SEED",
    "MAX_STEPS",
    "MAX_WORKERS",
    "Checked",
    "Items",
    "OneOf",
    "Range",
    "Setting",
    "SettingError",
    "Text",
    "build",
    "check_value",
    "check_values",
    "declared",
    "default_of",
    "defaults",
    "info",
    "setting",
    "spec_problem",
    "spec_text",
    "typed",
]
