"""Evaluation protocols: one frozen :class:`EvalProtocol` record each, in a registry.

Every module of this package registers the protocols of one family when it is imported, and
importing the package imports them all (in name order), so a new protocol is one new module
here (and its test). Each protocol is run as a task (:mod:`vlret.eval.tasks`: retrieval, or
its own task module such as zero-shot classification's); ``vlret eval --protocol`` and
``vlret protocols`` read the task registry, which reads this one.
"""

import importlib
import pkgutil

from .registry import (
    IDENTITY_METRICS,
    RELEVANCE_KINDS,
    RETRIEVAL_METRICS,
    EvalProtocol,
    default_protocol,
    eval_splits,
    get_protocol,
    protocol_names,
    register_protocol,
)

# the order of the built-in protocols (registration order), as `vlret eval --help` lists them
for _name in ("flickr", "coco", "msrvtt"):
    importlib.import_module(f"{__name__}.{_name}")
for _module in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
    if _module.name != "registry" and not _module.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_module.name}")

__all__ = [
    "IDENTITY_METRICS",
    "RELEVANCE_KINDS",
    "RETRIEVAL_METRICS",
    "EvalProtocol",
    "default_protocol",
    "eval_splits",
    "get_protocol",
    "protocol_names",
    "register_protocol",
]
