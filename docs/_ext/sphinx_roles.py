"""Griffe extension for the docs build: docstrings written for the source read well on the site.

* Sphinx roles (``:class:`~quantplan.QuantizePlan```) would show up verbatim in Markdown, so each
  becomes an optional autorefs reference: a link where the target is rendered somewhere in the
  docs, inline code otherwise (no warning, so ``mkdocs build --strict`` passes either way). A
  leading ``~`` keeps the last component as the title; a target without a dot is taken relative
  to the object's module.
* References to the project's specification ("SPEC section 4", the numerics; "SPEC section 3",
  the scopes) point at the Concepts page, which states the same rules for users.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:class|func|meth|mod|attr|data|exc|obj):`(~?)([\w.]+)`")
_SPEC = [
    (re.compile(r"SPEC\s+section\s+4's"), "quantplan's"),
    (re.compile(r"SPEC\s+section\s+4"), '<autoref identifier="numerics" optional>the numerics</autoref>'),
    (re.compile(r"SPEC\s+section\s+3"), '<autoref identifier="scopes" optional>the scopes</autoref>'),
    (re.compile(r"\bSPEC\b"), "quantplan's"),
]


def _module_path(obj: griffe.Object) -> str:
    module: Any = obj if obj.is_module else obj.module
    return str(module.path)


def rewrite_roles(text: str, module_path: str) -> str:
    """Replace every Sphinx role in ``text`` by an optional autorefs reference, and SPEC sections by links."""

    def replace(match: re.Match[str]) -> str:
        short, target = match.group(1) == "~", match.group(2)
        identifier = target if "." in target else f"{module_path}.{target}"
        title = target.rsplit(".", 1)[-1] if short else target
        return f'<autoref identifier="{identifier}" optional><code>{title}</code></autoref>'

    text = _ROLE.sub(replace, text)
    for pattern, words in _SPEC:
        text = pattern.sub(words, text)
    return text


class SphinxRoles(griffe.Extension):
    """Rewrites the Sphinx roles of every docstring as it is loaded."""

    def on_instance(self, *, node: Any, obj: griffe.Object, agent: Any, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = rewrite_roles(obj.docstring.value, _module_path(obj))
