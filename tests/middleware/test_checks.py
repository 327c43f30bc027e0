"""System checks of the middleware settings: E009 (enqueue middleware), E015 (handler middleware, deploy)."""

from __future__ import annotations

import pytest

from django_fq import checks, handlers


def ids(messages) -> list[str]:
    return [m.id for m in messages]


def test_e009_reports_enqueue_middleware_that_does_not_import(settings):
    settings.FQ_ENQUEUE_MIDDLEWARE = ["tests.middleware.mw.add_tenant"]
    assert "django_fq.E009" not in ids(checks.check_settings())
    settings.FQ_ENQUEUE_MIDDLEWARE = ["tests.middleware.mw.add_tenant", "tests.middleware.mw.gone"]
    found = [m for m in checks.check_settings() if m.id == "django_fq.E009"]
    assert len(found) == 1 and "FQ_ENQUEUE_MIDDLEWARE[1]" in found[0].msg
    settings.FQ_ENQUEUE_MIDDLEWARE = "tests.middleware.mw.add_tenant"
    assert "django_fq.E009" in ids(checks.check_settings())


@pytest.fixture
def one_handler(monkeypatch):
    monkeypatch.setattr(handlers, "_registry", {})
    monkeypatch.setattr(handlers, "_middleware", {})
    monkeypatch.setattr(checks, "load_handlers", lambda: None)
    monkeypatch.setattr(checks, "check_tasks", list)

    def fn(job):
        return None

    handlers.handler("t.chk", middleware=["tests.middleware.mw.per_handler"])(fn)
    return fn


def test_e015_reports_handler_middleware_problems(settings, one_handler):
    settings.FQ_HANDLER_MIDDLEWARE = ["tests.middleware.mw.outer"]
    assert ids(checks.check_handlers()) == []
    settings.FQ_HANDLER_MIDDLEWARE = ["tests.middleware.mw.async_only"]
    (msg,) = checks.check_handlers()
    assert msg.id == "django_fq.E015" and "async-only" in msg.msg and "'t.chk'" in msg.msg
    settings.FQ_HANDLER_MIDDLEWARE = []
    handlers.handler("t.chk", middleware=["tests.middleware.mw.not_callable"])(one_handler)
    (msg,) = checks.check_handlers()
    assert msg.id == "django_fq.E015" and "middleware[0] of the handler of queue 't.chk'" in msg.msg


def test_e015_reports_a_broken_global_middleware_once_not_once_per_queue(settings, one_handler):
    def other(job):
        return None

    handlers.handler("t.chk2")(other)
    settings.FQ_HANDLER_MIDDLEWARE = ["tests.middleware.mw.outer", "tests.middleware.mw.gone"]
    (msg,) = checks.check_handlers()
    assert msg.id == "django_fq.E015" and "FQ_HANDLER_MIDDLEWARE[1]" in msg.msg and "mw.gone" in msg.msg
    # A problem of one queue's chain still names that queue, one message per queue.
    settings.FQ_HANDLER_MIDDLEWARE = ["tests.middleware.mw.async_only"]
    found = checks.check_handlers()
    assert sorted(m.id for m in found) == ["django_fq.E015", "django_fq.E015"]
    assert any("'t.chk'" in m.msg for m in found) and any("'t.chk2'" in m.msg for m in found)


def test_fq_handlers_entries_with_middleware_and_bad_entries(settings, monkeypatch):
    from django_fq.exceptions import HandlerLoadError

    monkeypatch.setattr(handlers, "_registry", {})
    monkeypatch.setattr(handlers, "_middleware", {})
    settings.FQ_HANDLERS = {
        "t.entry": {"handler": "tests.middleware.handlers.record", "middleware": ["tests.middleware.mw.per_handler"]}
    }
    handlers.autodiscover()
    assert handlers.middleware_of("t.entry") == ("tests.middleware.mw.per_handler",)
    settings.FQ_HANDLERS = {"t.bad": {"middleware": []}}
    with pytest.raises(HandlerLoadError, match=r"FQ_HANDLERS\['t.bad'\].*'handler' must be a dotted path"):
        handlers.autodiscover()
    settings.FQ_HANDLERS = {"t.bad": {"handler": "tests.middleware.handlers.record", "middleware": "x"}}
    with pytest.raises(HandlerLoadError, match="'middleware' must be a list"):
        handlers.autodiscover()
