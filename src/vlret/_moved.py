"""Deprecated names, one mechanism for the package: a module's ``__getattr__`` that warns on
each access (:class:`DeprecationWarning`, ``"<module>.<name> is deprecated; ..."`` naming what
replaces it) and returns the value. :func:`moved_names` serves a name that moved to another
module (the same object); :func:`renamed_names` one whose replacement is another name or a
computed value (``GoalConfig`` -> ``GoalParams``, ``PROTOCOLS`` -> ``protocol_names()``).

The new module is imported when the old name is asked for, so an old path costs nothing until
it is used and a deprecated path in a lower layer does not import a higher one at import time.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable, Mapping
from typing import Any


def moved_names(module: str, moved: Mapping[str, str]) -> Callable[[str], Any]:
    """A module-level ``__getattr__`` for ``module``'s names that moved.

    Args:
        module: The old module's name (``__name__``).
        moved: Old name -> ``"new.module"`` (same name there) or ``"new.module:new_name"``.

    Returns:
        The ``__getattr__``: a moved name warns and is returned from its new place; any other
        name raises :class:`AttributeError` as a module does.
    """

    def __getattr__(name: str) -> Any:
        if name not in moved:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        target, _, new_name = moved[name].partition(":")
        new_name = new_name or name
        warnings.warn(
            f"{module}.{name} is deprecated; import {new_name} from {target}",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(importlib.import_module(target), new_name)

    return __getattr__


def renamed_names(
    module: str, renamed: Mapping[str, tuple[str, Callable[[], Any]]]
) -> Callable[[str], Any]:
    """A module-level ``__getattr__`` for ``module``'s names that were renamed or replaced.

    Args:
        module: The old module's name (``__name__``).
        renamed: Old name -> (the replacement as the message names it, a function returning
            the value to serve).

    Returns:
        The ``__getattr__``; any other name raises :class:`AttributeError` as a module does.
    """

    def __getattr__(name: str) -> Any:
        if name not in renamed:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        new, value = renamed[name]
        warnings.warn(f"{module}.{name} is deprecated; use {new}", DeprecationWarning, stacklevel=2)
        return value()

    return __getattr__


__all__ = ["moved_names", "renamed_names"]
