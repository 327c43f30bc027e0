"""One handler per queue: a second one is refused with a message naming both (and the Tasks hint)."""

from __future__ import annotations

import pytest

from django_fq import handlers
from django_fq.tasks.runner import run_task


@pytest.fixture
def clean_registry(monkeypatch):
    monkeypatch.setattr(handlers, "_registry", {})


def first(job):
    return None


def second(job):
    return None


def test_a_second_handler_for_a_queue_is_refused_naming_both(clean_registry):
    handlers.handler("reg.a")(first)
    with pytest.raises(ValueError, match="already has handler") as err:
        handlers.handler("reg.a")(second)
    text = str(err.value)
    assert "tests.test_handler_registry.first" in text and "tests.test_handler_registry.second" in text
    assert "queue_prefix" not in text
    assert handlers.get("reg.a") is first
    handlers.handler("reg.a")(first)  # the same function again is fine


def test_a_queue_taken_by_the_tasks_runner_suggests_a_queue_prefix(clean_registry):
    handlers.handler("emails")(run_task)
    with pytest.raises(ValueError, match=r"queue_prefix") as err:
        handlers.handler("emails")(second)
    text = str(err.value)
    # fits a backend that already has a prefix too: it does not only say "give it a prefix"
    assert "move the @handler to another queue" in text and "a different OPTIONS['queue_prefix']" in text
    assert "rename the queue" not in text
    assert handlers.get("emails") is run_task


# --- a handler module that raises at import is reported with its module, file and line ------------


@pytest.fixture
def broken_app(tmp_path, monkeypatch, settings):
    """Install an app ``fqbroken`` whose ``fq_handlers`` runs ``body``; return the handler module's file."""
    import importlib
    import sys

    monkeypatch.syspath_prepend(str(tmp_path))
    # The other apps' handler modules register only when first imported: import them before the copy,
    # so the process-wide registry keeps their handlers (tests/tasks/test_checks.py relies on them).
    handlers.autodiscover()
    monkeypatch.setattr(handlers, "_registry", dict(handlers.registered()))

    def install(body: str, helper: str = "") -> str:
        package = tmp_path / "fqbroken"
        package.mkdir(exist_ok=True)
        (package / "__init__.py").write_text("")
        (package / "helper.py").write_text(helper)
        (package / "fq_handlers.py").write_text(body)
        for name in [m for m in sys.modules if m.startswith("fqbroken")]:
            del sys.modules[name]
        importlib.invalidate_caches()
        settings.INSTALLED_APPS = [*settings.INSTALLED_APPS, "fqbroken"]
        return str(package / "fq_handlers.py")

    return install


def _refusals() -> tuple[str, str, str]:
    """What ``load_handlers``, check E006 and ``fq_worker`` say, each on one line."""
    from django.core.management import call_command
    from django.core.management.base import CommandError

    from django_fq import checks

    with pytest.raises(checks.HandlerLoadError) as loaded:
        checks.load_handlers()
    [error] = checks.check_handlers(None)
    assert error.id == "django_fq.E006"
    with pytest.raises(CommandError) as worker:
        call_command("fq_worker", "--burst", "--no-progress", skip_checks=True)
    return str(loaded.value), error.msg, str(worker.value)


def test_a_handler_module_raising_at_import_is_named_with_its_file_and_line(broken_app):
    path = broken_app(
        '"""Handlers."""\nfrom django_fq import handler\nfrom .helper import LIMIT\n\n\n@handler("brk.a")\ndef run(job):\n    return LIMIT\n',
        helper="import os\n\nLIMIT = int(os.environ['FQ_NO_SUCH_VARIABLE_C3'])\n",
    )

    loaded, check, worker = _refusals()

    expected = (
        f"cannot load the job handlers: module fqbroken.fq_handlers, file {path}, line 3: "
        "KeyError: 'FQ_NO_SUCH_VARIABLE_C3'"
    )
    assert loaded == check == worker == expected  # the handler module's own line: the import that failed


def test_a_syntax_error_in_a_handler_module_is_named_with_its_line(broken_app):
    path = broken_app("from django_fq import handler\n\nx = (1,\ny = 2\n")

    loaded, check, worker = _refusals()

    assert loaded == check == worker
    assert loaded.startswith(f"cannot load the job handlers: module fqbroken.fq_handlers, file {path}, line ")
    assert "SyntaxError: " in loaded and "\n" not in loaded


def test_an_fq_handlers_path_whose_module_raises_is_named_with_its_file_and_line(broken_app, settings):
    broken_app("", helper="def run(job):\n    return None\n\n\nBROKEN = undefined_name  # noqa\n")
    settings.FQ_HANDLERS = {"brk.b": "fqbroken.helper.run"}

    loaded, _, _ = _refusals()

    assert loaded.startswith("cannot load the job handlers: FQ_HANDLERS['brk.b'] = 'fqbroken.helper.run' (module fqbroken.helper, file ")
    assert loaded.endswith("helper.py, line 5): NameError: name 'undefined_name' is not defined")
