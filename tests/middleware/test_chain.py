"""Handler middleware chains: order, catching, the sync/async split, configuration errors (no database)."""

from __future__ import annotations

import asyncio

import pytest

from django_fq import handlers
from django_fq.exceptions import InvalidDelay, RetryAfter, Snooze, WorkerConfigError
from django_fq.middleware import build_async_chain, build_chain, chain_for


class Job:
    def __init__(self, id="j1"):
        self.id = id
        self.payload = {}
        self.metadata = {}
        self.attempts = 1


def tracer(name, seen):
    def mw(job, call_next):
        seen.append(f"{name}>")
        out = call_next(job)
        seen.append(f"<{name}")
        return out

    return mw


def test_middleware_runs_outermost_first_around_the_handler():
    seen = []
    chain = build_chain(lambda job: seen.append("handler") or 7, [tracer("a", seen), tracer("b", seen)])
    assert chain(Job()) == 7
    assert seen == ["a>", "b>", "handler", "<b", "<a"]


def test_no_middleware_is_the_bare_handler():
    def fn(job):
        return 1

    assert build_chain(fn, []) is fn


def test_a_middleware_can_catch_replace_the_result_and_raise_outcomes():
    def catch(job, call_next):
        try:
            return call_next(job)
        except KeyError:
            return "recovered"

    def boom(job):
        raise KeyError("x")

    assert build_chain(boom, [catch])(Job()) == "recovered"

    def snooze(job, call_next):
        raise Snooze(1500)

    with pytest.raises(Snooze) as info:
        build_chain(boom, [snooze])(Job())
    assert info.value.delay_ms == 1500


def test_dotted_paths_are_imported_and_bad_ones_are_config_errors():
    chain = build_chain(lambda job: "r", ["tests.middleware.mw.inner"], queue="q")
    assert chain(Job()) == {"inner": "r"}
    with pytest.raises(WorkerConfigError, match=r"middleware\[0\].*cannot import 'tests.middleware.mw.nope'"):
        build_chain(lambda job: None, ["tests.middleware.mw.nope"], queue="q")
    with pytest.raises(WorkerConfigError, match="not callable"):
        build_chain(lambda job: None, ["tests.middleware.mw.not_callable"], queue="q")


def test_an_async_only_middleware_on_a_sync_handler_names_it_and_the_queue():
    with pytest.raises(WorkerConfigError, match=r"tests\.middleware\.mw\.async_only is async-only.*queue 'q1'"):
        build_chain(lambda job: None, ["tests.middleware.mw.async_only"], queue="q1")


def test_a_sync_only_middleware_on_an_async_handler_names_it_and_the_queue():
    async def handler(job):
        return 1

    with pytest.raises(WorkerConfigError, match=r"tests\.middleware\.mw\.inner is sync-only.*queue 'aq'"):
        build_async_chain(handler, ["tests.middleware.mw.inner"], queue="aq")


def test_the_async_chain_runs_async_middleware_and_objects_with_acall():
    from tests.middleware import mw

    mw.TRAIL.clear()
    seen = []

    async def outer(job, call_next):
        seen.append("outer>")
        out = await call_next(job)
        seen.append("<outer")
        return out + 1

    async def handler(job):
        seen.append("handler")
        return 41

    chain = build_async_chain(handler, [outer, "tests.middleware.mw.both"], queue="aq")
    assert asyncio.run(chain(Job())) == 42
    assert seen == ["outer>", "handler", "<outer"]
    assert mw.TRAIL == [("both:async", "j1")]
    # The same object in a sync chain uses its __call__.
    mw.TRAIL.clear()
    assert build_chain(lambda job: 5, [mw.both])(Job()) == 5
    assert mw.TRAIL == [("both:sync", "j1")]


def test_the_async_chain_awaits_a_plain_handlers_awaitable():
    async def later():
        return "done"

    chain = build_async_chain(lambda job: later(), [])
    assert asyncio.run(chain(Job())) == "done"


def test_global_middleware_runs_outside_the_handlers_own(settings):
    from tests.middleware import mw

    settings.FQ_HANDLER_MIDDLEWARE = ["tests.middleware.mw.outer"]
    mw.TRAIL.clear()

    def fn(job):
        mw.TRAIL.append(("handler", job.id))
        return 1

    chain = chain_for("t.chain", fn, own=["tests.middleware.mw.per_handler"])
    assert chain(Job()) == 1
    assert [w for w, _ in mw.TRAIL] == ["outer:before", "per_handler", "handler", "outer:after"]
    settings.FQ_HANDLER_MIDDLEWARE = ["tests.middleware.mw.missing"]
    with pytest.raises(WorkerConfigError, match=r"FQ_HANDLER_MIDDLEWARE\[0\]"):
        chain_for("t.chain", fn)


def test_handler_decorator_records_its_own_middleware(monkeypatch):
    monkeypatch.setattr(handlers, "_registry", {})
    monkeypatch.setattr(handlers, "_middleware", {})

    @handler_for("t.own", ["tests.middleware.mw.per_handler"])
    def fn(job):
        return 1

    assert handlers.middleware_of("t.own") == ("tests.middleware.mw.per_handler",)
    with pytest.raises(TypeError):
        handlers.handler("t.own2", middleware="tests.middleware.mw.per_handler")


def handler_for(queue, middleware):
    return handlers.handler(queue, middleware=middleware)


@pytest.mark.parametrize("bad", [-1, 30 * 24 * 3600 * 1000 + 1, 1.5, "10", True, None])
def test_snooze_and_retry_after_refuse_a_bad_delay(bad):
    with pytest.raises(InvalidDelay):
        Snooze(bad)
    with pytest.raises(InvalidDelay):
        RetryAfter(bad)


def test_snooze_and_retry_after_keep_their_values():
    assert Snooze(0).delay_ms == 0
    r = RetryAfter(30 * 24 * 3600 * 1000, error="later")
    assert (r.delay_ms, r.error, str(r)) == (30 * 24 * 3600 * 1000, "later", "later")
