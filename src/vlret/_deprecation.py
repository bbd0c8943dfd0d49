"""The mechanism behind each package's ``deprecated`` module.

A name that 0.1.0 exported and that has since moved or been renamed stays importable for a
while, and only from the package that exported it: the package's ``deprecated`` module
(:mod:`vlret.losses.deprecated`, :mod:`vlret.train.deprecated`) lists each such name as an
:class:`OldName` (where 0.1.0 exported it, what replaces it, the version that removes it), and
the package's ``__getattr__`` is :func:`module_getattr` over that list. Asking for an old name
warns (:class:`DeprecationWarning`, ``"<module>.<name> is deprecated and will be removed in
<version>; use <replacement>"``) and returns the value; any other unknown name is an
:class:`AttributeError`, as for a module without ``__getattr__``.

The value is looked up by name when the old name is asked for (``"vlret.run:TrainConfig"``),
so the ``deprecated`` module imports nothing of the package at import time and no import cycle
or upward import appears for the import contracts.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, kw_only=True)
class OldName:
    """A name 0.1.0 exported that has moved or been renamed since.

    Attributes:
        module: The module that exported it in 0.1.0 (``"vlret.train"``).
        name: Its name there (``"TrainConfig"``).
        replacement: What to use instead, as the warning names it (``"vlret.run.TrainConfig"``).
        removed_in: The version that removes the old name (``"0.3.0"``).
        target: Where the value is now, ``"module:attribute"``; or ``None`` when ``compute``
            builds it.
        compute: Builds the value when the old name was a table the new API computes
            (``GOAL_PARAMS`` -> ``GoalParams.specs()``); ``None`` when ``target`` is given.
    """

    module: str
    name: str
    replacement: str
    removed_in: str
    target: str | None = None
    compute: Callable[[], Any] | None = None

    def __post_init__(self) -> None:
        if (self.target is None) == (self.compute is None):
            raise ValueError(f"{self.module}.{self.name}: give exactly one of target and compute")
        if self.target is not None and ":" not in self.target:
            raise ValueError(
                f"{self.module}.{self.name}: target must read 'module:attribute', "
                f"got {self.target!r}"
            )

    @property
    def message(self) -> str:
        """The warning an access gives."""
        return (
            f"{self.module}.{self.name} is deprecated and will be removed in "
            f"{self.removed_in}; use {self.replacement}"
        )

    def value(self) -> Any:
        """The value the old name serves now (its replacement's object or computed value)."""
        if self.compute is not None:
            return self.compute()
        assert self.target is not None  # __post_init__: exactly one of the two
        module, _, attribute = self.target.partition(":")
        return getattr(importlib.import_module(module), attribute)


def module_getattr(module: str, old_names: Sequence[OldName]) -> Callable[[str], Any]:
    """The ``__getattr__`` of ``module`` serving its entries of ``old_names``.

    Args:
        module: The package's name (``__name__``).
        old_names: The package's deprecation list; the entries of other modules are ignored
            (one list serves a package and its sub-packages).

    Returns:
        The module-level ``__getattr__``: an old name of ``module`` warns and returns its
        value; any other name raises :class:`AttributeError`.
    """
    served = {old.name: old for old in old_names if old.module == module}

    def __getattr__(name: str) -> Any:
        old = served.get(name)
        if old is None:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        warnings.warn(old.message, DeprecationWarning, stacklevel=2)
        return old.value()

    return __getattr__


__all__ = ["OldName", "module_getattr"]
