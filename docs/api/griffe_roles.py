"""Griffe extension for the API site: Sphinx roles in docstrings rendered as inline code.

Docstrings cite other objects as ``:class:`~vlret.losses.UnifiedLoss``` (the Sphinx form that
editors and ``help()`` readers know). Markdown has no roles, so this extension rewrites each
role into inline code before mkdocstrings renders the docstring: ``~a.b.C`` becomes ``C``,
``a.b.C`` stays whole. Links are not made: a moved object would break them, and the names stay
searchable.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:py:)?(?:mod|class|func|meth|attr|data|exc|obj|const):`(~?)([^`]+)`")


def _as_code(match: re.Match[str]) -> str:
    short, target = match.group(1), match.group(2).strip()
    if short:
        target = target.rsplit(".", 1)[-1]
    return f"`{target}`"


class SphinxRolesAsCode(griffe.Extension):
    """Rewrite Sphinx cross-reference roles into Markdown inline code in every docstring."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = _ROLE.sub(_as_code, obj.docstring.value)
