"""A griffe extension for the API reference: the few reST habits of our docstrings, as Markdown.

The docstrings are Google style but use some reStructuredText, which Python
tooling reads well and Markdown does not:

- roles (``:class:`FqError```, ``:func:`~django_fq.services.enqueue```) become
  inline code, with a ``~`` path shortened to its last part;
- a paragraph ending in ``::`` ends in ``:`` (its indented block is already a
  Markdown code block);
- interactive examples (lines starting with ``>>>``) become ``pycon`` code
  blocks instead of nested quotes;
- simple tables (borders of ``=`` columns) are shown as preformatted text.

Only the text handed to mkdocstrings changes; the source stays as it is.
Loaded by ``mkdocs.yml`` (``extensions: docs/_griffe_rst.py:RstRoles``).
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|attr|exc|data|obj|const):`(~?)([^`]+)`")
_BORDER = re.compile(r"^\s*=+(\s+=+)+\s*$")


def _role(match: re.Match[str]) -> str:
    short, target = match.group(1), match.group(2)
    if short:
        target = target.rsplit(".", 1)[-1]
    return f"`{target}`"


def convert(text: str) -> str:
    """Return ``text`` with the reST constructs above rewritten as Markdown."""
    text = _ROLE.sub(_role, text)
    out: list[str] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        stripped = line.lstrip()
        indent = line[: len(line) - len(stripped)]
        if stripped.startswith(">>>"):
            block = []
            while i < len(lines) and lines[i].lstrip().startswith((">>>", "...")):
                block.append(lines[i][len(indent) :])
                i += 1
            out += [f"{indent}```pycon", *(indent + b for b in block), f"{indent}```"]
            continue
        if _BORDER.match(line):
            block = [line]
            borders = 1
            i += 1
            while i < len(lines) and borders < 3:
                block.append(lines[i])
                borders += bool(_BORDER.match(lines[i]))
                i += 1
            out += [f"{indent}```text", *block, f"{indent}```"]
            continue
        if stripped == "::":
            i += 1
            continue
        if line.endswith("::"):
            line = line[:-1]
        out.append(line)
        i += 1
    return "\n".join(out)


class RstRoles(griffe.Extension):
    """Rewrite every docstring with :func:`convert` as objects are loaded."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = convert(obj.docstring.value)
