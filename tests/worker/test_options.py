"""fq_worker's options come from one declaration (django_fq.worker.options.WorkerOptions).

The command's parser, its defaults, the validation and the argv of the
``--processes`` children all come from it: a child parses back exactly its
parent's options (one process, no progress bar, the reaper only in child 0).
"""

from __future__ import annotations

import dataclasses

import pytest

from django_fq.management.commands.fq_worker import Command
from django_fq.worker import Worker, WorkerConfigError, WorkerOptions

#: A value for every option, none of them its default.
EVERYTHING = [
    "--queue=t.ok",
    "--queue=t.fail",
    "--concurrency=7",
    "--prefetch=3",
    "--processes=3",
    "--burst",
    "--visibility=4500",
    "--grace=2.5",
    "--poll-interval=15",
    "--max-poll-interval=900",
    "--reaper-interval=250",
    "--prune-interval=0",
    "--max-jobs=11",
    "--worker-id=host a=b",
    "--no-progress",
    "--metrics-port=9400",
    "--metrics-addr=::1",
    "--pool=processes",
    "--soft-timeout-ms=250",
    "--max-jobs-per-child=5",
]


def parse(argv: list[str]) -> WorkerOptions:
    """What ``manage.py fq_worker ARGV`` makes of its arguments."""
    parser = Command().create_parser("manage.py", "fq_worker")
    return WorkerOptions.from_options(vars(parser.parse_args(argv)))


def test_no_argument_gives_the_dataclass_defaults():
    assert parse([]) == WorkerOptions()


def test_every_option_is_declared_once_and_none_is_left_at_its_default_here():
    opts = parse(EVERYTHING)
    defaults = WorkerOptions()
    at_default = [f.name for f in dataclasses.fields(opts) if getattr(opts, f.name) == getattr(defaults, f.name)]
    assert at_default == ["no_reaper"]  # left out above, so the children's reaper rule shows
    assert parse([*EVERYTHING, "--no-reaper"]).no_reaper is True
    assert opts.queues == ("t.ok", "t.fail") and opts.worker_id == "host a=b" and opts.grace == 2.5
    opts.validate()


def test_an_options_argv_parses_back_to_the_same_options():
    for argv in ([], EVERYTHING, [*EVERYTHING, "--no-reaper"], ["--no-reaper", "--queue=t.ok"]):
        opts = parse(argv)
        assert parse(opts.argv()) == opts


@pytest.mark.parametrize("index", [0, 1, 2])
def test_each_supervised_child_parses_back_its_parents_options_for_one_process(index):
    parent = parse(EVERYTHING)
    argv = parent.child_argv(index, verbosity=2)
    assert argv[-1] == "--verbosity=2"
    child = parse(argv[:-1])
    expected = dataclasses.replace(parent, processes=1, no_progress=True, no_reaper=index > 0)
    assert child == expected == parent.child(index)
    child.validate()
    # The child hands on what the worker gets, the same as the parent would (one reaper per supervisor).
    parent_kwargs, child_kwargs = parent.worker_kwargs(), child.worker_kwargs()
    assert child_kwargs.pop("reaper") is (index == 0)
    assert parent_kwargs.pop("reaper") is True
    assert child_kwargs == parent_kwargs


def test_worker_kwargs_build_a_worker_with_those_settings():
    opts = parse(["--queue=t.ok", "--concurrency=3", "--prefetch=2", "--visibility=2500", "--grace=1", "--no-reaper"])
    worker = Worker(handlers={"t.ok": lambda job: None}, **opts.worker_kwargs())
    assert (worker.queues, worker.concurrency, worker.capacity, worker.visibility_ms) == (["t.ok"], 3, 5, 2500)
    assert (worker.grace_s, worker.reaper, worker.reaping) == (1.0, False, None)
    assert worker.poll_interval_s == 0.2 and worker.prune_interval_s == 60.0


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--queue=bad name"], "invalid queue name 'bad name'"),
        (["--concurrency=0"], "--concurrency must be between 1 and 1000"),
        (["--prefetch=10001"], "--prefetch must be between 0 and 10000"),
        (["--processes=257"], "--processes must be between 1 and 256"),
        (["--visibility=0"], "--visibility: "),
        (["--grace=-1"], "--grace must be between 0 and 86400 seconds"),
        (["--grace=nan"], "--grace must be between 0 and 86400 seconds"),
        (["--poll-interval=3600001"], "--poll-interval must be between 0 and 3600000 ms"),
        (["--prune-interval=-1"], "--prune-interval must be between 0 and 3600000 ms"),
        (["--poll-interval=500", "--max-poll-interval=100"], "--max-poll-interval must not be below --poll-interval"),
        (["--max-jobs=0"], "--max-jobs must be at least 1"),
        (["--worker-id="], "--worker-id must be 1-200 characters"),
        (["--worker-id=" + "w" * 199, "--processes=2"], r"--worker-id must be 1-198 characters .*each process adds -INDEX"),
        (["--metrics-port=65535", "--processes=2"], "--metrics-port must be between 0 and 65535"),
        (["--pool=forks"], "--pool must be 'threads' or 'processes'"),
        (["--pool=processes", "--soft-timeout-ms=-1"], "--soft-timeout-ms must be between 0 and 604800000"),
        (["--pool=processes", "--max-jobs-per-child=0"], "--max-jobs-per-child must be at least 1"),
        (["--soft-timeout-ms=500"], r"--soft-timeout-ms needs --pool processes"),
        (["--pool=threads", "--max-jobs-per-child=3"], r"--max-jobs-per-child needs --pool processes \(only that"),
    ],
)
def test_each_bad_value_is_refused_with_its_flag(argv, message):
    with pytest.raises(WorkerConfigError, match=message):
        parse(argv).validate()


def test_the_pool_options_build_the_process_pool_and_threads_stay_the_default():
    from django_fq.worker.procpool import ProcessPool
    from django_fq.worker.runner import ThreadPool
    from tests.testapp.fq_handlers_procpool import proc_controlled

    handlers = {"t.proc": proc_controlled}
    assert type(Worker(handlers=handlers, **parse([]).worker_kwargs()).pool) is ThreadPool
    opts = parse(["--pool=processes", "--max-jobs-per-child=4"])
    worker = Worker(handlers=handlers, **opts.worker_kwargs())
    assert type(worker.pool) is ProcessPool
    assert (worker.soft_timeout_ms, worker.max_jobs_per_child) == (1000, 4)  # the soft timeout's default
    assert Worker(handlers=handlers, pool="processes", soft_timeout_ms=0).soft_timeout_ms == 0
    # A supervised child gets the pool options too.
    assert "--pool=processes" in parse(["--pool=processes", "--processes=2"]).child_argv(1)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"pool": "forks"}, "pool must be 'threads', 'processes'"),
        ({"pool": 3}, "pool must be 'threads', 'processes' or a callable"),
        ({"pool": "processes", "soft_timeout_ms": -5}, "soft_timeout_ms must be between 0 and 604800000"),
        ({"pool": "processes", "max_jobs_per_child": 0}, "max_jobs_per_child must be at least 1"),
    ],
)
def test_bad_pool_arguments_of_the_worker_are_refused(kwargs, message):
    from tests.testapp.fq_handlers_procpool import proc_controlled

    with pytest.raises(WorkerConfigError, match=message):
        Worker(handlers={"t.proc": proc_controlled}, **kwargs)


def test_a_handler_a_child_process_cannot_import_is_refused_at_once():
    def local_handler(job):
        return None

    with pytest.raises(WorkerConfigError, match=r"handler of queue 't.proc' .*local_handler.* cannot be imported by name"):
        Worker(handlers={"t.proc": local_handler}, pool="processes")
    with pytest.raises(WorkerConfigError, match="cannot be imported by name"):
        Worker(handlers={"t.proc": lambda job: None}, pool="processes")
