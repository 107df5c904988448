"""A griffe extension for the API reference: Sphinx roles in docstrings become code spans.

hcclpy's docstrings are numpydoc and name other objects with Sphinx roles (``:class:`Stream```,
``:func:`~hcclpy.init```). Markdown has no such roles, so before mkdocstrings renders a docstring
this extension rewrites each role to inline code holding the name (``~`` keeps the last part only,
as in Sphinx). Only the rendering changes; the source docstrings stay as they are.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:py:)?(?:mod|class|func|meth|attr|data|exc|obj|const):`(~?)([^`<]+?)(?:\s*<([^>]+)>)?`")


def _replace(match: "re.Match[str]") -> str:
    tilde, text, target = match.group(1), match.group(2).strip(), match.group(3)
    if target is not None:  # :role:`title <target>`
        return f"`{text}`"
    return f"`{text.rsplit('.', 1)[-1] if tilde else text}`"


_LITERAL = re.compile(r"(\S)::$|^\s*::$", re.MULTILINE)


def rewrite(text: str) -> str:
    """``text`` with every Sphinx role replaced by a Markdown code span, and reStructuredText's
    ``text::`` (a literal block follows) written as ``text:``."""
    text = _LITERAL.sub(lambda m: f"{m.group(1)}:" if m.group(1) else "", text)
    return _ROLE.sub(_replace, text)


class SphinxRoles(griffe.Extension):
    """Rewrite Sphinx roles in every docstring griffe loads."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = rewrite(obj.docstring.value)
