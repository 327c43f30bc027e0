"""Kill storms on a workflow and on a batch: real ``fq_worker`` processes ``kill -9``-ed while they work.

Issue 16 ("Shown by"): a 2,000-step workflow and a batch of many members
drained by several worker processes, one of them killed every 1–2 s and
replaced at once (for the first 30 s from the first claim, while at least two
workers are up; then the work finishes unharmed), on SQLite, PostgreSQL and
MariaDB. Both scenarios are bounded in time, stop by themselves and return an
:class:`~tests.chaos.scenarios.Outcome` (nothing is asserted here): the
invariant report of :func:`tests.chaos.invariants.check` over their queues,
plus ``problems`` for every rule of dependencies and batches that broke.

* :func:`workflow_storm` — a layered workflow (see :func:`build_workflow`):
  a chain, a fan-out to 500 steps, 500 steps each after two of those, a
  fan-in to one step, 99 chains of 10 after it, and a callback of the group
  of the chains' last steps. Checked after the storm: every step succeeded
  and ran at least once; no lease of a step was granted, and no run of its
  handler started, before every one of its dependencies had succeeded (the
  handler's start rows, written as it begins, so a run killed half-way
  counts; ack times are the jobs' ``finished_at``, all on the database
  clock); each run that read ``job.upstream`` saw every dependency
  succeeded with its result; the callback's queue got exactly one job,
  which succeeded; nothing is left waiting, held, queued or running; the
  dependency edges and ``workflows.show`` match the graph built.
* :func:`batch_storm` — a batch with a callback, its members added in
  several calls while the workers already run them: most succeed, some
  always fail and go dead when their 2 attempts are used, some depend on
  such a member and are cancelled by it, some are cancelled by the test
  (scheduled far ahead, or racing the workers), a few dead ones are retried
  before the seal. Checked: the callback's queue got exactly one job, enqueued
  after the seal and after the last member finished, and its counts (and the
  batch row's) equal the members' real final states.

At-least-once: a step may run twice (its first run killed, or its ack lost),
so a step has one or more start rows; the rule is that none of them is
earlier than the ack of any of its dependencies.
"""

from __future__ import annotations

import collections
import itertools
import random
import time
from pathlib import Path

from django.db import connection

from django_fq import batches, workflows
from django_fq import services as fq
from django_fq.exceptions import InvalidState
from django_fq.models import ACTIVE

from . import invariants, procs
from .scenarios import FAST, Outcome, _fresh, _kill_and_replace, _stop_all, _wait_drained, _working_pids

FLOW = "chaos.flow"
FLOW_CB = "chaos.flow.cb"
BATCH = "chaos.batch"
BATCH_CB = "chaos.batch.cb"
#: The storm goes on past its ``storm_s`` until it has killed this many workers (a loaded machine
#: starts processes slowly, and a kill waits until two workers are up).
MIN_KILLS = 5


def build_workflow(rng: random.Random, *, head: int = 8, fan: int = 500, chains: int = 99, chain_len: int = 10):
    """The storm's workflow: ``(Workflow, {step: [its dependencies' step names]}, callback name)``.

    Layers: a chain of ``head`` steps; ``fan`` steps after its last (fan-out);
    ``fan`` steps, step *i* after fan steps *i* and *i+1* (mod ``fan``); one
    ``join`` step after all of those (fan-in); ``chains`` chains of
    ``chain_len`` steps, each starting after ``join``; a callback (its own
    queue) after the group of the chains' last steps. The defaults make
    8 + 500 + 500 + 1 + 990 + 1 = 2,000 steps. Each step sleeps 0–10 ms;
    every step with dependencies reads ``job.upstream``.
    """
    wf = workflows.Workflow()
    deps: dict[str, list[str]] = {}

    def step(name: str, after: list) -> workflows.Step:
        s = wf.step(FLOW, {"sleep_ms": rng.choice((0, 0, 1, 2, 5, 10)), "deps": bool(after)}, name=name, after=after)
        deps[name] = [a.name for a in after]
        return s

    heads = [step("head-0", [])]
    for i in range(1, head):
        heads.append(step(f"head-{i}", [heads[-1]]))
    wide = [step(f"fan-{i}", [heads[-1]]) for i in range(fan)]
    mixed = [step(f"mix-{i}", [wide[i], wide[(i + 1) % fan]]) for i in range(fan)]
    join = wf.step(FLOW, {"sleep_ms": 1, "deps": True}, name="join", after=[wf.group(*mixed)])
    deps["join"] = [m.name for m in mixed]
    tails = []
    for c in range(chains):
        links = [wf.step(FLOW, {"sleep_ms": rng.choice((0, 1, 2, 5)), "deps": True}, name=f"chain-{c}-{k}")
                 for k in range(chain_len)]
        wf.add_edges(links[0], [join])
        wf.chain(*links)
        deps[links[0].name] = ["join"]
        for a, b in itertools.pairwise(links):
            deps[b.name] = [a.name]
        tails.append(links[-1])
    wf.callback(wf.group(*tails), FLOW_CB, {"deps": True, "role": "callback"}, name="callback")
    deps["callback"] = [t.name for t in tails]
    return wf, deps, "callback"


def _storm(outcome: Outcome, logs: Path, queues: tuple[str, ...], *, workers: int, concurrency: int, visibility_ms: int,
           kill_every_s: tuple[float, float], storm_s: float, rng: random.Random, done, tick=None, hard_stop: float,
           progress=None):
    """Run ``workers`` fq_worker processes on ``queues``; kill one every ``kill_every_s`` for ``storm_s``, until ``done()``.

    The storm's clock starts at the first claim (start-up can take seconds);
    after ``storm_s`` (and at least :data:`MIN_KILLS` kills) the workers
    finish the work unharmed, until ``done()``
    or ``hard_stop`` (``time.monotonic()``). The victim is a worker holding a
    live lease when there is one (a kill then lands mid-run), else one that
    has claimed before (a process still starting holds nothing), and only
    while at least two live workers have claimed: on a loaded machine a new
    process needs many seconds to start, and a pool of processes still
    starting would make no progress. It is replaced at once. ``tick()`` runs
    every 0.1 s (the batch storm adds its members from there). Returns every
    process started; the survivors are stopped with SIGTERM and must exit 0.
    """
    n_started = 0

    def start() -> procs.Proc:
        nonlocal n_started
        n_started += 1
        extra = ("--prefetch=4",) if n_started % 2 else ()
        more = [f"--queue={q}" for q in queues[1:]]
        return procs.worker(queues[0], logs / f"worker-{n_started:03d}.log", *more, f"--concurrency={concurrency}",
                            f"--visibility={visibility_ms}", *extra, *FAST, env={"FQ_CHAOS_TAG": f"w{n_started}"})

    live = [start() for _ in range(workers)]
    everyone = list(live)
    last_note = 0.0
    storm_until = None
    try:
        while time.monotonic() < hard_stop:
            wake = time.monotonic() + rng.uniform(*kill_every_s)
            while (left := wake - time.monotonic()) > 0:
                time.sleep(min(0.1, left))
                if tick is not None:
                    tick()
            if done():
                break
            working = _working_pids()
            if storm_until is None and working:
                storm_until = time.monotonic() + storm_s
            if storm_until is None or (time.monotonic() >= storm_until and outcome.kills >= MIN_KILLS):
                continue  # before the first claim, or after the storm: let the workers work
            if sum(1 for w in live if w.pid in working) < 2:
                continue
            holding = _lease_pids()
            ready = [w for w in live if w.pid in holding] or [w for w in live if w.pid in working]
            if not ready:
                continue
            _kill_and_replace(ready[rng.randrange(len(ready))], live, everyone, start, outcome)
            if progress and time.monotonic() - last_note > 5:
                last_note = time.monotonic()
                progress(f"{outcome.scenario}: {outcome.kills} kills")
        if not done():
            outcome.problems.append("the storm did not finish in time")
        if not _wait_drained(list(queues), max(30.0, hard_stop - time.monotonic()), progress, outcome.scenario):
            outcome.problems.append("the queues were not drained in time")
    finally:
        _stop_all(live, outcome.problems)
        for w in everyone:
            if w.alive():
                w.kill()
    outcome.problems += [f"forbidden log line: {line}" for line in procs.forbidden_lines(everyone)]
    outcome.notes["processes"] = len(everyone)
    return everyone


def _lease_pids() -> set[int]:
    """Pids of the worker processes holding a live lease row now."""
    return _working_pids("django_fq_lease")


def _rows(sql: str, params=()) -> list[tuple]:
    with connection.cursor() as cur:
        cur.execute(sql, list(params))
        return cur.fetchall()


def _marks(n: int) -> str:
    return ", ".join(["%s"] * n)


def _jobs_ever(queue: str) -> list[str]:
    """Ids of every job ever inserted in ``queue`` (the audit's insert log: a pruned job is still there)."""
    return [uid for (uid,) in _rows(
        "SELECT j.uid FROM fqchaos_job j JOIN django_fq_queue q ON q.id = j.queue_id WHERE q.name = %s", [queue])]


def _left_unfinished(queues) -> dict[str, int]:
    """``{stored state: jobs}`` of the jobs of ``queues`` still waiting, queued, held or running."""
    active = [str(s) for s in ACTIVE]
    return dict(_rows(
        f"SELECT j.state, COUNT(*) FROM django_fq_job j JOIN django_fq_queue q ON q.id = j.queue_id "
        f"WHERE q.name IN ({_marks(len(queues))}) AND j.state IN ({_marks(len(active))}) GROUP BY j.state",
        [*queues, *active]))


def _by_uid(sql_head: str, uids: list[str], extra=()) -> list[tuple]:
    """Rows of ``sql_head`` + `` WHERE <col> IN (uids)`` read 500 ids at a time (``sql_head`` ends with the column)."""
    out = []
    for i in range(0, len(uids), 500):
        part = uids[i : i + 500]
        out += _rows(f"{sql_head} IN ({_marks(len(part))})", [*part, *extra])
    return out


# --- the workflow storm ---------------------------------------------------------------------------------------


def workflow_storm(
    out: Path,
    *,
    workers: int = 4,
    concurrency: int = 4,
    visibility_ms: int = 2000,
    kill_every_s: tuple[float, float] = (1.0, 2.0),
    storm_s: float = 30.0,
    seed: int = 1,
    timeout_s: float = 900.0,
    progress=None,
    **shape,
) -> Outcome:
    """A 2,000-step workflow (:func:`build_workflow`; ``shape`` resizes it) drained under a kill storm.

    See the module docstring for what is checked. Kills go on for ``storm_s``
    seconds from the first claim (every 1–2 s, see :func:`_storm`); then the
    workflow finishes unharmed. ``timeout_s`` bounds the whole run (the
    drain gets at least 30 s more).
    """
    rng = random.Random(seed)
    started = time.monotonic()
    queues = (FLOW, FLOW_CB)
    _fresh(queues)
    invariants.install()
    for q in queues:
        fq.configure(q, max_attempts=1000, backoff_ms=0, visibility_ms=visibility_ms)
    outcome = Outcome("workflow-storm", invariants.Report(list(queues)))
    wf, deps, cb = build_workflow(rng, **shape)
    ids = wf.enqueue()
    outcome.notes["steps"] = len(ids)
    cb_id = ids[cb]

    def done() -> bool:
        return fq.get(FLOW_CB, cb_id).state in ("succeeded", "dead", "cancelled")

    _storm(outcome, out / "workflow-storm", queues, workers=workers, concurrency=concurrency,
           visibility_ms=visibility_ms, kill_every_s=kill_every_s, storm_s=storm_s, rng=rng, done=done,
           hard_stop=started + timeout_s, progress=progress)
    outcome.report = invariants.check(list(queues), visibility_ms=visibility_ms, drained=True)
    outcome.problems += check_workflow(ids, deps, cb)
    outcome.notes.update(workers=workers, concurrency=concurrency, visibility_ms=visibility_ms)
    if outcome.kills == 0:
        outcome.problems.append("no worker was killed: the workflow finished before the first kill")
    outcome.took_s = time.monotonic() - started
    return outcome


def check_workflow(ids: dict[str, str], deps: dict[str, list[str]], cb: str) -> list[str]:
    """Every rule of dependencies the workflow storm checks (module docstring); returns the problems found.

    ``ids``: ``{step name: job id}`` as ``Workflow.enqueue`` returned them;
    ``deps``: ``{step name: [names of its dependencies]}`` as built; ``cb``:
    the callback's step name (its job alone in :data:`FLOW_CB`, every other
    step in :data:`FLOW`).
    """
    problems: list[str] = []
    uids = list(ids.values())
    name_of = {uid: name for name, uid in ids.items()}
    jobs = {uid: (seq, state, finished) for uid, seq, state, finished in _by_uid(
        "SELECT uid, seq, state, finished_at FROM django_fq_job WHERE uid", uids)}
    not_done = collections.Counter(jobs[u][1] if u in jobs else "missing" for u in uids)
    del not_done["succeeded"]
    if not_done:
        problems.append(f"steps not succeeded: {dict(not_done)}")
    left = _left_unfinished([FLOW, FLOW_CB])
    if left:
        problems.append(f"jobs left unfinished (stored states): {left}")
    seq_of = {uid: row[0] for uid, row in jobs.items()}
    # The edges in the database are exactly those of the graph built.
    uid_of_seq = {seq: uid for uid, seq in seq_of.items()}
    stored = collections.defaultdict(set)
    for job_seq, up_seq in _rows_in("SELECT job_id, upstream_id FROM django_fq_dependency WHERE job_id", list(uid_of_seq)):
        stored[name_of[uid_of_seq[job_seq]]].add(name_of.get(uid_of_seq.get(up_seq, ""), f"seq {up_seq}"))
    built = {name: set(ups) for name, ups in deps.items() if ups}
    if dict(stored) != built:
        wrong = sorted(n for n in set(stored) | set(built) if stored.get(n) != built.get(n))
        problems.append(f"{len(wrong)} steps have other edges stored than built, e.g. {wrong[:3]}")
    # When each step became runnable: the last ack among its dependencies (database clock).
    ready_at = {}
    for name, ups in deps.items():
        if ups:
            ends = [jobs[ids[u]][2] for u in ups if ids[u] in jobs]
            if len(ends) != len(ups) or any(e is None for e in ends):
                problems.append(f"step {name}: a dependency has no finish time")
                continue
            ready_at[ids[name]] = max(ends)
    leases = collections.defaultdict(list)
    for seq, claimed in _rows_in("SELECT job_seq, claimed_at FROM fqchaos_lease WHERE job_seq", list(uid_of_seq)):
        leases[uid_of_seq[seq]].append(claimed)
    starts = collections.defaultdict(list)
    for uid, claimed, started, seen, bad in _by_uid(
        "SELECT job_uid, claimed_at, started, upstream_seen, upstream_bad FROM fqchaos_start WHERE job_uid", uids
    ):
        starts[uid].append((claimed, started, seen, bad))
    runs = collections.Counter(uid for (uid,) in _by_uid("SELECT job_uid FROM fqchaos_run WHERE job_uid", uids))
    early = []
    for uid in uids:
        name = name_of[uid]
        if runs[uid] < 1 or not starts[uid]:
            problems.append(f"step {name} never ran to its end (runs {runs[uid]}, starts {len(starts[uid])})")
        at = ready_at.get(uid)
        if at is not None:
            early += [f"step {name}: lease granted at {c}, its last dependency acked at {at}" for c in leases[uid] if c < at]
            early += [f"step {name}: run started at {s}, its last dependency acked at {at}" for _, s, _, _ in starts[uid] if s < at]
        for claimed, _s, seen, bad in starts[uid]:
            if claimed not in leases[uid]:
                problems.append(f"step {name}: a run started under no lease of the job (claimed_at {claimed})")
            if deps[name] and (seen != len(deps[name]) or bad):
                problems.append(f"step {name}: job.upstream had {seen} entries ({bad} not succeeded), expected {len(deps[name])}")
    problems += early[:20]
    if len(early) > 20:
        problems.append(f"... {len(early) - 20} more runs before their dependencies succeeded")
    callbacks = _jobs_ever(FLOW_CB)
    if callbacks != [ids[cb]]:
        problems.append(f"the callback's queue got {len(callbacks)} jobs, expected exactly the callback {ids[cb]}")
    info = workflows.show(FLOW, ids[next(n for n, ups in deps.items() if not ups)])
    states = collections.Counter(s["state"] for s in info.steps)
    if info.truncated or len(info.steps) != len(ids) or states != {"succeeded": len(ids)}:
        problems.append(f"workflows.show: {len(info.steps)} steps {dict(states)} truncated={info.truncated}")
    for queue, n in ((FLOW, len(ids) - 1), (FLOW_CB, 1)):
        s = fq.stats(queue)
        if s.counts["succeeded"] != n or s.totals["enqueued"] != n or s.counts["waiting"]:
            problems.append(f"{queue}: stats {s.counts}, enqueued {s.totals['enqueued']}, expected {n} succeeded")
    return problems


def _rows_in(sql_head: str, ints: list[int]) -> list[tuple]:
    out = []
    for i in range(0, len(ints), 500):
        part = ints[i : i + 500]
        out += _rows(f"{sql_head} IN ({invariants._in(part)[1:-1]})")
    return out


# --- the batch storm ------------------------------------------------------------------------------------------


def batch_storm(
    out: Path,
    *,
    members: int = 2000,
    calls: int = 4,
    workers: int = 4,
    concurrency: int = 4,
    visibility_ms: int = 2000,
    kill_every_s: tuple[float, float] = (1.0, 2.0),
    storm_s: float = 30.0,
    spread_s: float = 4.0,
    seed: int = 1,
    timeout_s: float = 900.0,
    progress=None,
) -> Outcome:
    """A batch of ``members`` jobs, added in ``calls`` calls while killed workers run them (module docstring).

    Per call: about 6 % of the items always fail (``max_attempts=2``: dead
    once both attempts are used, by a nack or a killed run's expiry), 3 %
    depend on a failing member of an earlier call (cancelled when it dies,
    or created cancelled when it is dead already), 4 % are scheduled an hour
    ahead and cancelled at once, 1 % are cancelled right away while the
    workers race them (cancelled, or succeeded first); the rest succeed. The
    next call comes once half the members so far have finished and
    ``spread_s`` seconds after the one before (so the storm lasts through
    several kills however fast the machine); before the seal, up to 5 dead
    members are retried (they fail again).
    """
    rng = random.Random(seed)
    started = time.monotonic()
    queues = (BATCH, BATCH_CB)
    _fresh(queues)
    invariants.install()
    for q in queues:
        fq.configure(q, max_attempts=1000, backoff_ms=0, visibility_ms=visibility_ms)
    outcome = Outcome("batch-storm", invariants.Report(list(queues)))
    b = batches.create(BATCH, callback={"queue": BATCH_CB, "payload": {"role": "batch-callback"}})
    per_call = [members // calls + (1 if i < members % calls else 0) for i in range(calls)]
    added: list[str] = []
    failing: list[str] = []
    plan = {"calls": 0, "cancel_tries": 0, "retried": 0, "sealed": False, "last_add": 0.0}
    wiped: dict[str, int] = {}  # attempts each retry reset, for the checker's attempts rule

    def add_call() -> None:
        items, kinds = [], []
        for _ in range(per_call[plan["calls"]]):
            roll = rng.random()
            if roll < 0.06:
                items.append({"payload": {"fail": True}, "max_attempts": 2})
                kinds.append("fail")
            elif roll < 0.09 and failing:
                up = rng.choice(failing)
                items.append({"payload": {"sleep_ms": 1, "deps": True}, "depends_on": [up]})
                kinds.append("dependent")
            elif roll < 0.13:
                items.append({"payload": {"sleep_ms": 0}, "delay_ms": 3_600_000})
                kinds.append("late")
            elif roll < 0.14:
                items.append({"payload": {"sleep_ms": rng.choice((0, 5, 20))}})
                kinds.append("race")
            else:
                items.append({"payload": {"sleep_ms": rng.choice((0, 0, 1, 2, 5))}})
                kinds.append("ok")
        results = batches.add(b.id, items)
        plan["calls"] += 1
        plan["last_add"] = time.monotonic()
        for r, kind in zip(results, kinds, strict=True):
            added.append(r.id)
            if kind == "fail":
                failing.append(r.id)
            elif kind in ("late", "race"):
                plan["cancel_tries"] += 1
                try:
                    fq.cancel(BATCH, r.id)
                except InvalidState:
                    pass  # it finished first: counted as whatever it became

    def finished_members() -> int:
        info = batches.get(b.id)
        return info.done

    def tick() -> None:
        if plan["sealed"]:
            return
        if plan["calls"] < calls:
            if plan["calls"] == 0 or (time.monotonic() >= plan["last_add"] + spread_s
                                      and finished_members() >= len(added) // 2):
                add_call()
            return
        dead = [uid for (uid,) in _by_uid("SELECT uid FROM django_fq_job WHERE state = 'dead' AND uid", failing)]
        if len(dead) < min(5, len(failing)) and time.monotonic() < started + timeout_s / 2:
            return  # let a few members die first, to retry them before the seal
        for uid in dead[:5]:
            wiped[uid] = wiped.get(uid, 0) + fq.get(BATCH, uid).attempts  # dead: nobody claims it meanwhile
            fq.retry(BATCH, uid)
            plan["retried"] += 1
        batches.seal(b.id)
        plan["sealed"] = True

    def done() -> bool:
        return plan["sealed"] and batches.get(b.id).state == "finished" and _left_unfinished(queues) == {}

    _storm(outcome, out / "batch-storm", queues, workers=workers, concurrency=concurrency,
           visibility_ms=visibility_ms, kill_every_s=kill_every_s, storm_s=storm_s, rng=rng, done=done, tick=tick,
           hard_stop=started + timeout_s, progress=progress)
    outcome.report = invariants.check(list(queues), visibility_ms=visibility_ms, drained=True, retried=wiped)
    outcome.problems += check_batch(b.id, added)
    final = batches.get(b.id)
    outcome.notes.update(workers=workers, members=len(added), calls=plan["calls"], retried=plan["retried"],
                         cancel_tries=plan["cancel_tries"], succeeded=final.succeeded, dead=final.dead,
                         cancelled=final.cancelled)
    if outcome.kills == 0:
        outcome.problems.append("no worker was killed: the batch finished before the first kill")
    outcome.took_s = time.monotonic() - started
    return outcome


def check_batch(batch_id: str, added: list[str]) -> list[str]:
    """The batch storm's rules (module docstring); returns the problems found.

    ``added``: the ids of every member the storm added (the callback's queue
    is :data:`BATCH_CB`).
    """
    problems: list[str] = []
    info = batches.get(batch_id)
    members = dict(_rows(
        "SELECT j.uid, j.state FROM django_fq_batch_member m JOIN django_fq_job j ON j.seq = m.job_id "
        "JOIN django_fq_batch b ON b.id = m.batch_id WHERE b.uid = %s", [batch_id]))
    if set(members) != set(added) or info.total != len(added):
        problems.append(f"members: {len(members)} in the database, {len(added)} added, total {info.total}")
    real = collections.Counter(members.values())
    if set(real) - {"succeeded", "dead", "cancelled"}:
        problems.append(f"members not finished: {dict(real)}")
    counts = {k: real.get(k, 0) for k in ("succeeded", "dead", "cancelled")}
    row = {"succeeded": info.succeeded, "dead": info.dead, "cancelled": info.cancelled}
    if row != counts:
        problems.append(f"the batch row counts {row}, the members are {counts}")
    if info.state != "finished":
        problems.append(f"the batch is {info.state}, not finished")
    callbacks = _jobs_ever(BATCH_CB)
    if len(callbacks) != 1 or info.callback_job != callbacks[0]:
        problems.append(f"the callback's queue got {len(callbacks)} jobs {callbacks[:3]}; the batch names {info.callback_job}")
        return problems
    cb = fq.get(BATCH_CB, callbacks[0])
    if cb.state != "succeeded":
        problems.append(f"the callback is {cb.state}")
    carried = cb.metadata.get("batch") or {}
    expect = {"id": batch_id, "total": len(added), **counts}
    if carried != expect:
        problems.append(f"the callback carries {carried}, the members are {expect}")
    if not all(counts.values()):
        problems.append(f"the storm did not make every outcome: {counts}")
    ends = [f for (f,) in _by_uid("SELECT finished_at FROM django_fq_job WHERE uid", added)]
    if None in ends:
        problems.append(f"{ends.count(None)} members have no finish time")
        return problems
    last = max(ends)
    if cb.enqueued_at < last or info.sealed_at is None or cb.enqueued_at < info.sealed_at:
        problems.append(f"the callback was enqueued at {cb.enqueued_at}, before the seal ({info.sealed_at}) "
                        f"or the last member's finish ({last})")
    return problems


SCENARIOS = {"workflow-storm": workflow_storm, "batch-storm": batch_storm}
