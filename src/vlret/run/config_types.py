"""Typing a raw run-config value by its dataclass field's annotation (:mod:`vlret.run.config`
builds each section with it): every value has the type the annotation says, in the types a
config file holds (strings, numbers, true/false, lists and tables). Each refusal is one
:class:`~vlret.run.config_files.ConfigError` naming the key."""

from __future__ import annotations

import types
import typing
from typing import Any

from .config_files import ConfigError


def check_type(value: Any, annotation: Any, source: str, key: str) -> Any:
    """``value`` checked against the field annotation ``annotation`` (a union tries each
    member, a list each item; an integer is a number); a :class:`ConfigError` naming ``key``
    otherwise. A float field's integer comes back as a float."""
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
                return check_type(value, arg, source, key)
            except ConfigError as err:
                errors.append(err)
        raise errors[0]
    if origin is list:
        (item,) = typing.get_args(annotation)
        if not isinstance(value, (list, tuple)):
            raise ConfigError(source, key, f"expected a list, got {value!r}")
        return [check_type(v, item, source, f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is dict or annotation is dict:
        if not isinstance(value, dict):
            raise ConfigError(source, key, f"expected a table/mapping, got {value!r}")
        return value
    if annotation is bool:
        if not isinstance(value, bool):
            raise ConfigError(source, key, f"expected true or false, got {value!r}")
        return value
    if annotation is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(source, key, f"expected an integer, got {value!r}")
        return value
    if annotation is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(source, key, f"expected a number, got {value!r}")
        return float(value)
    if annotation is str:
        if not isinstance(value, str):
            raise ConfigError(source, key, f"expected a string, got {value!r}")
        return value
    return value


__all__ = ["check_type"]
