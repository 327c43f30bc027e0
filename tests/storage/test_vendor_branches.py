"""Only django_fq/storage/ knows which database it is on (docs/explanation/storage.md).

The test parses django_fq's source and finds every place outside the storage
package that branches on the database backend: a read of ``.vendor``, a
comparison with a vendor name (``"postgresql"``, ``"sqlite"``, ``"mysql"``),
or a call of ``is_postgres()``. Files not moved yet are listed in
:data:`NOT_YET_MOVED`, each with its reason; the list may only shrink: an
entry whose file no longer branches fails too, so that it is removed.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "django_fq"
VENDOR_NAMES = frozenset({"postgresql", "sqlite", "mysql", "oracle"})

#: Files (relative to django_fq/) that still branch on the backend, and why they may for now.
NOT_YET_MOVED: dict[str, str] = {}


def _branches(tree: ast.Module) -> list[int]:
    """Line numbers where ``tree`` branches on the backend."""
    skip: set[int] = set()
    for node in ast.walk(tree):
        # db.is_postgres itself only hands the question to the storage package.
        if isinstance(node, ast.FunctionDef) and node.name == "is_postgres":
            skip |= {id(n) for n in ast.walk(node)}
    found = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Attribute) and node.attr == "vendor":
            found.append(node.lineno)
        elif isinstance(node, ast.Compare):
            for part in [node.left, *node.comparators]:
                elts = part.elts if isinstance(part, (ast.Tuple, ast.List, ast.Set)) else [part]
                if any(isinstance(e, ast.Constant) and e.value in VENDOR_NAMES for e in elts):
                    found.append(node.lineno)
        elif isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
            if name == "is_postgres":
                found.append(node.lineno)
    return sorted(set(found))


def _scan() -> dict[str, list[int]]:
    out = {}
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith(("storage/", "migrations/")):
            continue
        lines = _branches(ast.parse(path.read_text(), filename=str(path)))
        if lines:
            out[rel] = lines
    return out


def test_no_vendor_branch_outside_storage_except_files_not_yet_moved():
    found = _scan()
    new = {f: lines for f, lines in found.items() if f not in NOT_YET_MOVED}
    assert not new, (
        "code outside django_fq/storage/ branches on the database vendor; ask the Store "
        "(django_fq.storage.for_connection(conn)) or read one of its supports_* flags instead:\n"
        + "\n".join(f"  django_fq/{f}: lines {lines}" for f, lines in new.items())
    )


def test_the_list_of_files_not_yet_moved_only_shrinks():
    found = _scan()
    stale = sorted(set(NOT_YET_MOVED) - set(found))
    assert not stale, f"these files no longer branch on the vendor: remove them from NOT_YET_MOVED: {stale}"
    assert all(reason.strip() for reason in NOT_YET_MOVED.values())


def test_the_scan_is_not_vacuous():
    """Each kind of branch is found, and the storage package itself is where they live."""
    src = (
        "def f(conn, db):\n"
        "    if conn.vendor == 'x':\n"
        "        pass\n"
        "    a = 'postgresql' == name\n"
        "    b = name in ('sqlite', 'other')\n"
        "    c = db.is_postgres(conn)\n"
    )
    assert _branches(ast.parse(src)) == [2, 4, 5, 6]
    storage = [
        p
        for p in (ROOT / "storage").rglob("*.py")
        if _branches(ast.parse(p.read_text())) or "vendor =" in p.read_text()
    ]
    assert storage, "the storage package is where the backend is known"
