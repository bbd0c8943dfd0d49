"""Deprecated: ``vlret synth`` and ``vlret convert-experts`` are :mod:`vlret.cli.synth` and
:mod:`vlret.cli.convert_experts` (one module per command in :mod:`vlret.cli`)."""

from __future__ import annotations

from .._moved import moved_names

__getattr__ = moved_names(
    __name__,
    {
        "add_convert_parser": "vlret.cli.convert_experts:add_parser",
        "add_synth_parser": "vlret.cli.synth:add_parser",
    },
)
