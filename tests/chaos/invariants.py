"""The audit every chaos scenario records, and the checker it ends with.

What is recorded
----------------
:func:`install` adds plain tables and triggers to the database under test (no
migration; :func:`uninstall` removes them). The triggers see every write the
engine makes, whoever makes it, in the same transaction:

* ``fqchaos_job`` — every job inserted (seq, id, queue, enqueued_at, keys);
  ``fqchaos_job_gone`` — every job deleted (pruned), with its last state.
  On MariaDB both also carry ``txn``, the InnoDB id of the transaction that
  wrote the audit row (see *Withdrawn jobs* below).
* ``fqchaos_lease`` — every lease granted (job, generation, receipt hash,
  claimed_at, first deadline); ``fqchaos_extend`` — every change of a lease's
  deadline (old and new value); ``fqchaos_lease_end`` — every lease row
  deleted, with the deadline it had at that moment.
* ``fqchaos_settle`` — every time a job's recorded settle changes (ack, nack,
  release, cancel, expire), with the receipt hash it settled and the
  engine's own check time (the job's ``changed_at``, database clock).

The handlers (:mod:`tests.chaos.fq_handlers`) and the stress consumers add
one ``fqchaos_run`` row per run that reached its end (job id, the lease's
``claimed_at``, attempt, pid, run start and end read from the database clock,
and whether the run had been told its lease was lost when it ended), and
upsert one idempotent ``fqchaos_effect`` row per job (``runs`` counts the
completed runs). A run killed mid-way leaves no row. The workflow handlers
also write one ``fqchaos_start`` row as each run begins (:func:`record_start`),
which the workflow and batch storms (:mod:`tests.chaos.flows`) check.

What is checked (:func:`check`)
-------------------------------
Every rule reads only database times (epoch ms):

1. **Accounting.** Every job inserted (withdrawn ones aside: see below) is
   either still a row or was pruned, once, and only when finished; per
   queue, ``stats`` counts + pruned = ``totals.enqueued`` = jobs inserted;
   succeeded (rows + pruned) = ``totals.acked`` = acks recorded;
   ``totals.claimed`` = leases granted; nacked/released/expired totals =
   the settles recorded; running = live lease rows. ``lost`` counts jobs a
   producer was told exist but that never were inserted, jobs that vanished
   without being pruned, and (``drained=True``) jobs not finished at the end.
2. **Exclusive live lease.** Lease *g* of a job is live from its
   ``claimed_at`` until it ends: its settle time (ack, nack, release,
   cancel) or its deadline (expiry). Lease *g+1* is never granted before
   lease *g* ended; generations are 1..n with no gap and ``job.generation`` = n.
3. **No receipt after its lease ended.** An ack, nack or release was
   accepted strictly before the deadline the lease had when it was deleted;
   an extend was accepted strictly before the deadline it replaced (its check
   time is ``new deadline − visibility``, exact when no timeout caps it); an
   expiry never ended a lease before its deadline.
4. **No run while another lease was live.** A run is matched to its lease by
   (job, ``claimed_at``). It must not overlap an *older* lease's live time.
   It may overlap a *newer* lease only if the run's own lease was lost and
   the run had been told so when it ended (a "zombie": counted, allowed by
   at-least-once delivery). A lease is run at most once.
5. **Attempts.** For every job: ``attempts`` = leases − releases (− the
   attempts a ``retry`` wiped, which the scenario passes). An acked
   lease has exactly one run row; a nacked lease one, or none when the
   handler raised before recording (e.g. its own write failed while the
   database restarted); an expired, released or cancelled lease has zero (the process died, was cut off, or never started the job)
   or one (the handler finished but its outcome never landed: a *duplicate in
   an expired lease*, since the job then runs again). ``fqchaos_effect.runs``
   equals the run rows of the job.
6. **Producers** (when their records are passed): every id an enqueue
   returned exists; one idempotency token always returned one id, created
   exactly once.

Withdrawn jobs (MariaDB)
------------------------
The MariaDB store inserts a batch's jobs without their unique keys and sets
the keys afterwards; a job whose key an active job turns out to hold is
deleted again by the same enqueue transaction (``MysqlStore._insert_keys_sorted``).
The triggers log that insert and that delete, yet the row was never
committed: InnoDB shows an uncommitted row to no other transaction (django-fq
never reads at READ UNCOMMITTED), so nobody could claim it, and the engine
neither counts it nor returns its id. The rule that tells it from a loss:

    A job deleted unfinished is *withdrawn* exactly when its delete was
    logged by the transaction that logged its insert (equal, known ``txn``),
    it was deleted ``queued``, and no lease of it was ever logged.

A withdrawn job is no job: it is left out of every count (jobs inserted,
pruned, the per-queue accounting, :attr:`Report.jobs`) and its id out of the
ids that exist, so an enqueue that *returned* it is still ``enqueued_missing``
(a lost job), and an engine that counted it in ``totals.enqueued`` still fails
``accounting``. A real prune of a queued job cannot pass: the pruner could
only see the job after the enqueue committed, so it deletes it in a later
transaction, with another id (InnoDB ids only grow and are never reused).
Any other unfinished delete is ``pruned_unfinished``. ``txn`` comes from
transaction-precise system versioning (``GENERATED ALWAYS AS ROW START`` on
a ``BIGINT UNSIGNED`` column: the writer's transaction id, exact and
per transaction, unlike ``information_schema.innodb_trx``, a cache refreshed
about every 0.1 s). MySQL has no such column, and PostgreSQL's and SQLite's
stores never insert a job they then delete (``ON CONFLICT DO NOTHING``): there
``txn`` is unknown and every unfinished delete is reported.

Violations are collected as strings in :class:`Report.violations`; nothing
here raises for a broken invariant, so a scenario reports all of them.
"""

from __future__ import annotations

import collections
import itertools
from dataclasses import dataclass, field

from django.db import connection as default_connection
from django.db import transaction

from django_fq import services as fq
from django_fq import storage
from django_fq.storage.mysql import NOW_SQL as _MYSQL_NOW
from django_fq.storage.postgres import NOW_SQL as _PG_NOW
from django_fq.storage.sqlite import NOW_SQL as _SQLITE_NOW

TABLES = (
    "fqchaos_job",
    "fqchaos_job_gone",
    "fqchaos_lease",
    "fqchaos_extend",
    "fqchaos_lease_end",
    "fqchaos_settle",
    "fqchaos_run",
    "fqchaos_effect",
    "fqchaos_start",
)

_COMMON_DDL = [
    "CREATE TABLE fqchaos_job (seq BIGINT PRIMARY KEY, uid VARCHAR(32) NOT NULL, queue_id BIGINT NOT NULL, "
    "unique_key VARCHAR(255), idem VARCHAR(255), enqueued_at BIGINT NOT NULL)",
    "CREATE INDEX fqchaos_job_uid ON fqchaos_job (uid)",
    "CREATE TABLE fqchaos_job_gone (seq BIGINT NOT NULL, uid VARCHAR(32) NOT NULL, queue_id BIGINT NOT NULL, "
    "state VARCHAR(10) NOT NULL, finished_at BIGINT, at BIGINT NOT NULL)",
    "CREATE TABLE fqchaos_lease (job_seq BIGINT NOT NULL, queue_id BIGINT NOT NULL, generation BIGINT NOT NULL, "
    "receipt_hash VARCHAR(64) NOT NULL, claimed_at BIGINT NOT NULL, deadline BIGINT NOT NULL, "
    "timeout_at BIGINT, worker VARCHAR(200) NOT NULL, at BIGINT NOT NULL)",
    "CREATE TABLE fqchaos_extend (job_seq BIGINT NOT NULL, generation BIGINT NOT NULL, old_deadline BIGINT NOT NULL, "
    "new_deadline BIGINT NOT NULL, timeout_at BIGINT, at BIGINT NOT NULL)",
    "CREATE TABLE fqchaos_lease_end (job_seq BIGINT NOT NULL, generation BIGINT NOT NULL, "
    "receipt_hash VARCHAR(64) NOT NULL, deadline BIGINT NOT NULL, at BIGINT NOT NULL)",
    "CREATE TABLE fqchaos_settle (job_seq BIGINT NOT NULL, receipt_hash VARCHAR(64) NOT NULL, op VARCHAR(10), "
    "state VARCHAR(10) NOT NULL, checked_at BIGINT NOT NULL, attempts INTEGER NOT NULL, at BIGINT NOT NULL)",
    "CREATE TABLE fqchaos_run (job_uid VARCHAR(32) NOT NULL, claimed_at BIGINT NOT NULL, attempt INTEGER NOT NULL, "
    "pid INTEGER NOT NULL, tag VARCHAR(100) NOT NULL, run_start BIGINT NOT NULL, run_end BIGINT NOT NULL, "
    "told BOOLEAN NOT NULL)",
    "CREATE INDEX fqchaos_run_job ON fqchaos_run (job_uid)",
    "CREATE TABLE fqchaos_effect (job_uid VARCHAR(32) PRIMARY KEY, runs INTEGER NOT NULL, last_pid INTEGER NOT NULL)",
    # One row per handler start (written as the run begins, so a run killed mid-way has one too):
    # the workflow storms check that no start came before its dependencies succeeded.
    "CREATE TABLE fqchaos_start (job_uid VARCHAR(32) NOT NULL, claimed_at BIGINT NOT NULL, attempt INTEGER NOT NULL, "
    "pid INTEGER NOT NULL, started BIGINT NOT NULL, upstream_seen INTEGER NOT NULL, upstream_bad INTEGER NOT NULL)",
    "CREATE INDEX fqchaos_start_job ON fqchaos_start (job_uid)",
]

# One trigger function per table on PostgreSQL; the WHEN clauses keep the
# hot paths (claim's job update, most lease updates) free of extra work.
_PG_DDL = [
    f"""CREATE OR REPLACE FUNCTION fqchaos_job_trg() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF TG_OP = 'INSERT' THEN
    INSERT INTO fqchaos_job VALUES (NEW.seq, NEW.uid, NEW.queue_id, NEW.unique_key, NEW.idempotency, NEW.enqueued_at);
  ELSIF TG_OP = 'DELETE' THEN
    INSERT INTO fqchaos_job_gone VALUES (OLD.seq, OLD.uid, OLD.queue_id, OLD.state, OLD.finished_at, {_PG_NOW});
  ELSE
    INSERT INTO fqchaos_settle VALUES (NEW.seq, NEW.settled_hash, NEW.settled_op, NEW.state, NEW.changed_at,
                                       NEW.attempts, {_PG_NOW});
  END IF;
  RETURN NULL;
END $$""",
    f"""CREATE OR REPLACE FUNCTION fqchaos_lease_trg() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF TG_OP = 'INSERT' THEN
    INSERT INTO fqchaos_lease VALUES (NEW.job_id, NEW.queue_id, NEW.generation, NEW.receipt_hash, NEW.claimed_at,
                                      NEW.deadline, NEW.timeout_at, NEW.worker, {_PG_NOW});
  ELSIF TG_OP = 'DELETE' THEN
    INSERT INTO fqchaos_lease_end VALUES (OLD.job_id, OLD.generation, OLD.receipt_hash, OLD.deadline, {_PG_NOW});
  ELSE
    INSERT INTO fqchaos_extend VALUES (NEW.job_id, NEW.generation, OLD.deadline, NEW.deadline, NEW.timeout_at, {_PG_NOW});
  END IF;
  RETURN NULL;
END $$""",
    "CREATE TRIGGER fqchaos_job_ins AFTER INSERT ON django_fq_job FOR EACH ROW EXECUTE FUNCTION fqchaos_job_trg()",
    "CREATE TRIGGER fqchaos_job_del AFTER DELETE ON django_fq_job FOR EACH ROW EXECUTE FUNCTION fqchaos_job_trg()",
    "CREATE TRIGGER fqchaos_job_upd AFTER UPDATE ON django_fq_job FOR EACH ROW "
    "WHEN (NEW.settled_hash IS DISTINCT FROM OLD.settled_hash AND NEW.settled_hash IS NOT NULL) "
    "EXECUTE FUNCTION fqchaos_job_trg()",
    "CREATE TRIGGER fqchaos_lease_ins AFTER INSERT ON django_fq_lease FOR EACH ROW EXECUTE FUNCTION fqchaos_lease_trg()",
    "CREATE TRIGGER fqchaos_lease_del AFTER DELETE ON django_fq_lease FOR EACH ROW EXECUTE FUNCTION fqchaos_lease_trg()",
    "CREATE TRIGGER fqchaos_lease_upd AFTER UPDATE ON django_fq_lease FOR EACH ROW "
    "WHEN (NEW.deadline IS DISTINCT FROM OLD.deadline) EXECUTE FUNCTION fqchaos_lease_trg()",
]

_SQLITE_DDL = [
    "CREATE TRIGGER fqchaos_job_ins AFTER INSERT ON django_fq_job BEGIN INSERT INTO fqchaos_job VALUES "
    "(NEW.seq, NEW.uid, NEW.queue_id, NEW.unique_key, NEW.idempotency, NEW.enqueued_at); END",
    "CREATE TRIGGER fqchaos_job_del AFTER DELETE ON django_fq_job BEGIN INSERT INTO fqchaos_job_gone VALUES "
    f"(OLD.seq, OLD.uid, OLD.queue_id, OLD.state, OLD.finished_at, {_SQLITE_NOW}); END",
    "CREATE TRIGGER fqchaos_job_upd AFTER UPDATE OF settled_hash ON django_fq_job "
    "WHEN NEW.settled_hash IS NOT OLD.settled_hash AND NEW.settled_hash IS NOT NULL BEGIN "
    "INSERT INTO fqchaos_settle VALUES (NEW.seq, NEW.settled_hash, NEW.settled_op, NEW.state, NEW.changed_at, "
    f"NEW.attempts, {_SQLITE_NOW}); END",
    "CREATE TRIGGER fqchaos_lease_ins AFTER INSERT ON django_fq_lease BEGIN INSERT INTO fqchaos_lease VALUES "
    "(NEW.job_id, NEW.queue_id, NEW.generation, NEW.receipt_hash, NEW.claimed_at, NEW.deadline, NEW.timeout_at, "
    f"NEW.worker, {_SQLITE_NOW}); END",
    "CREATE TRIGGER fqchaos_lease_del AFTER DELETE ON django_fq_lease BEGIN INSERT INTO fqchaos_lease_end VALUES "
    f"(OLD.job_id, OLD.generation, OLD.receipt_hash, OLD.deadline, {_SQLITE_NOW}); END",
    "CREATE TRIGGER fqchaos_lease_upd AFTER UPDATE OF deadline ON django_fq_lease "
    "WHEN NEW.deadline IS NOT OLD.deadline BEGIN INSERT INTO fqchaos_extend VALUES "
    f"(NEW.job_id, NEW.generation, OLD.deadline, NEW.deadline, NEW.timeout_at, {_SQLITE_NOW}); END",
]


# MariaDB/MySQL: one trigger per table and event, the WHEN clauses as IF inside the body
# (NULL-safe ``<=>`` for IS DISTINCT FROM). Triggers run in the writer's transaction, as above.
_MYSQL_DDL = [
    "CREATE TRIGGER fqchaos_job_ins AFTER INSERT ON django_fq_job FOR EACH ROW INSERT INTO fqchaos_job VALUES "
    "(NEW.seq, NEW.uid, NEW.queue_id, NEW.unique_key, NEW.idempotency, NEW.enqueued_at)",
    "CREATE TRIGGER fqchaos_job_del AFTER DELETE ON django_fq_job FOR EACH ROW INSERT INTO fqchaos_job_gone VALUES "
    f"(OLD.seq, OLD.uid, OLD.queue_id, OLD.state, OLD.finished_at, {_MYSQL_NOW})",
    "CREATE TRIGGER fqchaos_job_upd AFTER UPDATE ON django_fq_job FOR EACH ROW BEGIN "
    "IF NEW.settled_hash IS NOT NULL AND NOT (NEW.settled_hash <=> OLD.settled_hash) THEN "
    "INSERT INTO fqchaos_settle VALUES (NEW.seq, NEW.settled_hash, NEW.settled_op, NEW.state, NEW.changed_at, "
    f"NEW.attempts, {_MYSQL_NOW}); END IF; END",
    "CREATE TRIGGER fqchaos_lease_ins AFTER INSERT ON django_fq_lease FOR EACH ROW INSERT INTO fqchaos_lease VALUES "
    "(NEW.job_id, NEW.queue_id, NEW.generation, NEW.receipt_hash, NEW.claimed_at, NEW.deadline, NEW.timeout_at, "
    f"NEW.worker, {_MYSQL_NOW})",
    "CREATE TRIGGER fqchaos_lease_del AFTER DELETE ON django_fq_lease FOR EACH ROW INSERT INTO fqchaos_lease_end VALUES "
    f"(OLD.job_id, OLD.generation, OLD.receipt_hash, OLD.deadline, {_MYSQL_NOW})",
    "CREATE TRIGGER fqchaos_lease_upd AFTER UPDATE ON django_fq_lease FOR EACH ROW BEGIN "
    "IF NOT (NEW.deadline <=> OLD.deadline) THEN INSERT INTO fqchaos_extend VALUES "
    f"(NEW.job_id, NEW.generation, OLD.deadline, NEW.deadline, NEW.timeout_at, {_MYSQL_NOW}); END IF; END",
]

_DDL = {"postgresql": _PG_DDL, "mysql": _MYSQL_DDL, "sqlite": _SQLITE_DDL}

# MariaDB only: the two job logs stamped with the id of the transaction that wrote each row
# (transaction-precise system versioning; INVISIBLE keeps the triggers' positional VALUES as
# they are). A side effect of MariaDB's: each committed transaction that wrote one of them
# leaves a row in mysql.transaction_registry (about 100 bytes), which the server refuses to
# delete (error 1556) and dropping these tables does not remove.
_TXN_TABLES = ("fqchaos_job", "fqchaos_job_gone")
_MARIADB_TXN_DDL = [
    f"ALTER TABLE {table} ADD COLUMN txn BIGINT UNSIGNED GENERATED ALWAYS AS ROW START INVISIBLE, "
    "ADD COLUMN txn_end BIGINT UNSIGNED GENERATED ALWAYS AS ROW END INVISIBLE, "
    "ADD PERIOD FOR SYSTEM_TIME (txn, txn_end), ADD SYSTEM VERSIONING"
    for table in _TXN_TABLES
]


def _dialect(conn) -> str:
    """The audit's dialect for ``conn``: the vendor of the django-fq store serving it."""
    return storage.for_connection(conn).vendor


def _txn_logged(conn) -> bool:
    """Whether the job logs carry the writer's transaction id (``txn``): on MariaDB, not MySQL."""
    return _dialect(conn) == "mysql" and bool(getattr(conn, "mysql_is_mariadb", False))


def install(conn=None) -> None:
    """Create the audit tables and triggers (dropping leftovers of an earlier run first)."""
    conn = conn or default_connection
    uninstall(conn)
    txn = _MARIADB_TXN_DDL if _txn_logged(conn) else []
    with conn.cursor() as cur:
        for sql in _COMMON_DDL + txn + _DDL[_dialect(conn)]:
            cur.execute(sql)


def uninstall(conn=None) -> None:
    """Drop the audit triggers, functions and tables (safe when they are absent)."""
    conn = conn or default_connection
    pg = _dialect(conn) == "postgresql"
    with conn.cursor() as cur:
        for trig, table in (
            ("fqchaos_job_ins", "django_fq_job"),
            ("fqchaos_job_del", "django_fq_job"),
            ("fqchaos_job_upd", "django_fq_job"),
            ("fqchaos_lease_ins", "django_fq_lease"),
            ("fqchaos_lease_del", "django_fq_lease"),
            ("fqchaos_lease_upd", "django_fq_lease"),
        ):
            cur.execute(f"DROP TRIGGER IF EXISTS {trig} ON {table}" if pg else f"DROP TRIGGER IF EXISTS {trig}")
        if pg:
            cur.execute("DROP FUNCTION IF EXISTS fqchaos_job_trg()")
            cur.execute("DROP FUNCTION IF EXISTS fqchaos_lease_trg()")
        for table in TABLES:
            cur.execute(f"DROP TABLE IF EXISTS {table}")


# --- what handlers and consumers write ------------------------------------------------------------


def now_ms(conn=None) -> int:
    """The database clock (epoch ms), read now."""
    conn = conn or default_connection
    with conn.cursor() as cur:
        cur.execute(f"SELECT {storage.for_connection(conn).clock_sql}")
        return int(cur.fetchone()[0])


def _upsert_effect_sql(conn) -> str:
    """Insert a job's effect row with runs = 1, or add one run to the row already there."""
    head = "INSERT INTO fqchaos_effect (job_uid, runs, last_pid) VALUES (%s, 1, %s) "
    if _dialect(conn) == "mysql":
        return head + "ON DUPLICATE KEY UPDATE runs = runs + 1, last_pid = VALUES(last_pid)"
    return head + "ON CONFLICT (job_uid) DO UPDATE SET runs = fqchaos_effect.runs + 1, last_pid = excluded.last_pid"


def record_run(job_uid: str, claimed_at: int, attempt: int, run_start: int, told, *, tag: str = "", pid: int = 0) -> int:
    """Write the end of one run: read the clock, then ask ``told(run_end)`` (lease lost?), then store both.

    ``job_uid``/``claimed_at``/``attempt`` identify the run's lease (``claimed_at``
    as the claim returned it, epoch ms); ``run_start`` is the database time
    the run began. ``told`` is called *after* the end time is read, so "the
    run had been told by its end" is exact. The run row and the idempotent
    effect row are written in one transaction (on PostgreSQL without waiting
    for the WAL flush, like django-fq's own lease changes). Returns the end time (epoch
    ms); raises the database's error when the write fails.
    """
    conn = default_connection
    run_end = now_ms(conn)
    lost = bool(told(run_end))
    with transaction.atomic(), conn.cursor() as cur:
        if _dialect(conn) == "postgresql":
            # Like django-fq's own lease changes: no wait for the WAL flush (a clean restart keeps it all).
            cur.execute("SET LOCAL synchronous_commit = off")
        cur.execute(
            "INSERT INTO fqchaos_run (job_uid, claimed_at, attempt, pid, tag, run_start, run_end, told) "
            "VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
            [job_uid, claimed_at, attempt, pid, tag[:100], run_start, run_end, lost],
        )
        cur.execute(_upsert_effect_sql(conn), [job_uid, pid])
    return run_end


def record_start(job_uid: str, claimed_at: int, attempt: int, started: int, *, upstream_seen: int = 0,
                 upstream_bad: int = 0, pid: int = 0) -> None:
    """Write the start of one run (committed at once, before the handler does its work).

    ``started`` is the database time the run began (read before anything
    else the handler does); ``upstream_seen``/``upstream_bad``: how many
    dependencies the run read in ``job.upstream``, and how many of them were
    not ``succeeded`` with a result. A run killed after this leaves its start
    row and no :func:`record_run` row.
    """
    conn = default_connection
    with transaction.atomic(), conn.cursor() as cur:
        cur.execute(
            "INSERT INTO fqchaos_start (job_uid, claimed_at, attempt, pid, started, upstream_seen, upstream_bad) "
            "VALUES (%s, %s, %s, %s, %s, %s, %s)",
            [job_uid, claimed_at, attempt, pid, started, upstream_seen, upstream_bad],
        )


def record_runs(runs: list[tuple[str, int, int, int, int]], *, tag: str = "", pid: int = 0) -> int:
    """Batch form of :func:`record_run` for a consumer that holds many jobs at once.

    ``runs`` holds ``(job_uid, claimed_at, attempt, run_start, deadline)``;
    each run counts as told when the end time read here is at or past its
    ``deadline`` (the consumer's own knowledge of its lease). Returns the end time.
    """
    conn = default_connection
    run_end = now_ms(conn)
    with transaction.atomic(), conn.cursor() as cur:
        if _dialect(conn) == "postgresql":
            cur.execute("SET LOCAL synchronous_commit = off")
        cur.executemany(
            "INSERT INTO fqchaos_run (job_uid, claimed_at, attempt, pid, tag, run_start, run_end, told) "
            "VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
            [(uid, claimed, attempt, pid, tag[:100], start, run_end, run_end >= deadline) for uid, claimed, attempt, start, deadline in runs],
        )
        cur.executemany(_upsert_effect_sql(conn), [(uid, pid) for uid, *_ in runs])
    return run_end


# --- the checker ------------------------------------------------------------------------------------


@dataclass
class Report:
    """What :func:`check` found. ``violations`` is empty when every invariant held."""

    queues: list[str]
    jobs: int = 0
    succeeded: int = 0
    dead: int = 0
    cancelled: int = 0
    pending: int = 0
    pruned: int = 0
    withdrawn: int = 0  # jobs deleted again by their own enqueue transaction (MariaDB): not jobs
    leases: int = 0
    runs: int = 0
    unrecorded_runs: int = 0
    failed_runs: int = 0
    duplicates: int = 0
    zombie_overlaps: int = 0
    late_starts: int = 0
    overlaps: int = 0
    lost: int = 0
    extends: int = 0
    violations: list[str] = field(default_factory=list)
    by_kind: collections.Counter = field(default_factory=collections.Counter)

    def fail(self, kind: str, text: str) -> None:
        self.by_kind[kind] += 1
        if len(self.violations) < 200:  # enough to debug; the counts stay exact
            self.violations.append(f"{kind}: {text}")

    @property
    def ok(self) -> bool:
        return not self.by_kind

    def describe(self) -> str:
        """One paragraph for an assertion message: the counts, then the first violations."""
        head = ", ".join(f"{k}={v}" for k, v in sorted(self.by_kind.items())) or "none"
        return f"violations: {head}\n" + "\n".join(self.violations[:40])


def _rows(conn, sql: str, params=()) -> list[tuple]:
    with conn.cursor() as cur:
        cur.execute(sql, list(params))
        return cur.fetchall()


def _in(ids) -> str:
    return "(" + ", ".join(str(int(i)) for i in ids) + ")" if ids else "(NULL)"


def check(
    queues: list[str],
    *,
    visibility_ms: int | dict[str, int] | None = None,
    drained: bool = True,
    runs_required: bool = True,
    producers: list[dict] | None = None,
    retried: dict[str, int] | None = None,
    conn=None,
) -> Report:
    """Check every invariant (see the module docstring) over ``queues``; return a :class:`Report`.

    Args:
        queues: the queue names in scope (each must exist).
        visibility_ms: the lease length every extend of a queue used (int for
            all queues, or ``{queue: ms}``); ``None`` skips the exact extend check.
        drained: every job must be finished (succeeded, dead or cancelled).
        runs_required: every acked lease must have a run row
            (false for queues whose consumers record no runs).
        producers: enqueue records ``{"queue", "id", "created", "token"}``
            (``token`` may be ``None``) to check rule 6 and count lost jobs.
        retried: ``{job id: attempts wiped}`` for jobs a scenario redrove with
            ``retry`` (attempts back to 0): the sum, over its retries, of the
            job's attempts at that moment, which rule 5 then leaves out.
    """
    conn = conn or default_connection
    report = Report(list(queues))
    qids = {}
    for name in queues:
        got = _rows(conn, "SELECT id FROM django_fq_queue WHERE name = %s", [name])
        if not got:
            report.fail("queue_missing", name)
            continue
        qids[got[0][0]] = name
    if not qids:
        return report
    qin = _in(qids)
    vis_of = visibility_ms if isinstance(visibility_ms, dict) else dict.fromkeys(queues, visibility_ms)

    txn = "txn" if _txn_logged(conn) else "NULL"
    created, inserted_by = {}, {}
    for seq, uid, qid, ins_txn in _rows(conn, f"SELECT seq, uid, queue_id, {txn} FROM fqchaos_job WHERE queue_id IN {qin}"):
        created[seq] = (uid, qid)
        inserted_by[seq] = ins_txn
    rows = {
        seq: {"uid": uid, "qid": qid, "state": state, "attempts": attempts, "generation": gen}
        for seq, uid, qid, state, attempts, gen in _rows(
            conn, f"SELECT seq, uid, queue_id, state, attempts, generation FROM django_fq_job WHERE queue_id IN {qin}"
        )
    }
    gone = collections.defaultdict(list)
    deleted_by = collections.defaultdict(list)
    for seq, state, del_txn in _rows(conn, f"SELECT seq, state, {txn} FROM fqchaos_job_gone WHERE queue_id IN {qin}"):
        gone[seq].append(state)
        deleted_by[seq].append(del_txn)

    # 0. Withdrawn jobs (the rule in the module docstring): dropped from every count below ---------
    leased = {seq for (seq,) in _rows(conn, f"SELECT DISTINCT job_seq FROM fqchaos_lease WHERE queue_id IN {qin}")}
    withdrawn = {
        seq
        for seq, states in gone.items()
        if states == ["queued"]
        and seq in created
        and seq not in rows
        and seq not in leased
        and inserted_by[seq] is not None
        and deleted_by[seq] == [inserted_by[seq]]
    }
    for seq in withdrawn:
        del created[seq], gone[seq]
    report.withdrawn = len(withdrawn)
    uid_to_seq = {uid: seq for seq, (uid, _) in created.items()}

    # 1. Accounting --------------------------------------------------------------------------------
    for seq in rows:
        if seq not in created:
            report.fail("job_not_logged", f"job {rows[seq]['uid']} exists but its insert was not recorded")
    for seq, (uid, _) in created.items():
        present = (seq in rows) + len(gone.get(seq, ()))
        if present == 0:
            report.lost += 1
            report.fail("job_vanished", f"job {uid} was inserted and is gone without being pruned")
        elif present > 1:
            report.fail("job_twice", f"job {uid} is counted {present} times")
    for seq, states in gone.items():
        for state in states:
            if state not in ("succeeded", "cancelled"):
                report.fail("pruned_unfinished", f"job {created.get(seq, ('?',))[0]} was deleted while {state}")
    report.jobs = len(created)
    report.pruned = sum(len(v) for v in gone.values())

    leases = collections.defaultdict(dict)  # seq -> generation -> lease dict
    for seq, gen, rhash, claimed, deadline, timeout_at, worker in _rows(
        conn,
        "SELECT job_seq, generation, receipt_hash, claimed_at, deadline, timeout_at, worker FROM fqchaos_lease "
        f"WHERE queue_id IN {qin}",
    ):
        if gen in leases[seq]:
            report.fail("lease_twice", f"job {created.get(seq, ('?',))[0]} generation {gen} granted twice")
        leases[seq][gen] = {"gen": gen, "hash": rhash, "claimed": claimed, "deadline0": deadline,
                            "timeout_at": timeout_at, "worker": worker, "end_deadline": None, "settle": None}
    by_hash = {lease["hash"]: lease for per in leases.values() for lease in per.values()}
    report.leases = len(by_hash)
    in_scope = f"job_seq IN (SELECT seq FROM fqchaos_job WHERE queue_id IN {qin})"
    ends = _rows(conn, f"SELECT job_seq, generation, receipt_hash, deadline FROM fqchaos_lease_end WHERE {in_scope}")
    for seq, gen, rhash, deadline in ends:
        lease = by_hash.get(rhash)
        if lease is None or lease["gen"] != gen:
            report.fail("lease_end_unknown", f"a lease of job seq {seq} generation {gen} ended but was never granted")
            continue
        if lease["end_deadline"] is not None:
            report.fail("lease_ended_twice", f"job seq {seq} generation {gen}")
        lease["end_deadline"] = deadline
    settles = _rows(
        conn, f"SELECT job_seq, receipt_hash, op, state, checked_at FROM fqchaos_settle WHERE {in_scope}"
    )
    ops = collections.Counter()
    for seq, rhash, op, state, checked in settles:
        ops[(created.get(seq, (None, None))[1], op)] += 1
        lease = by_hash.get(rhash)
        if lease is None:
            report.fail("settle_unknown_lease", f"job seq {seq}: {op} of a receipt no lease had")
            continue
        if lease["settle"] is not None:
            report.fail("settled_twice", f"job {created[seq][0]} generation {lease['gen']}: {lease['settle']['op']} then {op}")
        lease["settle"] = {"op": op, "state": state, "at": checked}
    live = {
        seq: (gen, deadline)
        for seq, gen, deadline in _rows(conn, f"SELECT job_id, generation, deadline FROM django_fq_lease WHERE queue_id IN {qin}")
    }

    counts_by_queue = {}
    for qid, name in qids.items():
        stats = fq.stats(name)
        counts, totals = stats.counts, stats.totals
        counts_by_queue[qid] = counts
        q_rows = [r for r in rows.values() if r["qid"] == qid]
        q_created = sum(1 for _, q in created.values() if q == qid)
        q_gone = [s for seq, states in gone.items() if created.get(seq, (None, None))[1] == qid for s in states]
        stored = collections.Counter(r["state"] for r in q_rows)
        expect = {
            "scheduled+ready": stored["queued"],
            "running": stored["running"],
            "succeeded": stored["succeeded"],
            "dead": stored["dead"],
            "cancelled": stored["cancelled"],
        }
        got = {
            "scheduled+ready": counts["scheduled"] + counts["ready"],
            **{k: counts[k] for k in ("running", "succeeded", "dead", "cancelled")},
        }
        if got != expect:
            report.fail("stats_counts", f"{name}: stats {got} but rows {expect}")
        if sum(counts.values()) + len(q_gone) != totals["enqueued"] or totals["enqueued"] != q_created:
            report.fail(
                "accounting",
                f"{name}: counts {sum(counts.values())} + pruned {len(q_gone)} vs totals.enqueued "
                f"{totals['enqueued']} vs jobs inserted {q_created}",
            )
        acked = counts["succeeded"] + q_gone.count("succeeded")
        if not (acked == totals["acked"] == ops[(qid, "ack")]):
            report.fail("acked", f"{name}: succeeded {acked}, totals.acked {totals['acked']}, acks recorded {ops[(qid, 'ack')]}")
        q_leases = sum(1 for seq, per in leases.items() if created.get(seq, (None, None))[1] == qid for _ in per)
        if totals["claimed"] != q_leases:
            report.fail("claimed", f"{name}: totals.claimed {totals['claimed']} but {q_leases} leases granted")
        for total, op in (("nacked", "nack"), ("released", "release")):
            if totals[total] != ops[(qid, op)]:
                report.fail(total, f"{name}: totals.{total} {totals[total]} but {ops[(qid, op)]} recorded")
        if totals["expired"] + totals["timed_out"] != ops[(qid, "expire")]:
            report.fail("expired", f"{name}: totals expired+timed_out {totals['expired'] + totals['timed_out']} "
                        f"but {ops[(qid, 'expire')]} expiries recorded")
        if counts["running"] != sum(1 for seq in live if created.get(seq, (None, None))[1] == qid):
            report.fail("running", f"{name}: stats running {counts['running']} but {len(live)} lease rows")
        report.succeeded += acked
        report.dead += counts["dead"]
        report.cancelled += counts["cancelled"] + q_gone.count("cancelled")
        report.pending += counts["scheduled"] + counts["ready"] + counts["running"]
    if drained and report.pending:
        report.lost += report.pending
        report.fail("not_drained", f"{report.pending} jobs still scheduled, ready or running at the end")

    # 2 + 3. Leases: exclusive, every claim recorded, no receipt past its deadline -------------------
    extends = _rows(
        conn,
        "SELECT e.job_seq, e.generation, e.old_deadline, e.new_deadline, e.timeout_at, l.queue_id FROM fqchaos_extend e "
        f"JOIN fqchaos_lease l ON l.job_seq = e.job_seq AND l.generation = e.generation WHERE l.queue_id IN {qin}",
    )
    report.extends = len(extends)
    for seq, gen, old, new, timeout_at, qid in extends:
        vis = vis_of.get(qids[qid])
        if vis is None or (timeout_at is not None and new >= timeout_at):
            continue  # the check time cannot be recovered exactly: capped at the timeout, or unknown visibility
        checked = new - vis
        if checked >= old:
            report.fail("late_extend", f"job {created[seq][0]} generation {gen} extended at {checked}, deadline was {old}")
    for seq, per in leases.items():
        uid = created.get(seq, ("?",))[0]
        gens = sorted(per)
        if gens != list(range(1, len(gens) + 1)) and seq in rows:
            report.fail("generation_gap", f"job {uid}: generations {gens[:10]}")
        if seq in rows and rows[seq]["generation"] != len(gens):
            report.fail("generation", f"job {uid}: generation {rows[seq]['generation']} but {len(gens)} leases granted")
        for g in gens:
            lease = per[g]
            settle = lease["settle"]
            if lease["end_deadline"] is None:
                if live.get(seq, (None,))[0] == g:
                    lease["end"] = live[seq][1]
                    continue
                report.fail("lease_vanished", f"job {uid} generation {g}: no end recorded and no lease row")
                lease["end"] = lease["deadline0"]
                continue
            if settle is None:
                report.fail("end_without_settle", f"job {uid} generation {g} ended with no settle recorded")
                lease["end"] = lease["end_deadline"]
                continue
            if settle["op"] in ("ack", "nack", "release"):
                if settle["at"] >= lease["end_deadline"]:
                    report.fail(
                        "late_settle",
                        f"job {uid} generation {g}: {settle['op']} accepted at {settle['at']}, deadline {lease['end_deadline']}",
                    )
                lease["end"] = min(settle["at"], lease["end_deadline"])
            elif settle["op"] == "expire":
                if settle["at"] < lease["end_deadline"]:
                    report.fail("early_expiry", f"job {uid} generation {g}: expired at {settle['at']}, deadline {lease['end_deadline']}")
                lease["end"] = lease["end_deadline"]
            else:  # cancel
                lease["end"] = min(settle["at"], lease["end_deadline"])
        for a, b in itertools.pairwise(gens):
            if per[b]["claimed"] < per[a]["end"]:
                report.overlaps += 1
                report.fail(
                    "lease_overlap",
                    f"job {uid}: generation {b} granted at {per[b]['claimed']} while generation {a} was live until {per[a]['end']}",
                )

    # 4 + 5. Runs against leases; attempts ------------------------------------------------------------
    runs_of = collections.defaultdict(list)
    run_rows = _rows(
        conn,
        # IN, not a join: a uid withdrawn and then inserted again has two insert rows.
        "SELECT job_uid, claimed_at, attempt, pid, run_start, run_end, told FROM fqchaos_run "
        f"WHERE job_uid IN (SELECT uid FROM fqchaos_job WHERE queue_id IN {qin})",
    )
    report.runs = len(run_rows)
    runs_per_lease = collections.Counter()
    for uid, claimed, _attempt, pid, start, end, told in run_rows:
        seq = uid_to_seq.get(uid)
        per = leases.get(seq, {})
        match = [lease for lease in per.values() if lease["claimed"] == claimed]
        if not match:
            report.fail("run_without_lease", f"job {uid}: a run (pid {pid}) claimed at {claimed} matches no lease")
            continue
        lease = match[0] if len(match) == 1 else min(match, key=lambda x: runs_per_lease[(seq, x["gen"])])
        runs_per_lease[(seq, lease["gen"])] += 1
        runs_of[seq].append((lease["gen"], start, end, bool(told), pid))
        if start < lease["claimed"]:
            report.fail("run_before_claim", f"job {uid} generation {lease['gen']}: run started {start} before its claim {claimed}")
        if start >= lease["end"] and (lease["settle"] or {}).get("op") not in ("ack", "nack"):
            report.late_starts += 1  # began after its lease had already expired or been released
        for other in per.values():
            if other is lease or not (start < other["end"] and other["claimed"] < end):
                continue
            if other["gen"] < lease["gen"]:
                report.overlaps += 1
                report.fail("overlap", f"job {uid}: run of generation {lease['gen']} overlaps live generation {other['gen']}")
            elif not told:
                report.overlaps += 1
                report.fail(
                    "overlap_not_told",
                    f"job {uid}: run of generation {lease['gen']} (pid {pid}) went on until {end} while generation "
                    f"{other['gen']} was live from {other['claimed']}, and it had not been told its lease was lost",
                )
            else:
                report.zombie_overlaps += 1
    for (seq, gen), n in runs_per_lease.items():
        if n > 1:
            report.fail("double_run", f"job {created[seq][0]} generation {gen} ran {n} times")
    releases = collections.Counter()
    for seq, per in leases.items():
        for g, lease in per.items():
            settle = lease["settle"]
            n = runs_per_lease[(seq, g)]
            op = settle["op"] if settle else None
            if op == "release":
                releases[seq] += 1
            if op == "ack":
                if runs_required and n != 1:
                    report.fail("acked_without_run", f"job {created[seq][0]} generation {g}: ack with {n} run rows")
            elif op == "nack" and n == 0:
                report.failed_runs += 1  # the handler raised before it recorded its run
            elif op is not None and n == 0:
                report.unrecorded_runs += 1
            elif op is not None and n >= 1:
                report.duplicates += 1
    wiped = retried or {}
    for seq, row in rows.items():
        if row["attempts"] != len(leases.get(seq, ())) - releases[seq] - wiped.get(row["uid"], 0):
            report.fail(
                "attempts",
                f"job {row['uid']}: attempts {row['attempts']} but {len(leases[seq])} claims - {releases[seq]} releases"
                f" - {wiped.get(row['uid'], 0)} wiped by retry",
            )
    effects = dict(
        _rows(conn, f"SELECT job_uid, runs FROM fqchaos_effect WHERE job_uid IN (SELECT uid FROM fqchaos_job WHERE queue_id IN {qin})")
    )
    for seq, runs in runs_of.items():
        uid = created[seq][0]
        if effects.get(uid, 0) != len(runs):
            report.fail("effect_runs", f"job {uid}: effect row counts {effects.get(uid, 0)} runs, {len(runs)} run rows")

    # 6. Producers --------------------------------------------------------------------------------------
    if producers:
        known = set(uid_to_seq)
        missing = {r["id"] for r in producers if r["id"] not in known}
        report.lost += len(missing)
        for uid in sorted(missing)[:20]:
            report.fail("enqueued_missing", f"an enqueue returned job {uid}, which was never inserted (or only withdrawn)")
        tokens = collections.defaultdict(set)
        created_per_token = collections.Counter()
        for r in producers:
            if r.get("token"):
                key = (r["queue"], r["token"])
                tokens[key].add(r["id"])
                created_per_token[key] += bool(r["created"])
        for key, ids in tokens.items():
            if len(ids) != 1:
                report.fail("token_ids", f"token {key}: {len(ids)} different jobs {sorted(ids)[:3]}")
            if created_per_token[key] > 1:
                report.fail("token_created", f"token {key} created {created_per_token[key]} jobs")
    return report
