"""Queues over several databases: which database alias holds each queue (``FQ_QUEUE_DATABASES``).

One project may spread its queues over several databases (PostgreSQL or
MariaDB servers, or SQLite files). The setting maps queue names to
aliases of ``DATABASES``, first match wins::

    FQ_DATABASE = "default"                    # queues no pattern matches
    FQ_QUEUE_DATABASES = {
        "emails": "mail_db",                   # an exact name
        "reports:*": "reports_db",             # an fnmatch pattern (* ? [...])
    }

A list of ``(pattern, alias)`` pairs works too (the order is the one
written). Without the setting (the default) every queue is on
``FQ_DATABASE``, exactly as before.

How the verbs follow it: each public verb that takes a queue
(``enqueue``, ``claim``, ``ack``, ``get``, ...) runs inside
:func:`using` the queue's alias (:func:`by_queue`), and
:func:`django_fq.conf.database` answers that alias while it runs, so the
services, the storage layer and :class:`~django_fq.routers.FqRouter` all
reach that database without passing it along. The alias lives in a
:class:`contextvars.ContextVar`: each thread and each asyncio task has its
own. Verbs without a queue (``queues``, ``reap``, ``prune``, the metrics,
export) visit every alias of :func:`aliases`, or only the one of an
enclosing :func:`using`.

Job ids are random 128-bit values, unique across databases too; every verb
names the queue beside the id, so a job is found on its queue's database
(docs/how-to/queues-over-databases.md).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from fnmatch import fnmatchcase
from typing import Any, TypeVar

from django.conf import settings
from django.core.signals import setting_changed

from . import conf
from .exceptions import WrongDatabase

__all__ = [
    "alias_for", "aliases", "by_queue", "check_transaction", "current", "enabled", "group_by_alias",
    "mapping", "using", "visit",
]  # fmt: skip

F = TypeVar("F", bound=Callable[..., Any])

#: The setting's name.
SETTING = "FQ_QUEUE_DATABASES"

# (setting object, FQ_DATABASE, parsed rules, {queue: alias} memo), rebuilt when either changes.
_cache: tuple[Any, str, tuple[tuple[str, str], ...], dict[str, str]] | None = None
#: Queue names remembered per mapping; past this the memo starts again (names are bounded, patterns are not).
_MEMO_MAX = 10_000


def _raw() -> Any:
    return getattr(settings, SETTING, None)


def enabled() -> bool:
    """Whether ``FQ_QUEUE_DATABASES`` names at least one pattern (else every queue is on ``FQ_DATABASE``)."""
    return bool(_raw())


def parse(raw: Any) -> tuple[tuple[str, str], ...]:
    """The rules of an ``FQ_QUEUE_DATABASES`` value: ``((pattern, alias), ...)`` in match order.

    ``raw``: a mapping ``{pattern: alias}`` or a sequence of ``(pattern, alias)``
    pairs; ``None`` or empty: no rules. Raises ``ValueError`` saying what is
    wrong (the system check E050 reports it; :func:`alias_for` then refuses to
    route).
    """
    if not raw:
        return ()
    if isinstance(raw, dict):
        pairs = list(raw.items())
    elif isinstance(raw, (list, tuple)):
        pairs = []
        for i, pair in enumerate(raw):
            if not isinstance(pair, (list, tuple)) or len(pair) != 2:
                raise ValueError(f"{SETTING}[{i}] must be a (pattern, alias) pair")
            pairs.append((pair[0], pair[1]))
    else:
        raise ValueError(f"{SETTING} must be a dict of pattern: alias or a list of (pattern, alias) pairs")
    for pattern, alias in pairs:
        if not isinstance(pattern, str) or not pattern or not isinstance(alias, str) or not alias:
            raise ValueError(f"{SETTING}: patterns and aliases must be non-empty strings (got {pattern!r}: {alias!r})")
    return tuple(pairs)


def _state() -> tuple[tuple[tuple[str, str], ...], dict[str, str], str]:
    global _cache
    raw = _raw()
    default = conf.get("FQ_DATABASE")
    cache = _cache
    if cache is None or cache[0] is not raw or cache[1] != default:
        try:
            rules = parse(raw)
        except ValueError:
            rules = ()  # the system check says why; meanwhile nothing is routed elsewhere
        cache = _cache = (raw, default, rules, {})
    return cache[2], cache[3], default


def _reset(**kwargs: Any) -> None:
    global _cache
    if kwargs.get("setting") in (SETTING, "FQ_DATABASE", None):
        _cache = None


setting_changed.connect(_reset, dispatch_uid="django_fq.routing.reset")


def mapping() -> tuple[tuple[str, str], ...]:
    """The parsed rules of ``FQ_QUEUE_DATABASES``, ``((pattern, alias), ...)`` in match order (``()``: none)."""
    return _state()[0]


def alias_for(queue: object) -> str:
    """The database alias holding queue ``queue``: the first matching pattern's alias, else ``FQ_DATABASE``.

    Patterns are matched case-sensitively with :func:`fnmatch.fnmatchcase`
    (queue names are case-sensitive). The answer is remembered per queue name
    until the setting changes. A name that is not a string gets
    ``FQ_DATABASE`` (the verb's own validation then refuses it).
    """
    rules, memo, default = _state()
    if not rules or not isinstance(queue, str):
        return default
    found = memo.get(queue)
    if found is None:
        found = default
        for pattern, alias in rules:
            if pattern == queue or fnmatchcase(queue, pattern):
                found = alias
                break
        if len(memo) >= _MEMO_MAX:
            memo.clear()
        memo[queue] = found
    return found


def aliases() -> list[str]:
    """Every alias that may hold queues: ``FQ_DATABASE`` first, then each alias of the rules, in order, once."""
    rules, _memo, default = _state()
    return list(dict.fromkeys([default, *(alias for _pattern, alias in rules)]))


def current() -> str | None:
    """The alias set by the innermost :func:`using` of this thread or task, or ``None`` outside one."""
    return conf.current_alias.get()


@contextlib.contextmanager
def using(alias: str) -> Iterator[str]:
    """Run the block with django-fq's alias set to ``alias`` (``conf.database()`` answers it).

    For code that works on one database of several: the worker's reaper and
    listener of each alias, export of one alias, a test. Every verb called
    inside it works on ``alias``, even for a queue the mapping sends
    elsewhere (a queue left behind after it moved can be deleted so). Nests;
    each thread and asyncio task has its own (a :class:`contextvars.ContextVar`).
    """
    token = conf.current_alias.set(alias)
    try:
        yield alias
    finally:
        conf.current_alias.reset(token)


def visit() -> list[str]:
    """The aliases a verb without a queue works on: the enclosing :func:`using`'s alone, else :func:`aliases`."""
    alias = conf.current_alias.get()
    return [alias] if alias is not None else aliases()


def group_by_alias(queues: Any) -> dict[str, list[str]]:
    """``queues`` (names) grouped by the alias holding each, aliases in :func:`aliases` order, names kept in order."""
    out: dict[str, list[str]] = {}
    for name in queues:
        out.setdefault(alias_for(name), []).append(name)
    order = {a: i for i, a in enumerate(aliases())}
    return dict(sorted(out.items(), key=lambda kv: order.get(kv[0], len(order))))


def by_queue(fn: F) -> F:
    """Decorate a verb whose first argument (or keyword ``queue``) is a queue name: run it on that queue's alias.

    Inside :func:`using` the verb stays on that alias, whatever the mapping
    says: the enclosing operation chose its database (a worker's reaper pass,
    an admin page showing one database, the clean-up after a queue moved).
    Without ``FQ_QUEUE_DATABASES`` the verb is called as it is (no context is
    set, ``conf.database()`` answers ``FQ_DATABASE``): single-database sites
    pay one settings read per call.
    """

    @functools.wraps(fn)
    def routed(*args: Any, **kwargs: Any) -> Any:
        if not _raw() or conf.current_alias.get() is not None:
            return fn(*args, **kwargs)
        queue = args[0] if args else kwargs.get("queue")
        token = conf.current_alias.set(alias_for(queue))
        try:
            return fn(*args, **kwargs)
        finally:
            conf.current_alias.reset(token)

    return routed  # type: ignore[return-value]


def _in_callers_transaction(conn: Any) -> bool:
    """Whether ``conn`` is inside an ``atomic()`` block of the caller's (not only a test case's wrapping one).

    Django's ``TestCase`` (and pytest-django's ``django_db``) wrap each test in
    a transaction on every database it uses, marked ``_from_testcase``; those
    say nothing about where the code under test meant its transaction.
    """
    if not conn.in_atomic_block:
        return False
    return any(not getattr(block, "_from_testcase", False) for block in conn.atomic_blocks)


def every_alias(combine: Callable[[list[tuple[str, Any]]], Any]) -> Callable[[F], F]:
    """Decorate a verb without a queue (or whose queue argument is ``None``): run it on every alias, ``combine`` the answers.

    ``combine`` gets ``[(alias, answer), ...]`` in :func:`aliases` order and
    returns the verb's answer. Inside :func:`using`, or without
    ``FQ_QUEUE_DATABASES``, the verb runs once, on the current alias. A verb
    called with a queue (first argument or keyword ``queue`` not ``None``)
    runs on that queue's alias, as :func:`by_queue` does.
    """

    def wrap(fn: F) -> F:
        one = by_queue(fn)

        @functools.wraps(fn)
        def fanned(*args: Any, **kwargs: Any) -> Any:
            if not _raw() or conf.current_alias.get() is not None:
                return fn(*args, **kwargs)
            if (args and args[0] is not None) or kwargs.get("queue") is not None:
                return one(*args, **kwargs)
            answers = []
            for alias in aliases():
                with using(alias):
                    answers.append((alias, fn(*args, **kwargs)))
            return combine(answers)

        return fanned  # type: ignore[return-value]

    return wrap


def check_transaction(queue: str, *, field: str = "queue") -> None:
    """Refuse an enqueue that would leave the caller's transaction (the transactional-enqueue rule).

    An enqueue is part of the caller's ``transaction.atomic()`` only when that
    transaction is on the queue's alias. When this thread has a transaction
    open on *another* alias that holds queues and none on the queue's alias,
    the job would commit on its own, before the caller's transaction and even
    if it rolls back: :class:`WrongDatabase` (naming ``field``) says so and
    nothing is written. Does nothing without ``FQ_QUEUE_DATABASES``.
    """
    if not _raw():
        return
    from django.db import connections

    target = conf.database()
    if _in_callers_transaction(connections[target]):
        return
    for alias in aliases():
        if alias != target and alias in connections and _in_callers_transaction(connections[alias]):
            raise WrongDatabase(
                f"queue {queue} is on database {target!r}, but the transaction open here is on {alias!r}: "
                f"the job would not be part of it. Enqueue inside transaction.atomic(using={target!r}), "
                "or after the commit (transaction.on_commit)",
                field=field,
                database=target,
                transaction=alias,
            )
