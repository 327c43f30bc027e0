"""Handler middleware (around each run of a handler) and enqueue middleware (around each enqueue).

**Handler middleware** is a callable ``mw(job, call_next)``: ``job`` is the
:class:`~django_fq.worker.JobContext` of the run, ``call_next(job)`` runs the
rest of the chain (the next middleware, at last the handler) and returns the
handler's result. A middleware returns that result (or its own), may catch
what ``call_next`` raises, and may raise itself — :class:`~django_fq.Snooze`
and :class:`~django_fq.RetryAfter` included. The chain of a queue is, from
the outside in: ``FQ_HANDLER_MIDDLEWARE`` (outermost first), then the
handler's own (``@handler("q", middleware=[...])`` or an ``FQ_HANDLERS``
entry ``{"handler": path, "middleware": [...]}``), then the handler.
:func:`build_chain` builds it once per queue when the worker starts: a run
costs one call per middleware and nothing else.

Sync and async: a plain function is sync-only, an ``async def`` function is
async-only, an object may offer both (``__call__`` for sync handlers, an
``async def acall(job, call_next)`` for async ones). :func:`build_chain`
refuses an async-only middleware, :func:`build_async_chain` a sync-only one,
with :class:`~django_fq.exceptions.WorkerConfigError` naming the middleware
and the queue.

**Enqueue middleware** is a callable ``mw(request, call_next)`` listed in
``FQ_ENQUEUE_MIDDLEWARE`` (outermost first). ``request`` is an
:class:`EnqueueRequest`; the middleware may change ``request.metadata`` (a
dict) and returns ``call_next(request)``, or refuses the job by raising
:class:`~django_fq.exceptions.EnqueueRefused`. It runs for every enqueue and
every item of ``enqueue_many`` (the REST API, ``fq enqueue`` and the Django
Tasks backend go through them). With the setting empty an enqueue costs one
global read more. ``FQ_TRACING = True`` puts
:func:`django_fq.tracing.enqueue_middleware` first in the chain (unless the
setting lists it somewhere itself).

See docs/how-to/middleware.md for examples.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.utils.module_loading import import_string

from .exceptions import WorkerConfigError
from .validation import MAX_JSON_DEPTH

__all__ = [
    "EnqueueRequest",
    "build_async_chain",
    "build_chain",
    "chain_for",
    "enqueue_chain",
    "handler_middleware",
    "resolve",
]


# --- handler middleware --------------------------------------------------------------------


def _name(entry: object) -> str:
    if isinstance(entry, str):
        return entry
    module = getattr(entry, "__module__", None)
    qualname = getattr(entry, "__qualname__", None) or type(entry).__qualname__
    return f"{module}.{qualname}" if module else repr(entry)


def resolve(entry: object, *, where: str) -> Callable:
    """The middleware ``entry`` names: a callable as is, a dotted path imported.

    ``where`` says where it was configured (``"FQ_HANDLER_MIDDLEWARE[0]"``) for
    the error. Raises :class:`WorkerConfigError` when the path does not
    import or the object is not callable.
    """
    if isinstance(entry, str):
        try:
            entry = import_string(entry)
        except Exception as exc:  # any import failure is a configuration error
            raise WorkerConfigError(f"{where}: cannot import {entry!r}: {type(exc).__name__}: {exc}") from exc
    if not callable(entry) and not callable(getattr(entry, "acall", None)):
        raise WorkerConfigError(f"{where}: {_name(entry)} is not callable")
    return entry  # type: ignore[return-value]


def _sync_form(mw: Any) -> Callable | None:
    """The sync callable of a middleware, or ``None`` when it is async-only."""
    if not callable(mw) or inspect.iscoroutinefunction(mw):
        return None
    if not inspect.isfunction(mw) and not inspect.ismethod(mw) and inspect.iscoroutinefunction(type(mw).__call__):
        return None  # an object whose __call__ is async def
    return mw


def _async_form(mw: Any) -> Callable | None:
    """The async callable of a middleware (itself, or its ``acall``), or ``None`` when it is sync-only."""
    if inspect.iscoroutinefunction(mw):
        return mw
    acall = getattr(mw, "acall", None)
    if acall is not None and inspect.iscoroutinefunction(acall):
        return acall
    if callable(mw) and not inspect.isfunction(mw) and inspect.iscoroutinefunction(type(mw).__call__):
        return mw
    return None


def handler_middleware(extra: Iterable[object] = ()) -> list[object]:
    """The middleware of one queue, outermost first: ``FQ_HANDLER_MIDDLEWARE``, then ``extra`` (the handler's own)."""
    from django.conf import settings

    configured = getattr(settings, "FQ_HANDLER_MIDDLEWARE", None) or []
    if isinstance(configured, str) or not isinstance(configured, (list, tuple)):
        raise WorkerConfigError("FQ_HANDLER_MIDDLEWARE must be a list of dotted paths")
    return [*configured, *extra]


def _where(index: int, queue: str | None, n_global: int | None) -> str:
    if n_global is not None and index < n_global:
        return f"FQ_HANDLER_MIDDLEWARE[{index}]"
    local = index - (n_global or 0)
    return f"middleware[{local}] of the handler of queue {queue!r}" if queue else f"middleware[{index}]"


def build_chain(
    handler: Callable, middleware: Iterable[object], *, queue: str | None = None, n_global: int | None = None
) -> Callable[[Any], Any]:
    """``handler`` wrapped in ``middleware`` (outermost first): a callable ``chain(job)``.

    ``middleware`` entries are callables or dotted paths; ``queue`` (for
    errors) names the queue, ``n_global`` how many leading entries came from
    ``FQ_HANDLER_MIDDLEWARE``. With no middleware the handler itself is
    returned (no extra call per job). Raises :class:`WorkerConfigError` for a
    path that does not import, a non-callable, or an async-only middleware.
    """
    resolved = [resolve(mw, where=_where(i, queue, n_global)) for i, mw in enumerate(middleware)]
    chain = handler
    for i in range(len(resolved) - 1, -1, -1):
        mw = _sync_form(resolved[i])
        if mw is None:
            on = f" of queue {queue!r}" if queue else ""
            raise WorkerConfigError(
                f"{_where(i, queue, n_global)}: {_name(resolved[i])} is async-only (async def); the handler{on} is "
                f"sync: give the middleware a sync __call__ too, or make the handler async"
            )
        chain = _link(mw, chain)
    return chain


def chain_for(queue: str, handler: Callable, *, own: Iterable[object] | None = None) -> Callable:
    """The chain a worker runs for ``queue``: ``FQ_HANDLER_MIDDLEWARE``, the handler's own middleware, ``handler``.

    ``own`` defaults to what was registered with the queue's handler
    (:func:`django_fq.handlers.middleware_of`) when ``handler`` is the
    registered one, else ``()``. An async handler (``async def``, or see
    :func:`django_fq.worker.aio.is_async_handler`) gets
    :func:`build_async_chain`, any other :func:`build_chain`. Raises
    :class:`WorkerConfigError` (see those).
    """
    from . import handlers

    if own is None:
        own = handlers.middleware_of(queue) if handlers.get(queue) is handler else ()
    own = tuple(own)
    middleware = handler_middleware(own)
    n_global = len(middleware) - len(own)
    from .worker.aio import is_async_handler  # the worker's own test: partials and async __call__ too

    build = build_async_chain if is_async_handler(handler) else build_chain
    return build(handler, middleware, queue=queue, n_global=n_global)


def _link(mw: Callable, call_next: Callable) -> Callable:
    def link(job):
        return mw(job, call_next)

    link.__wrapped__ = call_next  # type: ignore[attr-defined]
    return link


def build_async_chain(
    handler: Callable, middleware: Iterable[object], *, queue: str | None = None, n_global: int | None = None
) -> Callable[[Any], Any]:
    """The async form of :func:`build_chain`: ``await chain(job)`` runs the middleware and ``handler``.

    ``handler`` is an ``async def`` function (a plain one is called and its
    result awaited when it is awaitable). Each middleware must be async: an
    ``async def`` function, or an object with an ``async def acall(job,
    call_next)``; a sync-only one raises :class:`WorkerConfigError` naming it
    and ``queue``. Also raises for a path that does not import or a non-callable.
    """
    resolved = [resolve(mw, where=_where(i, queue, n_global)) for i, mw in enumerate(middleware)]

    async def innermost(job):
        result = handler(job)
        if inspect.isawaitable(result):
            result = await result
        return result

    chain: Callable = handler if inspect.iscoroutinefunction(handler) else innermost
    for i in range(len(resolved) - 1, -1, -1):
        mw = _async_form(resolved[i])
        if mw is None:
            on = f" of queue {queue!r}" if queue else ""
            raise WorkerConfigError(
                f"{_where(i, queue, n_global)}: {_name(resolved[i])} is sync-only; the handler{on} is async: "
                f"write the middleware as async def, or give it an async acall(job, call_next)"
            )
        chain = _alink(mw, chain)
    return chain


def _alink(mw: Callable, call_next: Callable) -> Callable:
    async def link(job):
        return await mw(job, call_next)

    return link


# --- enqueue middleware --------------------------------------------------------------------


class EnqueueRequest:
    """What an enqueue middleware sees of one job about to be enqueued.

    Attributes:
        queue: the queue name (validated).
        payload: the payload as the caller gave it (do not change it; a dict
            comes as a read-only mapping).
        metadata: the job's metadata, a mutable ``dict`` (``{}`` when none was
            given). What it holds after the chain is validated and stored
            (``FQ_MAX_METADATA_BYTES``; key ``tags``, see docs/how-to/middleware.md).
        options: read-only mapping of the other enqueue options given
            (``priority``, ``delay_ms``, ``at``, ``idempotency``,
            ``unique_key``, ``max_attempts``, ``timeout_ms``, …).
    """

    __slots__ = ("queue", "payload", "metadata", "options")

    def __init__(self, queue: str, payload: Any, metadata: dict, options: Mapping[str, Any]):
        self.queue = queue
        self.payload = MappingProxyType(payload) if isinstance(payload, dict) else payload
        self.metadata = metadata
        self.options = MappingProxyType(dict(options))

    def __repr__(self) -> str:
        return f"EnqueueRequest(queue={self.queue!r}, metadata={self.metadata!r})"


def _end(request: EnqueueRequest) -> EnqueueRequest:
    return request


_UNSET: Any = object()
#: The built chain of ``FQ_ENQUEUE_MIDDLEWARE`` (``None`` when empty); rebuilt when the setting changes.
_enqueue_chain: Any = _UNSET


def enqueue_chain() -> Callable[[EnqueueRequest], EnqueueRequest] | None:
    """The chain of ``FQ_ENQUEUE_MIDDLEWARE``, or ``None`` when it is empty (cached until the setting changes).

    Raises ``ImproperlyConfigured`` when an entry does not import or is not
    callable (the system check ``django_fq.E009`` reports it at start).
    """
    global _enqueue_chain
    chain = _enqueue_chain
    if chain is _UNSET:
        chain = _enqueue_chain = _build_enqueue_chain()
    return chain


def _build_enqueue_chain() -> Callable | None:
    from django.conf import settings

    from . import tracing

    configured = getattr(settings, "FQ_ENQUEUE_MIDDLEWARE", None) or []
    if isinstance(configured, str) or not isinstance(configured, (list, tuple)):
        raise ImproperlyConfigured("FQ_ENQUEUE_MIDDLEWARE must be a list of dotted paths")
    if tracing.enabled() and not any(mw in (tracing.ENQUEUE_MIDDLEWARE, tracing.enqueue_middleware) for mw in configured):
        configured = [tracing.ENQUEUE_MIDDLEWARE, *configured]  # FQ_TRACING: outermost, unless listed somewhere
    if not configured:
        return None
    try:
        resolved = [resolve(mw, where=f"FQ_ENQUEUE_MIDDLEWARE[{i}]") for i, mw in enumerate(configured)]
    except WorkerConfigError as exc:
        raise ImproperlyConfigured(str(exc)) from exc
    chain: Callable = _end
    for i in range(len(resolved) - 1, -1, -1):
        chain = _link(resolved[i], chain)
    return chain


def run_enqueue_middleware(chain: Callable, queue: str, payload: Any, metadata: object, options: Mapping) -> object:
    """Run ``chain`` on one job; return the metadata it leaves (to be validated by the caller).

    ``metadata`` as given (a dict is copied with its nested dicts and lists, so the caller's is never changed;
    ``None`` becomes ``{}``; anything else is passed on for validation to
    refuse). Raises what a middleware raises (:class:`EnqueueRefused`), and
    ``ImproperlyConfigured`` when a middleware does not return ``call_next(request)``.
    """
    # Copied down to its nested lists and objects: a middleware that appends to request.metadata["tags"]
    # must change neither the caller's metadata nor the next enqueue_many item sharing it.
    given = {} if metadata is None else (_copy_json(metadata) if isinstance(metadata, dict) else metadata)
    request = EnqueueRequest(queue, payload, given, options)  # type: ignore[arg-type]
    out = chain(request)
    if not isinstance(out, EnqueueRequest):
        raise ImproperlyConfigured("an FQ_ENQUEUE_MIDDLEWARE function must return call_next(request)")
    return out.metadata


def _copy_json(value: Any, depth: int = 0) -> Any:
    """``value`` with each ``dict`` and ``list`` in it copied (other values shared: JSON's are immutable).

    Stops copying below the deepest nesting metadata may have (``MAX_JSON_DEPTH``), so a
    reference cycle or a nesting bomb is left for the metadata's validation to refuse.
    """
    if depth > MAX_JSON_DEPTH:
        return value
    if isinstance(value, dict):
        return {k: _copy_json(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy_json(v, depth + 1) for v in value]
    return value


def _reset(*, setting: str, **_kwargs: Any) -> None:
    global _enqueue_chain
    if setting in ("FQ_ENQUEUE_MIDDLEWARE", "FQ_TRACING"):
        _enqueue_chain = _UNSET


setting_changed.connect(_reset, dispatch_uid="django_fq.middleware.reset")
