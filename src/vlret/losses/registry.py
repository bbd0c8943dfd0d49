"""Loss registry: ``build_loss(name, **params)``, ``available_losses()``,
``check_loss_params(name, params)`` and ``loss_capabilities(name, params)``.

Loss families register themselves with :func:`register_loss`; ``vlret.losses`` imports every
public module of the package, so a new family file needs no other edit. A name that joins
registered names with ``+`` (``"sdm+id"``) is a weighted combination of those losses, built by
the combiner :mod:`vlret.losses.combined` registers with :func:`register_combiner`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from torch import nn

if TYPE_CHECKING:
    from ._base import PairLoss

_REGISTRY: dict[str, type[PairLoss]] = {}
_Loss = TypeVar("_Loss", bound="type[PairLoss]")
#: Builds the class of a ``"a+b"`` name (set by :mod:`vlret.losses.combined`).
_COMBINER: list[Callable[[str], type[PairLoss]]] = []


def register_combiner(combiner: Callable[[str], type[PairLoss]]) -> None:
    """Set the function that turns a name joining registered losses with ``+`` into the class
    of their weighted combination (:func:`vlret.losses.combined.combined_class`)."""
    _COMBINER[:] = [combiner]


def register_loss(name: str) -> Callable[[_Loss], _Loss]:
    """Class decorator registering a loss module under ``name``.

    Args:
        name: The name configs and :func:`build_loss` use.

    Returns:
        The decorator; it sets ``cls.registry_name``.

    Raises:
        ValueError: ``name`` is already registered to another class.
    """

    def decorator(cls: _Loss) -> _Loss:
        if name in _REGISTRY and _REGISTRY[name] is not cls:
            raise ValueError(f"loss name {name!r} is already registered to {_REGISTRY[name]}")
        _REGISTRY[name] = cls
        cls.registry_name = name
        return cls

    return decorator


def available_losses() -> list[str]:
    """Sorted names accepted by :func:`build_loss`."""
    return sorted(_REGISTRY)


def loss_class(name: str) -> type[PairLoss]:
    """The class registered as ``name``, or for ``"a+b"`` the class of the weighted
    combination of the registered losses ``a`` and ``b`` (:mod:`vlret.losses.combined`).

    Raises:
        ValueError: ``name`` is not registered (nor a combination of registered names); the
            message lists the registered names.
    """
    if isinstance(name, str) and "+" in name and _COMBINER:
        return _COMBINER[0](name)
    if name not in _REGISTRY:
        raise ValueError(
            f"unknown loss {name!r}; available losses: {', '.join(available_losses())}"
        )
    return _REGISTRY[name]


def loss_parameters(name: str) -> dict[str, Any]:
    """Constructor parameters of a registered loss and their defaults (its declaration,
    ``Params.defaults()``).

    Raises:
        ValueError: ``name`` is not registered.
    """
    return loss_class(name).Params.defaults()


def check_loss_params(name: str, params: Mapping[str, Any]) -> None:
    """Check ``params`` for the registered loss ``name`` without building it.

    The values are checked by building the loss's parameter record (``Params``, see
    :mod:`vlret.losses.params`): each against its declared constraint, then the relations
    between them with the defaults filled in; nothing else is built (no semantic model, no
    memory queue). An old parameter name the declaration renamed is accepted with a
    DeprecationWarning.

    Args:
        name: A registered loss name.
        params: Constructor parameters as configured.

    Raises:
        ValueError: ``name`` is not registered.
        vlret._checks.ParamError: A parameter is unknown or outside its constraint; its
            ``param`` names it (``base_params.margin`` for a nested one) and the message
            reads ``"<param> must be <expected>, got <value>"``.
    """
    loss_class(name).check_params(params)


def build_loss(name: str, **params: Any) -> PairLoss:
    """Instantiate the registered loss ``name`` with keyword ``params``.

    Args:
        name: A registered loss name, or registered names joined by ``+`` (``"sdm+id"``: the
            weighted sum of the parts, :class:`vlret.losses.combined.CombinedLoss`).
        **params: Its constructor parameters (a combination: ``weights`` and one dict of
            parameters per part, keyed by the part's name).

    Returns:
        The loss module.

    Raises:
        ValueError: An unknown name or parameter (the message lists the valid ones), or a
            parameter outside its declared constraint (named).
    """
    return loss_class(name)(**params)


def loss_capabilities(loss: str | nn.Module, params: Mapping[str, Any] | None = None):
    """What the loss ``loss`` needs and offers (:class:`~vlret.losses.LossCapabilities`).

    Args:
        loss: A registered loss name, or a built loss module (its capabilities as built).
        params: With a name, the constructor parameters as configured (defaults may be
            omitted); some capabilities depend on them (AdaCL's queue, VSL's base).

    Returns:
        The loss's ``LossCapabilities``; a module that is no ``PairLoss`` has the defaults.

    Raises:
        ValueError: ``loss`` is not a registered name.
    """
    from ._base import LossCapabilities

    if isinstance(loss, str):
        return loss_class(loss).capabilities(dict(params or {}))
    current = getattr(type(loss), "current_capabilities", None)
    return LossCapabilities() if current is None else current(loss)


def compared_losses() -> list[str]:
    """The papers' losses ``vlret compare`` runs by default, in their declared order."""
    ranked = [(loss_capabilities(name).paper_comparison, name) for name in available_losses()]
    return [name for rank, name in sorted(r for r in ranked if r[0] is not None)]
