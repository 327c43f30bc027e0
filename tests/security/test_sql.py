"""No SQL text is built from data: an audit of every raw statement in django_fq, and injection attempts.

The audit parses the source of ``django_fq`` (not the tests) and finds each
place SQL text reaches the database: ``cursor.execute``/``executemany``,
``QuerySet.raw``/``extra`` and ``RawSQL``. The text given there must be built
only from

* string and number literals, and f-strings / ``str.format`` / ``+`` /
  ``str.join`` / ``str.replace`` over such parts;
* table names of django-fq's own models (``Model._meta.db_table``);
* the database clock expression (:func:`django_fq.db.now_sql`) and other
  django-fq functions whose every ``return`` is built the same way;
* members of the store classes in ``django_fq/storage/`` read through any
  object (``store.clock_sql``, ``store.greatest_sql(...)``): safe when every
  store's class attribute of that name, or every ``return`` of every store's
  method of that name, is built the same way;
* placeholder lists such as ``", ".join(["%s"] * len(rows))``: the
  repetition count is a number, the repeated text a literal;
* integers formatted with ``:d``;
* the few names listed in :data:`REVIEWED`, each with the reason it is safe.

Values always travel as parameters. ``%`` formatting of SQL text is refused
outright. A new statement that interpolates anything else fails this test
until it is rewritten with parameters or reviewed and listed.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from django_fq import services as fq
from django_fq.exceptions import FqError
from django_fq.models import IdempotencyToken, Job, Lease, Queue

ROOT = Path(__file__).resolve().parents[2] / "django_fq"
SQL_WORDS = re.compile(r"\b(SELECT|INSERT|UPDATE|DELETE|WHERE|VALUES|RETURNING|PRAGMA|LISTEN|NOTIFY)\b")

#: (file, function, name) bound to something the analysis cannot follow, with why it is safe.
REVIEWED = {
    ("services/_base.py", "add_counters", "deltas"): (
        "counter column names: keyword names written in django-fq's calls, or the ** mappings "
        "test_counter_keywords_come_from_code_only checks"
    ),
    ("storage/__init__.py", "run", "sql"): (
        "the DDL of migrations 0003 and 0008 (Store.schema_sql, Store.keys_schema_sql): code-written text "
        "around the server's own column types and collation names read from information_schema; run by "
        "the migrations only, never with user input (the migrations' own files are outside this audit)"
    ),
}


def _modules() -> dict[str, ast.Module]:
    return {
        str(p.relative_to(ROOT)): ast.parse(p.read_text(), filename=str(p))
        for p in sorted(ROOT.rglob("*.py"))
        if "migrations" not in p.parts
    }


class Audit:
    """Decides whether an expression of django_fq's source can only produce SQL text written in the code."""

    def __init__(self, modules: dict[str, ast.Module]):
        self.modules = modules
        self.parents: dict[str, dict[ast.AST, ast.AST]] = {}
        for name, tree in modules.items():
            parents = {}
            for node in ast.walk(tree):
                for child in ast.iter_child_nodes(node):
                    parents[child] = node
            self.parents[name] = parents
        self.returns_cache: dict[tuple[str, str], bool] = {}
        self.problems: list[str] = []

    # --- scopes -------------------------------------------------------------------------------

    def scopes(self, module: str, node: ast.AST) -> list[ast.AST]:
        """The functions enclosing ``node``, innermost first, then the module."""
        out, parents = [], self.parents[module]
        cur = parents.get(node)
        while cur is not None:
            if isinstance(cur, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                out.append(cur)
            cur = parents.get(cur)
        out.append(self.modules[module])
        return out

    def bindings(self, scope: ast.AST, name: str) -> list[tuple[str, ast.AST]]:
        """What ``name`` is bound to directly in ``scope`` (not in nested functions): (kind, node)."""
        found = []
        args = getattr(scope, "args", None)
        if args is not None:
            for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]:
                if a.arg == name:
                    found.append(("param", a))
            if args.vararg is not None and args.vararg.arg == name:
                found.append(("varargs", args.vararg))
            if args.kwarg is not None and args.kwarg.arg == name:
                found.append(("kwargs", args.kwarg))
        body = scope.body if isinstance(scope.body, list) else [scope.body]
        stack = list(body)
        while stack:
            node = stack.pop()
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
                if getattr(node, "name", None) == name:
                    found.append(("def", node))
                continue
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    found += self._target(target, node.value, name)
            elif isinstance(node, (ast.AnnAssign, ast.AugAssign)) and node.value is not None:
                if isinstance(node.target, ast.Name) and node.target.id == name:
                    found.append(("value" if isinstance(node, ast.AnnAssign) else "augment", node.value))
            elif isinstance(node, (ast.For, ast.AsyncFor)):
                found += [("element", e) for e in self._loop(node.target, node.iter, name)]
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                for alias in node.names:
                    if (alias.asname or alias.name.split(".")[0]) == name:
                        found.append(("import", node))
            elif isinstance(node, ast.withitem) and node.optional_vars is not None:
                if isinstance(node.optional_vars, ast.Name) and node.optional_vars.id == name:
                    found.append(("opaque", node))
            elif isinstance(node, ast.ExceptHandler) and node.name == name:
                found.append(("opaque", node))
            stack.extend(ast.iter_child_nodes(node))
        return found

    def _target(self, target, value, name) -> list:
        if isinstance(target, ast.Name):
            return [("value", value)] if target.id == name else []
        if isinstance(target, (ast.Tuple, ast.List)):
            out = []
            for i, elt in enumerate(target.elts):
                if isinstance(elt, ast.Name) and elt.id == name:
                    out.append(("value", self._item(value, i)))
                elif isinstance(elt, (ast.Tuple, ast.List)):
                    out += self._target(elt, self._item(value, i), name)
            return out
        return []

    @staticmethod
    def _item(value, i):
        """The ``i``-th element of a tuple value (through ``x if c else y``), or the whole value if unknown."""
        if isinstance(value, (ast.Tuple, ast.List)) and i < len(value.elts):
            return value.elts[i]
        if isinstance(value, ast.IfExp):
            return ast.IfExp(test=value.test, body=Audit._item(value.body, i), orelse=Audit._item(value.orelse, i))
        return ast.Subscript(value=value, slice=ast.Constant(i))

    def _loop(self, target, iterable, name) -> list:
        """Expressions standing for the element ``name`` takes while looping ``target`` over ``iterable``."""
        if isinstance(target, ast.Name):
            return [ast.Subscript(value=iterable, slice=ast.Constant(None))] if target.id == name else []
        if isinstance(target, (ast.Tuple, ast.List)):
            out = []
            for i, elt in enumerate(target.elts):
                elem = ast.Subscript(
                    value=ast.Subscript(value=iterable, slice=ast.Constant(None)), slice=ast.Constant(i)
                )
                if isinstance(elt, ast.Name) and elt.id == name:
                    out.append(elem)
            return out
        return []

    # --- the judgement ---------------------------------------------------------------------------

    def safe(
        self, module: str, node: ast.AST, at: ast.AST, seen: frozenset = frozenset(), local: frozenset = frozenset()
    ) -> bool:
        """Whether ``node`` (an expression of ``module`` evaluated at ``at``) yields code-written SQL only.

        ``local`` names were bound by an enclosing comprehension to elements of safe iterables.
        """

        def rec(n):
            return self.safe(module, n, at, seen, local)

        if isinstance(node, ast.Constant):
            return isinstance(node.value, (str, int, float, bytes, bool)) or node.value is None
        if isinstance(node, ast.JoinedStr):
            return all(rec(v) for v in node.values)
        if isinstance(node, ast.FormattedValue):
            spec = node.format_spec
            if spec is not None and "".join(getattr(v, "value", "?") for v in spec.values) == "d":
                return True  # "{x:d}" formats an integer or raises
            return rec(node.value)
        if isinstance(node, ast.BinOp):
            if isinstance(node.op, ast.Mod):
                self.problems.append(f"{module}:{node.lineno}: % formatting of SQL text")
                return False
            if isinstance(node.op, ast.Mult):  # text * n: the text decides
                return rec(node.left) or rec(node.right)
            if isinstance(node.op, ast.Add):
                return rec(node.left) and rec(node.right)
            return self._numeric(node)
        if isinstance(node, ast.IfExp):
            return rec(node.body) and rec(node.orelse)
        if isinstance(node, ast.BoolOp):
            return all(rec(v) for v in node.values)
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return all(rec(e) for e in node.elts)
        if isinstance(node, (ast.GeneratorExp, ast.ListComp, ast.SetComp)):
            return self._comprehension(module, node, node.elt, at, seen, local)
        if isinstance(node, ast.DictComp):
            return self._comprehension(module, node, node.key, at, seen, local)
        if isinstance(node, ast.Subscript):
            if isinstance(node.slice, ast.Constant) and node.slice.value is None:
                return rec(node.value)  # an element of a safe iterable
            index = node.slice.value if isinstance(node.slice, ast.Constant) else None
            if isinstance(index, int) and not isinstance(index, bool) and isinstance(node.value, ast.Call):
                # ``sql, params = store.in_sql(...)``: only the i-th part of what the call returns is SQL text.
                return self._call(module, node.value, at, seen, local, index=index)
            return rec(node.value)
        if isinstance(node, ast.Attribute):
            if "_meta" in ast.unparse(node):
                return True  # model metadata (table and column names) is written in code
            if isinstance(node.value, ast.Name) and node.value.id in local:
                return True  # an attribute of an element of a safe iterable (a field's column name)
            if node.attr == "db_table" and isinstance(node.value, ast.Attribute) and node.value.attr == "_meta":
                return True  # a model's table name
            target = self._module_attribute(module, node)
            if target is not None:
                return self.safe(target[0], target[1], target[1], seen)
            values = [d for d in self._store_members(node.attr) if not isinstance(d[1], ast.FunctionDef)]
            if values:
                return all(self.safe(m, v, v, seen) for m, v in values)
            return False
        if isinstance(node, ast.Name):
            return node.id in local or self._name(module, node.id, at, seen)
        if isinstance(node, ast.Call):
            return self._call(module, node, at, seen, local)
        if isinstance(node, ast.Starred):
            return rec(node.value)
        return False

    @staticmethod
    def _numeric(node) -> bool:
        return isinstance(node.op, (ast.Sub, ast.FloorDiv, ast.Pow))

    def _comprehension(self, module, comp, elt, at, seen, local) -> bool:
        bound = set(local)
        for gen in comp.generators:
            names = {n.id for n in ast.walk(gen.target) if isinstance(n, ast.Name)}
            if self.safe(module, gen.iter, at, seen, frozenset(bound)):
                bound |= names
            else:
                bound -= names
                if names & {n.id for n in ast.walk(elt) if isinstance(n, ast.Name)}:
                    return False
        return self.safe(module, elt, at, seen, frozenset(bound))

    def _name(self, module: str, name: str, at: ast.AST, seen: frozenset) -> bool:
        key = (module, id(at), name)
        if key in seen:
            return True  # a cycle (x = x.replace(...)): judged by its other bindings
        seen = seen | {key}
        for scope in self.scopes(module, at):
            found = self.bindings(scope, name)
            if not found:
                continue
            func = getattr(scope, "name", "<module>")
            if (module, func, name) in REVIEWED:
                return True
            for kind, value in found:
                if kind in ("value", "augment", "element"):
                    if not self.safe(module, value, value if kind != "element" else at, seen):
                        self.problems.append(f"{module}:{getattr(value, 'lineno', '?')}: {name} in {func}")
                        return False
                elif kind == "param":
                    if not self._param(module, scope, name, seen):
                        self.problems.append(f"{module}: parameter {name} of {func}")
                        return False
                elif kind == "import":
                    if not self._imported(module, value, name, seen):
                        return False
                elif kind == "def":
                    return False  # a function object is not SQL text
                else:
                    self.problems.append(f"{module}: {name} in {func} ({kind})")
                    return False
            return True
        if name in ("True", "False", "None"):
            return True
        self.problems.append(f"{module}: unknown name {name}")
        return False

    def _param(self, module, func, name, seen) -> bool:
        """A parameter is safe when its default and what every call of its function passes are safe.

        Calls are looked for in every module (``f(...)`` and ``x.f(...)``).
        """
        if isinstance(func, ast.Lambda):
            return False
        args = func.args
        positions = [a.arg for a in [*args.posonlyargs, *args.args]]
        defaults = dict(zip(positions[len(positions) - len(args.defaults) :], args.defaults, strict=True))
        if positions and positions[0] == "self":
            positions = positions[1:]  # a store's method, called as store.method(...)
        defaults.update({a.arg: d for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True) if d is not None})
        if name in defaults and not self.safe(module, defaults[name], defaults[name], seen):
            return False
        calls = []
        for where, tree in self.modules.items():
            for n in ast.walk(tree):
                if isinstance(n, ast.Call):
                    called = n.func.id if isinstance(n.func, ast.Name) else getattr(n.func, "attr", None)
                    if called == func.name:
                        calls.append((where, n))
        if not calls:
            return False
        for where, call in calls:
            given = None
            if name in positions and positions.index(name) < len(call.args):
                given = call.args[positions.index(name)]
            for kw in call.keywords:
                if kw.arg == name:
                    given = kw.value
            if given is None:
                continue  # the default, judged above
            if not self.safe(where, given, call, seen):
                return False
        return True

    def _imported(self, module, node, name, seen) -> bool:
        if not isinstance(node, ast.ImportFrom) or node.level == 0:
            return False
        target = self._resolve_relative(module, node.module, node.level)
        if target is None:
            return False
        for alias in node.names:
            if (alias.asname or alias.name) == name:
                if target + ".py" in self.modules or (target and f"{target}/__init__.py" in self.modules):
                    path = target + ".py" if target + ".py" in self.modules else f"{target}/__init__.py"
                    return self._name(path, alias.name, self.modules[path], seen)
                sub = f"{target}/{alias.name}.py"
                return sub in self.modules  # a module imported as a name: judged where its attributes are used
        return False

    @staticmethod
    def _resolve_relative(module: str, name: str | None, level: int) -> str | None:
        parts = module.split("/")[:-1]
        if level - 1 > len(parts):
            return None
        base = parts[: len(parts) - (level - 1)]
        if name:
            base += name.split(".")
        return "/".join(base)

    def _module_attribute(self, module: str, node: ast.Attribute):
        """``mod.NAME`` where ``mod`` is a django_fq module imported here: (module path, NAME node stand-in)."""
        if not isinstance(node.value, ast.Name):
            return None
        tree = self.modules[module]
        for imp in ast.walk(tree):
            if isinstance(imp, ast.ImportFrom) and imp.level > 0:
                for alias in imp.names:
                    if (alias.asname or alias.name) == node.value.id:
                        base = self._resolve_relative(module, imp.module, imp.level)
                        path = f"{base}/{alias.name}.py" if base else f"{alias.name}.py"
                        if path in self.modules:
                            return path, ast.Name(id=node.attr)
        return None

    def _call(self, module: str, node: ast.Call, at, seen, local=frozenset(), index: int | None = None) -> bool:
        """Whether call ``node`` yields code-written SQL (with ``index``: the ``index``-th item of a returned tuple)."""
        func = node.func
        if isinstance(func, ast.Name) and func.id in ("int", "len", "range"):
            return True  # numbers
        if isinstance(func, ast.Attribute) and func.attr in ("join", "format", "replace", "strip", "upper", "lower"):
            parts = [func.value, *node.args, *(k.value for k in node.keywords)]
            return all(self.safe(module, p, at, seen, local) for p in parts)
        if isinstance(func, ast.Attribute) and func.attr in ("items", "keys", "values"):
            return self.safe(module, func.value, at, seen, local)
        if isinstance(func, ast.Name) and func.id in ("tuple", "list", "sorted", "set"):
            return all(self.safe(module, a, at, seen, local) for a in node.args)
        # A django-fq function: safe when everything it returns is.
        where = None
        if isinstance(func, ast.Name):
            where = (module, func.id)
        elif isinstance(func, ast.Attribute):
            target = self._module_attribute(module, func)
            if target is not None:
                where = (target[0], target[1].id)
        if where is None and isinstance(func, ast.Attribute):
            methods = [d for d in self._store_members(func.attr) if isinstance(d[1], ast.FunctionDef)]
            if methods:
                return all(self._function_returns_safe(m, d, index) for m, d in methods)
        if where is None:
            return False
        return self._returns_safe(*where, index=index)

    def _store_members(self, name: str) -> list[tuple[str, ast.AST]]:
        """``name`` in the classes of django_fq/storage/: (module, method) or (module, assigned value)."""
        found: list[tuple[str, ast.AST]] = []
        for module, tree in self.modules.items():
            if not module.startswith("storage/"):
                continue
            for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
                for item in cls.body:
                    if isinstance(item, ast.FunctionDef) and item.name == name:
                        found.append((module, item))
                    elif isinstance(item, ast.Assign) and any(getattr(t, "id", None) == name for t in item.targets):
                        found.append((module, item.value))
                    elif isinstance(item, ast.AnnAssign) and getattr(item.target, "id", None) == name and item.value:
                        found.append((module, item.value))
        return found

    @staticmethod
    def _part(value: ast.AST, index: int | None) -> ast.AST:
        """The ``index``-th element of a returned tuple literal, or the whole value."""
        if index is not None and isinstance(value, ast.Tuple) and index < len(value.elts):
            return value.elts[index]
        return value

    @staticmethod
    def _returns(d: ast.FunctionDef) -> list[ast.Return]:
        return [n for n in ast.walk(d) if isinstance(n, ast.Return)]

    def _function_returns_safe(self, module: str, d: ast.FunctionDef, index: int | None = None) -> bool:
        if not any(isinstance(r.value, ast.Tuple) for r in self._returns(d)):
            index = None  # no tuple returned: every part is the whole value (one cache entry)
        key = (module, f"{d.name}@{d.lineno}[{index}]")
        if key in self.returns_cache:
            return self.returns_cache[key]
        self.returns_cache[key] = True  # recursion: assume, then check
        ok = all(
            ret.value is None or self.safe(module, self._part(ret.value, index), ret.value)
            for ret in (n for n in ast.walk(d) if isinstance(n, ast.Return))
        )
        self.returns_cache[key] = ok
        return ok

    def _returns_safe(self, module: str, name: str, index: int | None = None) -> bool:
        tree = self.modules[module]
        defs = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name]
        if not any(isinstance(r.value, ast.Tuple) for d in defs for r in self._returns(d)):
            index = None  # no tuple returned: every part is the whole value (one cache entry)
        key = (module, f"{name}[{index}]")
        if key in self.returns_cache:
            return self.returns_cache[key]
        self.returns_cache[key] = True  # recursion: assume, then check
        ok = bool(defs)
        for d in defs:
            for ret in (n for n in ast.walk(d) if isinstance(n, ast.Return)):
                if ret.value is not None and not self.safe(module, self._part(ret.value, index), ret.value):
                    ok = False
        self.returns_cache[key] = ok
        return ok


def _sinks(modules):
    """Every (module, call node, SQL argument) where SQL text reaches the database."""
    for module, tree in modules.items():
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name in ("execute", "executemany"):
                receiver = func.value if isinstance(func, ast.Attribute) else None
                if isinstance(receiver, ast.Name) and receiver.id == "self":
                    continue  # Worker.execute runs a job, not SQL
                if (
                    isinstance(receiver, ast.Attribute)
                    and receiver.attr == "worker"
                    and isinstance(receiver.value, ast.Name)
                    and receiver.value.id == "self"
                ):
                    continue  # a runner pool's self.worker.execute: Worker.execute runs a job, not SQL
                if isinstance(receiver, ast.Call) and getattr(receiver.func, "id", None) == "super":
                    continue
            elif name not in ("raw", "extra", "RawSQL"):
                continue
            sql = (
                node.args[0] if node.args else next((k.value for k in node.keywords if k.arg in ("sql", "query")), None)
            )
            if sql is not None:
                yield module, node, sql


def test_every_raw_statement_is_built_from_code_written_text_only():
    modules = _modules()
    audit = Audit(modules)
    sinks = list(_sinks(modules))
    assert len(sinks) >= 40, "the audit found fewer statements than django_fq has"
    unsafe = []
    for module, call, sql in sinks:
        if not audit.safe(module, sql, call):
            unsafe.append(f"{module}:{call.lineno}: {ast.unparse(sql)[:120]}")
    assert not unsafe, "SQL text built from something other than code:\n" + "\n".join(unsafe + audit.problems)


#: The ``**mapping`` arguments of ``add_counters`` calls, and why their keys are column names from code.
COUNTER_MAPPINGS = {
    ("services/leases.py", "{totals[kind]: 1}"): "totals is a constant dict of counter names; kind comes from code",
    ("backup.py", "q.totals"): "built only from keys of the constant _TOTALS (the import refuses any other key)",
}


def test_counter_keywords_come_from_code_only():
    """``add_counters(**deltas)`` puts the keyword names into SQL: every ``**`` given to it is reviewed."""
    found = set()
    for module, tree in _modules().items():
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and getattr(node.func, "id", getattr(node.func, "attr", None)) == "add_counters"
            ):
                for kw in node.keywords:
                    if kw.arg is None:
                        found.add((module, ast.unparse(kw.value)))
    assert found <= set(COUNTER_MAPPINGS), found - set(COUNTER_MAPPINGS)


def test_no_percent_formatting_of_sql_anywhere():
    """``"... %s ..." % value`` on text that looks like SQL, anywhere in django_fq (not only at execute)."""
    found = []
    for module, tree in _modules().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod):
                left = node.left
                text = left.value if isinstance(left, ast.Constant) and isinstance(left.value, str) else ""
                if SQL_WORDS.search(text):
                    found.append(f"{module}:{node.lineno}")
    assert not found


def test_the_audit_catches_interpolated_data():
    """The checker is not vacuous: it refuses statements that interpolate a value."""
    source = """
from .. import db

def bad_fstring(cur, queue_name):
    cur.execute(f"SELECT * FROM django_fq_queue WHERE name = '{queue_name}'")

def bad_format(cur, token):
    cur.execute("DELETE FROM t WHERE token = '{}'".format(token))

def bad_percent(cur, key):
    cur.execute("SELECT * FROM t WHERE k = '%s'" % key)

def bad_concat(cur, worker):
    sql = "UPDATE t SET worker = '" + worker + "'"
    cur.execute(sql)

def bad_join(cur, names):
    cur.execute("SELECT " + ", ".join(names) + " FROM t")

def good(cur, queue_name):
    marks = ", ".join(["%s"] * len(queue_name))
    cur.execute(f"SELECT * FROM t WHERE {db.now_sql()} > 0 AND name IN ({marks})", [queue_name])
"""
    modules = _modules()
    modules["services/_probe.py"] = ast.parse(source)
    audit = Audit(modules)
    verdicts = {}
    for module, call, sql in _sinks({"services/_probe.py": modules["services/_probe.py"]}):
        func = next(s for s in audit.scopes(module, call) if isinstance(s, ast.FunctionDef))
        verdicts[func.name] = audit.safe(module, sql, call)
    assert verdicts == {
        "bad_fstring": False,
        "bad_format": False,
        "bad_percent": False,
        "bad_concat": False,
        "bad_join": False,
        "good": True,
    }


# --- injection attempts -------------------------------------------------------------------------------------------

HOSTILE = [
    "'; DROP TABLE django_fq_job; --",
    '" OR 1=1 --',
    "%s",
    "%(q)s",
    "{now}",
    "x' UNION SELECT receipt_hash FROM django_fq_lease --",
    "\\'; DELETE FROM django_fq_queue; --",
]


def _tables_intact():
    return Queue.objects.count(), Job.objects.count(), Lease.objects.count(), IdempotencyToken.objects.count()


@pytest.mark.django_db
@pytest.mark.parametrize("text", HOSTILE)
def test_hostile_text_in_every_free_text_field_is_stored_verbatim(text):
    q = "sec:sql"
    fq.configure(q, backoff_ms=0)
    job = fq.enqueue(q, {"k": text, text: [text]}, idempotency=text, unique_key=text).id
    again = fq.enqueue(q, {"other": 1}, idempotency=text)
    assert (again.id, again.created) == (job, False)
    [claimed] = fq.claim(q, worker=text)
    fq.nack(q, claimed.receipt, error=text)
    [claimed] = fq.claim(q, worker=text)
    fq.ack(q, claimed.receipt, result={text: text})
    info = fq.get(q, job)
    assert info.payload == {"k": text, text: [text]}
    assert info.result == {text: text}
    assert info.last_error == text and info.errors[-1]["error"] == text and info.errors[-1]["worker"] == text
    assert info.idempotency == text and info.unique_key == text
    assert fq.jobs(q, state="succeeded").jobs[0].id == job
    assert _tables_intact() == (1, 1, 0, 1)
    # Receipts, job ids and cursors made of hostile text are refused, never run.
    for bad in (text, f"fq1.{'0' * 32}.1.{text}"):
        with pytest.raises(FqError) as caught:
            fq.ack(q, bad)
        assert getattr(caught.value, "code", None) == "invalid_receipt"
    for call in (lambda: fq.get(q, text), lambda: fq.cancel(q, text), lambda: fq.jobs(q, cursor=text)):
        with pytest.raises(FqError) as caught:
            call()
        assert getattr(caught.value, "code", None) in ("job_not_found", "invalid_cursor")
    assert _tables_intact() == (1, 1, 0, 1)
