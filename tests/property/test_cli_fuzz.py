"""Fuzzing ``manage.py fq`` with malformed input: a clear error, and nothing changes.

Hypothesis builds command lines for every subcommand out of odd values —
numbers past every range (2**63, 1e309, -0, Arabic digits), wrong types,
unicode, NUL bytes and lone surrogates in queue names, payloads, tokens and
paths, oversized payloads, truncated and forged receipts (made from a real
live one), too-long strings — and runs them in-process (``call_command``) on
a queue holding a job in every state. For each run:

* no traceback, and no exception other than the command's own exit;
* a success (exit 0; ``health``: 0-2) is allowed — an odd value may be valid;
* a failure exits non-zero with nothing on stdout and one line on stderr:
  ``fq OP: error: …`` naming the option, or with ``--json`` an object
  ``{"code", "message", "field"}``; and every django-fq table is exactly as it
  was before (all rows compared).

A few runs go through the real ``python -m django fq`` in a child process,
where argparse's usage errors are one line (or a JSON object) as well.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from django.db import connection
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from django_fq import services as fq
from tests.test_cli import fq as cli

from .fuzzing import BAD_PATHS, INT_TEXTS, JSON_TEXTS, QUEUE, QUEUE_NAMES, TEXTS, make_world, snapshot

pytestmark = pytest.mark.django_db

MAX_PAYLOAD = 2000  # FQ_MAX_PAYLOAD_BYTES in these tests: "oversized" stays cheap
OVERSIZED = json.dumps("x" * MAX_PAYLOAD)
#: Error codes that are about one argument: their JSON error must name it.
FIELD_CODES = {
    "invalid", "invalid_queue_name", "invalid_json", "payload_too_large", "count_out_of_range",
    "visibility_out_of_range", "invalid_delay", "invalid_time", "delay_and_at", "invalid_policy",
    "invalid_cursor", "queue_not_found", "job_not_found", "invalid_receipt", "cancelled",
}  # fmt: skip

NO_STDIN = st.none()
ints = st.sampled_from(INT_TEXTS)
texts = st.sampled_from(TEXTS)
queues = st.sampled_from(QUEUE_NAMES)
json_texts = st.sampled_from([*JSON_TEXTS, OVERSIZED])
#: stdin of enqueue-many: JSON documents, and envelopes holding odd values.
envelope_texts = st.one_of(
    json_texts,
    st.builds(
        lambda key, value: json.dumps([{"payload": 1}, {"payload": 2, key: value}]),
        st.sampled_from(["priority", "delay_ms", "at", "idempotency", "unique_key", "max_attempts", "timeout_ms",
                         "idempotency_retention_ms", "payload", "bogus"]),
        st.sampled_from([None, True, -1, 2**63, 1e308, "x", "", "\x00", "\ud800", [], {}, "é" * 300, 10**40]),
    ),
)


def options(**opts) -> st.SearchStrategy[list[str]]:
    """Some of the options ``opts`` (flag -> value strategy), each as ``[flag, value]``."""
    return st.lists(st.sampled_from(sorted(opts)), unique=True, max_size=3).flatmap(
        lambda flags: st.tuples(*[opts[f] for f in flags]).map(
            lambda values: [x for f, v in zip(flags, values, strict=True) for x in (f, v)]
        )
    )


def command(world) -> st.SearchStrategy[tuple[list[str], str | None]]:
    """A command line (without --json) and its stdin."""
    jobs = st.sampled_from(world.job_ids())
    receipts = st.sampled_from(world.receipts())
    enqueue_opts = options(
        **{"--priority": ints, "--delay": ints, "--at": ints, "--idempotency": texts, "--unique-key": texts,
           "--max-attempts": ints, "--timeout": ints, "--idempotency-retention": ints}
    )  # fmt: skip
    policy_opts = options(
        **{"--concurrency": ints, "--max-attempts": ints, "--backoff": ints, "--max-backoff": ints,
           "--visibility": ints, "--idempotency-retention": ints, "--timeout": ints}
    )  # fmt: skip

    def line(*parts, stdin=NO_STDIN):
        return st.tuples(st.tuples(*parts), stdin).map(lambda t: ([x for p in t[0] for x in p], t[1]))

    one = st.just
    return st.one_of(
        line(one(["config"]), queues.map(lambda q: [q]), policy_opts),
        line(one(["delete"]), st.sampled_from([q for q in QUEUE_NAMES if q != QUEUE]).map(lambda q: [q])),
        line(one(["enqueue"]), queues.map(lambda q: [q]), json_texts.map(lambda p: [p]), enqueue_opts),
        line(one(["enqueue", QUEUE, "-"]), enqueue_opts, stdin=json_texts),
        line(one(["enqueue-many"]), queues.map(lambda q: [q]), one(["-"]), stdin=envelope_texts),
        line(one(["enqueue-many", QUEUE]), st.sampled_from(BAD_PATHS).map(lambda p: [p])),
        line(
            one(["claim"]), queues.map(lambda q: [q]),
            options(**{"--count": ints, "--visibility": ints, "--wait": ints, "--worker": texts}),
        ),
        line(one(["ack"]), queues.map(lambda q: [q]), receipts.map(lambda r: [r]), options(**{"--result": json_texts})),
        line(
            one(["nack"]), queues.map(lambda q: [q]), receipts.map(lambda r: [r]),
            options(**{"--delay": ints, "--error": texts, "--permanent": st.just("--permanent")}),
        ),
        line(one(["release"]), queues.map(lambda q: [q]), receipts.map(lambda r: [r]), options(**{"--error": texts})),
        line(one(["extend"]), queues.map(lambda q: [q]), receipts.map(lambda r: [r]), options(**{"--visibility": ints})),
        line(st.sampled_from([["get"], ["retry"], ["requeue"], ["cancel"]]), queues.map(lambda q: [q]), jobs.map(lambda j: [j])),
        line(
            one(["jobs"]), queues.map(lambda q: [q]),
            options(**{"--state": st.sampled_from(["ready", "READY", "", "x\x00"]), "--cursor": texts, "--count": ints}),
        ),
        line(one(["stats"]), queues.map(lambda q: [q])),
        line(one(["wait"]), queues.map(lambda q: [q]), jobs.map(lambda j: [j]), ints.map(lambda t: ["--timeout", t])),
        line(one(["reap"]), queues.map(lambda q: [q]), options(**{"--limit": ints})),
        line(one(["prune"]), options(**{"--retention": ints, "--limit": ints})),
        line(
            one(["health"]), queues.map(lambda q: [q]),
            options(**{"--stuck-lease-ms": ints, "--max-dead": ints, "--max-ready-age-ms": ints}),
        ),
        line(one(["export"]), queues.map(lambda q: [q]), st.sampled_from(BAD_PATHS).map(lambda p: ["--output", p])),
        line(one(["import"]), st.sampled_from(BAD_PATHS).map(lambda p: [p])),
        line(one(["import", "-"]), stdin=st.sampled_from(BACKUPS)),
        line(one([]), st.sampled_from([[], ["frobnicate"], ["--bogus"], ["claim"], ["get", QUEUE]])),
    )


#: stdin of ``fq import``: broken backups (the first line is a valid header where it matters).
HEADER = json.dumps({"format": "django-fq", "version": 1, "exported_at": 0, "database": "sqlite"})
QUEUE_LINE = {
    "type": "queue", "name": "imp", "created_at": 0,
    "policy": {"concurrency": 0, "max_attempts": 1, "backoff_ms": 0, "max_backoff_ms": 0, "visibility_ms": 1,
               "idempotency_retention_ms": 1, "timeout_ms": 0},
    "totals": {},
}  # fmt: skip
BACKUPS = [
    "", "\x00", "[]", "{}", HEADER.replace("1", "2"), "{\"format\": \"django-fq\"",
    HEADER + "\n" + json.dumps({**QUEUE_LINE, "name": "\x00"}),
    HEADER + "\n" + json.dumps({**QUEUE_LINE, "name": "\ud800"}),
    HEADER + "\n" + json.dumps({**QUEUE_LINE, "created_at": 2**63}),
    HEADER + "\n" + json.dumps({**QUEUE_LINE, "policy": {**QUEUE_LINE["policy"], "visibility_ms": 1e309}}),
    HEADER + "\n" + json.dumps(QUEUE_LINE) + "\n" + json.dumps({"type": "job", "queue": "imp", "id": "0" * 32}),
    HEADER + "\n" + json.dumps(QUEUE_LINE) + "\n" + json.dumps({"type": "token", "queue": "imp", "token": "\x00"}),
    HEADER + "\n" + json.dumps(QUEUE_LINE) + "\nnot json",
    HEADER + "\n" + json.dumps(QUEUE_LINE) + "\n" + "\udcff",
]  # fmt: skip


def check_run(argv: list[str], stdin: str | None, as_json: bool, before: dict) -> str:
    """Run ``fq *argv``; assert the contract for its outcome; return ``"ok"`` or the error code."""
    full = [*argv, "--json"] if as_json else argv
    stray = io.StringIO()  # fq health's usage errors go to sys.stderr, wherever the command runs
    with contextlib.redirect_stderr(stray):
        run = cli(*full, stdin=stdin)
    run.err += stray.getvalue()
    shown = f"fq {full!r} (stdin {stdin!r:.80})"
    assert "Traceback" not in run.err, shown
    op = argv[0] if argv else ""
    if run.code == 0 or (op == "health" and run.code in (1, 2)):
        return "ok"
    assert run.code in ((3,) if op == "health" else (1, 2)), (shown, run.code, run.err)
    assert run.out == "", (shown, run.out)
    assert snapshot() == before, f"{shown} failed (exit {run.code}) but changed the database"
    err = run.err.strip()
    assert err and "\n" not in err, (shown, run.err)
    if run.code == 2:  # a usage error, in-process: argparse's message through CommandError
        assert err.startswith("Error: "), (shown, err)
        return "usage"
    if op == "health" and "error: argument" in err:  # fq health's usage error (exit 3)
        return "usage"
    if as_json:
        body = json.loads(err)
        assert set(body) >= {"code", "message"}, (shown, body)
        if body["code"] in FIELD_CODES:
            assert body.get("field"), (shown, body)
        if body["code"] == "invalid_backup":  # a bad line of a backup: its number, and the field if one is to blame
            assert body.get("line"), (shown, body)
        return body["code"]
    assert err.startswith(f"fq {op}: error: "), (shown, err)
    return "error"


@pytest.fixture
def world(settings):
    settings.FQ_MAX_PAYLOAD_BYTES = MAX_PAYLOAD
    return make_world()


def _fuzz(world, examples: int, derandomize: bool) -> dict[str, int]:
    seen: dict[str, int] = {}

    @hsettings(
        max_examples=examples,
        deadline=None,
        derandomize=derandomize,
        database=None,
        suppress_health_check=list(HealthCheck),
        print_blob=True,
    )
    @given(data=st.data())
    def one(data):
        argv, stdin = data.draw(command(world), label="command")
        as_json = data.draw(st.booleans(), label="--json")
        outcome = check_run(argv, stdin, as_json, snapshot())
        seen[outcome] = seen.get(outcome, 0) + 1

    one()
    return seen


def test_odd_command_lines_fail_cleanly_and_change_nothing(world):
    seen = _fuzz(world, examples=200, derandomize=True)
    # The run reached domain errors, usage errors and successes alike.
    assert seen.get("usage", 0) and seen.get("error", 0) and seen.get("ok", 0), seen
    assert len([code for code in seen if code not in ("ok", "usage", "error")]) >= 6, seen


@pytest.mark.slow
def test_many_odd_command_lines(world):
    _fuzz(world, examples=int(os.environ.get("FQ_FUZZ_EXAMPLES", 800)), derandomize=False)


@pytest.mark.parametrize("value", ["\x00", "a\x00b", "\ud800"])
@pytest.mark.parametrize(
    "argv",
    [
        ["enqueue", "{v}", "1"], ["enqueue", QUEUE, "1", "--idempotency", "{v}"],
        ["enqueue", QUEUE, "1", "--unique-key", "{v}"], ["claim", QUEUE, "--worker", "{v}"],
        ["nack", QUEUE, "{v}"], ["release", QUEUE, "{r}", "--error", "{v}"], ["get", QUEUE, "{v}"],
        ["cancel", QUEUE, "{v}"], ["jobs", QUEUE, "--cursor", "{v}"], ["config", "{v}"], ["stats", "{v}"],
        ["health", "{v}"], ["export", "{v}"], ["export", "--output", "{v}"], ["import", "{v}"],
        ["enqueue-many", QUEUE, "{v}"], ["reap", "{v}"], ["delete", "{v}"],
    ],
)  # fmt: skip
def test_nul_bytes_and_lone_surrogates_in_every_text_argument(world, argv, value):
    """Every command refuses NUL and lone surrogates in any name, id, key or path, by name, changing nothing.

    Error texts are the exception: they are stored with NUL escaped and lone
    surrogates replaced (docs/reference/semantics.md §9 caps them; it does not refuse them).
    """
    argv = [a.replace("{v}", value).replace("{r}", world.receipt) for a in argv]
    outcomes = [check_run(argv, None, as_json, snapshot()) for as_json in (False, True)]
    if "--error" in argv:
        assert outcomes[0] == "ok", outcomes
        assert "\x00" not in fq.get(QUEUE, world.ids["running"]).last_error
    else:
        assert "ok" not in outcomes, (argv, outcomes)


@pytest.mark.slow  # child processes: the in-process tests above cover the same inputs in the fast tier
@pytest.mark.django_db(transaction=True)
def test_the_real_command_line(tmp_path):
    """``python -m django fq`` in a child process: usage errors, NUL-free odd values, forged receipts.

    (A NUL byte cannot travel in a process's arguments: those cases run in-process above.)
    """
    world = make_world()
    name = connection.settings_dict["NAME"]  # the test database
    (tmp_path / "cli_settings.py").write_text(
        textwrap.dedent(
            f"""
            from tests.settings import *  # noqa: F403
            DATABASES = {{"default": {{**DATABASES["default"], "NAME": {name!r}}}}}  # noqa: F405
            FQ_MAX_PAYLOAD_BYTES = {MAX_PAYLOAD}
            """
        )
    )
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(root)]), "DJANGO_SETTINGS_MODULE": "cli_settings"}

    def real(*argv, stdin: str = ""):
        return subprocess.run(
            [sys.executable, "-m", "django", "fq", *argv],
            env=env, cwd=root, capture_output=True, text=True, timeout=60, input=stdin,
        )  # fmt: skip

    cases = [
        (["claim", QUEUE, "--count", "abc"], "--count"),
        (["claim", QUEUE, "--count", "9223372036854775808"], "count"),
        (["enqueue", QUEUE, "1", "--priority", "1e309"], "--priority"),
        (["enqueue", QUEUE, OVERSIZED], "payload"),
        (["enqueue", QUEUE, "NaN"], "payload"),
        (["ack", QUEUE, world.receipts()[1]], "receipt"),
        (["ack", QUEUE, world.receipts()[6]], "receipt"),
        (["jobs", QUEUE, "--state", "nope"], "--state"),
        (["get", QUEUE], "JOB_ID"),
        (["frobnicate"], None),
        (["health", "--max-dead", "lots"], "--max-dead"),
        (["extend", QUEUE, world.receipt], "--visibility"),
    ]
    for i, (argv, field) in enumerate(cases):
        as_json = i % 2 == 1  # each case once, half of them with --json (a child process costs a second)
        before = snapshot()
        done = real(*argv, *(["--json"] if as_json else []))
        shown = (argv, as_json, done.returncode, done.stderr)
        assert done.returncode in ((3,) if argv[0] == "health" else (1, 2)), shown
        assert done.stdout == "" and "Traceback" not in done.stderr, shown
        err = done.stderr.strip()
        assert err and "\n" not in err, shown
        if as_json:
            body = json.loads(err)
            assert body["code"] and body["message"], shown
            if field is not None:
                assert body["field"] == field, shown
        else:
            assert "error: " in err, shown
            if field is not None:
                assert field in err, shown
        assert snapshot() == before, shown
    # The live lease survived every forged receipt; the real one still works.
    assert fq.get(QUEUE, world.ids["running"]).state == "running"
    assert real("ack", QUEUE, world.receipt, "--json").returncode == 0
