"""Loss registry: ``build_loss(name, **params)`` and ``available_losses()``.

Later loss families register themselves with :func:`register_loss`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from torch import nn

_REGISTRY: dict[str, type[nn.Module]] = {}


def register_loss(name: str) -> Callable[[type[nn.Module]], type[nn.Module]]:
    """Class decorator registering a loss module under ``name``."""

    def decorator(cls: type[nn.Module]) -> type[nn.Module]:
        if name in _REGISTRY and _REGISTRY[name] is not cls:
            raise ValueError(f"loss name {name!r} is already registered to {_REGISTRY[name]}")
        _REGISTRY[name] = cls
        cls.registry_name = name
        return cls

    return decorator


def available_losses() -> list[str]:
    """Sorted names accepted by :func:`build_loss`."""
    return sorted(_REGISTRY)


def loss_class(name: str) -> type[nn.Module]:
    if name not in _REGISTRY:
        raise ValueError(
            f"unknown loss {name!r}; available losses: {', '.join(available_losses())}"
        )
    return _REGISTRY[name]


def loss_parameters(name: str) -> dict[str, Any]:
    """Constructor parameters of a registered loss and their defaults."""
    sig = inspect.signature(loss_class(name).__init__)
    return {
        p.name: p.default
        for p in sig.parameters.values()
        if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    }


def build_loss(name: str, **params: Any) -> nn.Module:
    """Instantiate the registered loss ``name`` with keyword ``params``.

    Raises ``ValueError`` listing the valid names or parameters when either is unknown.
    """
    cls = loss_class(name)
    valid = loss_parameters(name)
    unknown = sorted(set(params) - set(valid))
    if unknown:
        listing = ", ".join(f"{k}={v!r}" for k, v in valid.items())
        raise ValueError(
            f"unknown parameter(s) {', '.join(unknown)} for loss {name!r}; valid: {listing}"
        )
    return cls(**params)
