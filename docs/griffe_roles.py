"""Sphinx cross-reference roles in docstrings, shown as inline code on the docs site.

The docstrings name other objects Sphinx's way (``:class:`StepStore```,
``:meth:`~rlreplay.Client.flush```); mkdocstrings would print the role as text. This
griffe extension rewrites each role to its target in backticks, the last dotted part only
when the target starts with ``~`` (as Sphinx shows it). Loaded by ``mkdocs.yml``.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(?:class|meth|func|mod|data|attr|exc|obj|const):`(~?)([^`]+)`")


def plain(text: str) -> str:
    """``text`` with every role replaced by its target as inline code."""

    def target(match: re.Match) -> str:
        short, name = match.groups()
        if short:
            name = name.rsplit(".", 1)[-1]
        return f"`{name}`"

    return ROLE.sub(target, text)


class SphinxRoles(griffe.Extension):
    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = plain(obj.docstring.value)
