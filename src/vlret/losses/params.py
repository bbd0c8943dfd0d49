"""One declaration of a loss family's parameters: a frozen dataclass of :func:`param` fields.

Each field carries its default, its constraint (``vlret._checks``: ``Number``, ``Flag``,
``Choice``) and a one-line description: :func:`param` is the one declaration of every setting
(:func:`vlret._settings.setting`, which also declares the run config's sections and the
training procedures' options) in a loss's words. The declaration is the one source the rest
reads:

* the module constructor (``PairLoss.__init__`` builds the record, stored as ``loss.config``,
  and the class's signature is generated from it),
* the registry (``build_loss``, ``loss_parameters``, ``check_loss_params``: building the record
  checks a config's values without building the loss),
* config validation (``vlret.run.config``: errors keyed ``loss.<param>``),
* ``repr`` (:meth:`LossParams.describe`) and ``vlret losses``,
* the dense and tiled entry points (:meth:`LossParams.arguments`, the fields handed to them).

Example (a complete family is shown in ``docs/losses.md``, "Adding a loss")::

    @dataclass(frozen=True, kw_only=True)
    class TripletParams(TiledLossParams):
        margin: float = param(0.2, MARGIN, "the hinge margin m")
        hardest: bool = param(True, FLAG, "hardest negative (VSE++) or the sum over all (VSE0)")
        reduction: str = reduction_param("sum")
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from .._checks import CHUNK_SIZE, FLAG, REDUCTION, Number, ParamError, ParamSpec
from .._settings import Setting, info, setting
from .deprecated import REMOVED_IN

#: The parameters every loss has, handled by ``PairLoss`` rather than by a family's functions.
COMMON = ("reduction", "normalize", "chunk_size")

_Params = TypeVar("_Params", bound="LossParams")


def param(
    default: Any,
    spec: ParamSpec | None,
    doc: str,
    *,
    passed: bool = True,
    config: bool = True,
) -> Any:
    """A field of a :class:`LossParams` declaration: :func:`vlret._settings.setting` with the
    constraint first, as every family writes it.

    Args:
        default: The family's default.
        spec: The constraint its values meet (``None``: an object checked by the family's
            :meth:`LossParams.check_relations`).
        doc: One line saying what it is.
        passed: Handed to the family's dense and tiled functions by
            :meth:`LossParams.arguments` (``False`` for module-only settings such as a
            learnable temperature's switch).
        config: Settable from a config file (``False`` for objects built by the harness).
    """
    return setting(default, doc, spec=spec, passed=passed, config=config)


def reduction_param(default: str) -> Any:
    """The ``reduction`` field with a family's own default."""
    return param(
        default, REDUCTION, '"mean", "sum" or "none" over the B per-index terms', passed=False
    )


def normalize_param(default: bool) -> Any:
    """The ``normalize`` field with a family's own default."""
    return param(
        default, FLAG, "L2-normalise the embeddings (False: raw dot products)", passed=False
    )


@dataclass(frozen=True, kw_only=True)
class LossParams:
    """Base of every family's parameter declaration: the reduction and the normalisation.

    Building a record checks every field against its constraint (a :class:`ParamError` naming
    it), turns the non-integer numbers into floats, then checks the relations between fields
    (:meth:`check_relations`). Families with a tiled form derive from :class:`TiledLossParams`.
    """

    reduction: str = reduction_param("mean")
    normalize: bool = normalize_param(True)

    #: Old parameter names still accepted, each mapped to its new name with a DeprecationWarning
    #: (listed in :data:`vlret.losses.deprecated.OLD_PARAMETERS`).
    renamed: ClassVar[Mapping[str, str]] = {}

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            spec, value = info(f).spec, getattr(self, f.name)
            if spec is None:
                continue
            spec.check(value, f.name)
            if isinstance(spec, Number) and not spec.integer and value is not None:
                object.__setattr__(self, f.name, float(value))
        self.check_relations()

    def check_relations(self) -> None:
        """Constraints between fields (each already valid); raise :class:`ParamError`."""

    @classmethod
    def fields(cls) -> list[dataclasses.Field]:
        """The declared fields: the family's own first (the most derived class's first), then
        :data:`COMMON`'s."""
        return list(_ordered_fields(cls))

    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in cls.fields()]

    @classmethod
    def passed_names(cls) -> frozenset[str]:
        """The fields :meth:`arguments` hands to the family's functions."""
        return frozenset(f.name for f in cls.fields() if f.name not in COMMON and info(f).passed)

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        """Every parameter and its default, in :meth:`fields` order."""
        return {f.name: f.default for f in cls.fields()}

    @classmethod
    def specs(cls) -> dict[str, ParamSpec]:
        """The constraint of every parameter that declares one."""
        return {f.name: s for f in cls.fields() if (s := info(f).spec) is not None}

    @classmethod
    def family_specs(cls) -> dict[str, ParamSpec]:
        """:meth:`specs` of the family's own parameters, without :data:`COMMON` (what the old
        ``GOAL_PARAMS`` / ``ADACL_PARAMS`` tables held)."""
        return {k: v for k, v in cls.specs().items() if k not in COMMON}

    @classmethod
    def docs(cls) -> dict[str, str]:
        """The one-line description of every parameter."""
        return {f.name: info(f).doc for f in cls.fields()}

    @classmethod
    def canonical(cls, values: Mapping[str, Any]) -> dict[str, Any]:
        """``values`` with each old name of :attr:`renamed` replaced by its new name.

        Raises:
            ParamError: An old name given together with its new one.
        """
        out = dict(values)
        for old, new in cls.renamed.items():
            if old not in out:
                continue
            if new in out:
                raise ParamError(old, f"{old} is the old name of {new}; give {new} only")
            warnings.warn(
                f"loss parameter {old!r} is deprecated; it is now {new!r} (the old name is "
                f"removed in {REMOVED_IN}: vlret.losses.deprecated)",
                DeprecationWarning,
                stacklevel=3,
            )
            out[new] = out.pop(old)
        return out

    @classmethod
    def build(cls: type[_Params], values: Mapping[str, Any], *, owner: str) -> _Params:
        """The checked record of ``values`` (old names mapped, defaults filled in).

        Args:
            values: Parameters by name.
            owner: What is built, for the message of an unknown name (a loss's name).

        Raises:
            ParamError: An unknown parameter (the message lists the valid ones with their
                defaults), or one outside its constraint, named.
        """
        values = cls.canonical(values)
        valid = cls.defaults()
        unknown = sorted(set(values) - set(valid))
        if unknown:
            listing = ", ".join(f"{k}={v!r}" for k, v in valid.items())
            if unknown == ["chunk_size"]:
                raise ParamError(
                    "chunk_size",
                    f"chunk_size (a tile height) is not a parameter: {owner} has no tiled form; "
                    f"valid: {listing}",
                )
            raise ParamError(
                unknown[0],
                f"unknown parameter(s) {', '.join(unknown)} for {owner}; valid: {listing}",
            )
        return cls(**values)

    def arguments(self) -> dict[str, Any]:
        """The fields handed to the family's dense and tiled functions (``passed``)."""
        return {name: getattr(self, name) for name in _passed_names(type(self))}

    def describe(self, **current: Any) -> str:
        """``name=value, ...`` for ``repr``: the family's fields (``current`` replaces or adds
        values that change during training), then the reduction and a set tile height."""
        values = {f.name: getattr(self, f.name) for f in self.fields() if f.name not in COMMON}
        values.update(current)
        values["reduction"] = self.reduction
        tile = getattr(self, "chunk_size", None)
        if tile is not None:
            values["chunk_size"] = tile
        return ", ".join(f"{k}={_shown(v)}" for k, v in values.items())


def _shown(value: Any) -> str:
    if isinstance(value, str):
        return repr(value)
    if isinstance(value, float):
        return f"{value:g}"
    if hasattr(value, "registry_name"):
        return type(value).__name__
    return str(value)


# A declaration is fixed once its class exists; a loss reads these on every forward, where
# dataclasses.fields() and the MRO walk cost as much as a small tiled step's Python (B=128).
_FIELDS: dict[type, tuple[dataclasses.Field, ...]] = {}
_PASSED: dict[type, tuple[str, ...]] = {}


def _ordered_fields(cls: type[LossParams]) -> tuple[dataclasses.Field, ...]:
    cached = _FIELDS.get(cls)
    if cached is None:
        by_name = {f.name: f for f in dataclasses.fields(cls)}
        order = [n for k in cls.__mro__ for n in vars(k).get("__annotations__", {})]
        own = [n for n in dict.fromkeys(order) if n in by_name and n not in COMMON]
        cached = tuple([by_name[n] for n in own] + [by_name[n] for n in COMMON if n in by_name])
        _FIELDS[cls] = cached
    return cached


def _passed_names(cls: type[LossParams]) -> tuple[str, ...]:
    cached = _PASSED.get(cls)
    if cached is None:
        fields = _ordered_fields(cls)
        cached = tuple(f.name for f in fields if f.name not in COMMON and info(f).passed)
        _PASSED[cls] = cached
    return cached


@dataclass(frozen=True, kw_only=True)
class TiledLossParams(LossParams):
    """A family with a tiled form: ``chunk_size`` is its tile height (``docs/tiled.md``)."""

    chunk_size: int | None = param(
        None, CHUNK_SIZE, "tile height of the tiled form (None: the dense form)", passed=False
    )


__all__ = [
    "COMMON",
    "LossParams",
    "Setting",
    "TiledLossParams",
    "info",
    "normalize_param",
    "param",
    "reduction_param",
]
