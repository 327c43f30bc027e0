"""C16 — A payload cannot choose the code.

A producer holding only the produce permission POSTed to a Tasks queue a
payload naming ``subprocess.getoutput`` with a shell command, and a stock
``fq_worker`` ran it. Now the worker runs only what the project defined as a
task: a ``Task`` (``@task``) in a module of an installed app or of
``FQ_TASK_MODULES``. Any other path is refused before anything is called —
a module outside those is not even imported — and the job ends dead at once
(``PermanentFailure``) with an error that names the path. The same for every
way a job can be written: Python API, REST by a producer, ``fq enqueue``,
``fq import``. See docs/security.md, "What a producer can make a worker do".
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.management import call_command
from django.db import connection

from django_fq import backup, checks
from django_fq import services as fq
from django_fq.tasks import InvalidTask, TaskResultDoesNotExist, TaskResultStatus
from django_fq.testing import drain
from tests.tasks import sample

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parents[2]
Q = "tk.default"
PROBE = "tests.tasks.import_probe"


def hostile(task_path: str, *args, backend: str = "default", **changes) -> dict:
    """A payload shaped like one ``FqBackend.enqueue`` writes, naming ``task_path``."""
    payload = {
        "v": 1,
        "task": task_path,
        "backend": backend,
        "queue_name": "default",
        "priority": 0,
        "run_after": None,
        "takes_context": False,
        "args": list(args),
        "kwargs": {},
    }
    payload.update(changes)
    return payload




def assert_dead_refused(job_id: str, words: str) -> str:
    """The job is dead after one attempt; the first line of its error (the message) holds ``words``."""
    info = fq.get(Q, job_id)
    assert info.state == "dead", info
    assert info.attempts == 1  # dead at once: PermanentFailure, no retry
    message = info.last_error.splitlines()[0]  # then the traceback, as for any failed attempt
    assert message.startswith("PermanentFailure: "), info.last_error
    assert words in message, info.last_error
    return message


def _command(marker: Path) -> str:
    return f"touch {marker}"


# --- the worker refuses what is not a task ---------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "words"),
    [
        ("subprocess.getoutput", "module 'subprocess' is neither inside an installed app nor listed in FQ_TASK_MODULES"),
        ("os.system", "module 'os' is neither inside an installed app"),
        ("builtins.exec", "module 'builtins' is neither inside an installed app"),
        ("django.core.management.call_command", "module 'django.core.management' is neither"),
        # Inside an installed app or FQ_TASK_MODULES, but not a Task: imported, never called.
        ("django_fq.management.commands.fq.Command", "it is a type, not a @task of the Tasks framework"),
        ("tests.tasks.sample.not_a_task", "it is a function, not a @task of the Tasks framework"),
        ("tests.tasks.sample.os", "it is a module, not a @task"),
    ],
)
def test_c16_a_python_api_job_naming_a_callable_that_is_no_task_never_runs_it(tmp_path, path, words):
    marker = tmp_path / "ran"
    job = fq.enqueue(Q, hostile(path, _command(marker))).id

    report = drain(Q)

    assert report.stats.ok == 0
    assert [(j.id, j.outcome) for j in report.jobs] == [(job, "dead")]
    error = assert_dead_refused(job, words)
    assert error.startswith(f"PermanentFailure: task {path!r} refused: ")
    assert not marker.exists()


def test_c16_a_module_outside_the_apps_is_not_even_imported(tmp_path):
    assert PROBE not in sys.modules
    job = fq.enqueue(Q, hostile(f"{PROBE}.run")).id

    drain(Q)

    assert_dead_refused(job, f"module {PROBE!r} is neither inside an installed app")
    assert PROBE not in sys.modules


def test_c16_a_real_task_outside_the_allowed_modules_is_refused_at_enqueue_and_by_the_worker(tmp_path):
    from tests.tasks import outside

    marker = tmp_path / "ran"
    with pytest.raises(InvalidTask) as refused:
        outside.probe.enqueue(str(marker))
    assert str(refused.value).startswith(
        "tests.tasks.outside.probe: module 'tests.tasks.outside' is neither inside an installed app nor listed in "
        "FQ_TASK_MODULES"
    )
    assert "FQ_TASK_MODULES" in str(refused.value)
    assert not fq.queues() or fq.stats(Q).counts.get("ready", 0) == 0

    job = fq.enqueue(Q, hostile("tests.tasks.outside.probe", str(marker))).id  # written by hand
    drain(Q)
    assert_dead_refused(job, "module 'tests.tasks.outside' is neither inside an installed app")
    assert not marker.exists()


NOT_A_PATH = "not a dotted path to a module-level task"


@pytest.mark.parametrize(
    ("path", "words"),
    [
        *[(p, NOT_A_PATH) for p in ("", "subprocess", ".subprocess.getoutput", "os..system", "os.system()", "x" * 2000)],
        (42, "is not a Django Tasks job"),
        (None, "is not a Django Tasks job"),
    ],
)
def test_c16_a_task_field_that_is_not_a_dotted_path_is_refused(path, words):
    payload = hostile("tests.tasks.sample.add", 1, 2)
    payload["task"] = path
    job = fq.enqueue(Q, payload).id

    drain(Q)

    message = assert_dead_refused(job, words)
    assert len(message) < 400  # a long path is cut in the message


def test_c16_the_payloads_backend_must_be_a_django_fq_alias_serving_the_jobs_queue(tmp_path):
    marker = tmp_path / "ran"
    other = fq.enqueue(Q, hostile("tests.tasks.sample.record", "x", backend="oncommit")).id
    unknown = fq.enqueue(Q, hostile("subprocess.getoutput", _command(marker), backend="nope")).id

    drain(Q)

    assert_dead_refused(other, "the Tasks backend 'oncommit', which does not serve the queue 'tk.default'")
    assert_dead_refused(unknown, "the Tasks backend 'nope', which is not a django-fq alias of TASKS")
    assert not marker.exists()


def test_c16_takes_context_and_queue_name_come_from_the_task_not_the_payload(backend):
    # sample.add takes no context: a payload claiming it does cannot make the runner pass one.
    job = fq.enqueue(Q, hostile("tests.tasks.sample.add", 2, 3, takes_context=True, queue_name="low")).id

    assert drain(Q).stats.ok == 1

    done = backend.get_result(job)
    assert done.status == TaskResultStatus.SUCCESSFUL and done.return_value == 5
    assert done.task.queue_name == "default" and done.task.takes_context is False


def test_c16_a_task_kept_under_another_name_than_its_function_still_runs(backend):
    result = sample.renamed.enqueue(21)
    assert fq.get(Q, result.id).payload["task"] == "tests.tasks.sample._renamed_function"

    assert drain(Q).stats.ok == 1

    assert backend.get_result(result.id).return_value == 42


def test_c16_get_result_of_a_refused_job_imports_nothing_and_finds_no_result(backend):
    job = fq.enqueue(Q, hostile(f"{PROBE}.run")).id

    with pytest.raises(TaskResultDoesNotExist):
        backend.get_result(job)
    assert PROBE not in sys.modules


def test_c16_a_wrong_fq_task_modules_is_error_e008_and_refuses_every_task(settings):
    settings.FQ_TASK_MODULES = "tests.tasks.sample"  # a string, not a list

    assert [m.id for m in checks.check_settings(None)] == ["django_fq.E008"]
    job = fq.enqueue(Q, hostile("tests.tasks.sample.add", 1, 2)).id
    drain(Q)
    assert_dead_refused(job, "FQ_TASK_MODULES must be a list of module names")


# --- every way of writing a job ------------------------------------------------------------------


def test_c16_a_producer_posting_through_the_rest_api_cannot_run_a_shell_command(settings, tmp_path):
    from tests.api.conftest import client_as, url

    settings.ROOT_URLCONF = "tests.api.urls"
    marker = tmp_path / "ran"
    producer = client_as("produce")
    fq.configure(Q)  # the queue exists, as a deployed Tasks queue does (a producer cannot create one)

    posted = producer.post(url("jobs", Q), {"payload": hostile("subprocess.getoutput", _command(marker))})
    assert posted.status_code == 201, posted.content
    drain(Q)

    assert_dead_refused(posted.json()["id"], "module 'subprocess' is neither inside an installed app")
    assert not marker.exists()


def test_c16_a_job_written_by_fq_enqueue_cannot_run_a_shell_command(tmp_path):
    marker = tmp_path / "ran"
    out = io.StringIO()
    call_command("fq", "enqueue", Q, json.dumps(hostile("os.system", _command(marker))), "--json", stdout=out)
    job = json.loads(out.getvalue())["id"]

    drain(Q)

    assert_dead_refused(job, "module 'os' is neither inside an installed app")
    assert not marker.exists()


def test_c16_a_job_restored_by_fq_import_cannot_run_a_shell_command(tmp_path):
    marker = tmp_path / "ran"
    job = fq.enqueue(Q, hostile("subprocess.getoutput", _command(marker))).id
    dump = io.StringIO()
    backup.export_jsonl(dump, [Q])
    fq.delete_queue(Q)
    path = tmp_path / "backup.jsonl"
    path.write_text(dump.getvalue())

    call_command("fq", "import", str(path), stdout=io.StringIO(), stderr=io.StringIO())
    assert fq.get(Q, job).state == "ready"
    drain(Q)

    assert_dead_refused(job, "module 'subprocess' is neither inside an installed app")
    assert not marker.exists()


# --- a real fq_worker process ----------------------------------------------------------------------


def test_c16_a_real_fq_worker_runs_no_shell_command_and_imports_no_named_module(tmp_path):
    ran = [tmp_path / "getoutput", tmp_path / "system", tmp_path / "exec"]
    imported = tmp_path / "imported"
    jobs = [
        fq.enqueue(Q, hostile("subprocess.getoutput", _command(ran[0]))).id,
        fq.enqueue(Q, hostile("os.system", _command(ran[1]))).id,
        fq.enqueue(Q, hostile("builtins.exec", f"open({str(ran[2])!r}, 'w').close()")).id,
        fq.enqueue(Q, hostile(f"{PROBE}.run")).id,
    ]
    good = sample.add.enqueue(20, 22)

    env = dict(os.environ)
    env.update(
        DJANGO_SETTINGS_MODULE="tests.tasks.worker_settings",
        PYTHONPATH=str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""),
        FQ_CHILD_DB_NAME=str(connection.settings_dict["NAME"]),
        FQ_C16_IMPORT_MARKER=str(imported),
    )
    proc = subprocess.run(
        [sys.executable, "-m", "django", "fq_worker", "--burst", "--poll-interval", "10", "--queue", Q],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "1 jobs ok, 4 failed" in proc.stdout, proc.stdout
    for job in jobs:
        assert_dead_refused(job, "refused: ")
    assert fq.get(Q, good.id).result == 42  # the worker went on with the real task
    assert not any(p.exists() for p in ran)
    assert not imported.exists()
