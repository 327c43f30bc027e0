"""PostgreSQL: the store of a server database reached through psycopg 3.

Claims skip locked rows, an enqueue notifies idle workers (LISTEN/NOTIFY),
lease changes django-fq commits itself may skip the WAL flush, and the hot
statements are prepared on the server.
"""

from __future__ import annotations

import contextlib
import functools
import json
import secrets
from collections.abc import Sequence
from typing import Any

from django.db import transaction

from ..types import EnqueueResult
from .base import (
    ACKED_JSON,
    CLEAR_PROGRESS_SQL,
    COUNTER_TABLE,
    FLOOR_TABLE,
    JOB_TABLE,
    KEY_TABLE,
    LEASE_TABLE,
    QUEUE_TABLE,
    TAKEN_COLUMNS,
    TOKEN_TABLE,
    Finding,
    RateGate,
    Store,
    fetch_dicts,
    full_row,
    within_cap,
)
from .dependencies import BATCH_MEMBER_TABLE, DEPENDENCY_TABLE

#: ``clock_timestamp()`` is the time at execution, not at transaction start.
NOW_SQL = "FLOOR(EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::bigint"

_ACKED_JSON = ACKED_JSON

# The claim on PostgreSQL as one statement (autocommit makes it atomic): look the
# queue up; if it has no limit (``limited``: a concurrency or a rate limit, which take
# take_jobs under the queue row's lock, or a per-key rate limit, whose claims log their keyed
# jobs: services.keys) and no expired lease to handle first
# (``go``), lock up to n eligible jobs in claim order (FOR UPDATE SKIP LOCKED), keep
# those within the payload cap, mark them running, write their leases and add to
# the counters. Every row carries the queue's facts, so the caller can take the
# slower path when ``go`` was empty; no row at all: no such queue. A paused queue
# picks nothing: the flag comes from the statement's own read of the queue row, so a
# claim that starts after pause() committed takes no job.
#
# The queue's claim floor (``fl``; none: priority 0 from seq 0, i.e. everything) bounds both
# scans from below: the expired-lease check reads deadlines from ``lease_from`` on, and the
# jobs are read in three bands that together are the whole claim order (above the floor's
# priority, at it from its seq on, below it), each locking as the outer LIMIT pulls. The clock of
# the lease check is read once (a subquery), so both ends of its deadline range bound the index scan:
# the dead entries of acked leases, whose deadlines are still ahead, are not walked either. The
# claim time (``c2``) is read after the job locks, so after this transaction has its id:
# the floor's lease rule relies on it (docs/explanation/storage.md#the-claim-floor).
# ``expired`` also says that a held job of a key with room has become due (a queue with
# key_concurrency or key_rate_limit only: the keyed variant below): the slower path admits it first.
# A queue with key_concurrency reads its jobs in one band (``keyed``), not the
# floor's three: its held jobs sit at old sequence numbers, admitting one lowers the
# floor to it, and from a low floor the planner read the ``at_floor`` band in primary-key order,
# walking every held row (100,000 of them: 80 ms a claim); ``ORDER BY priority DESC, seq`` with
# no bound on priority can only come from the claim index, which holds no held job. Its claims do
# without the floor's skip over a long snapshot's dead entries. Every band is gated by
# ``(SELECT id FROM g) IS NOT NULL`` (a one-time filter: on a paused queue, or one the variant
# does not claim from, the scan below it never starts).
# ``at_floor`` bounds its priority by ``>=`` and ``<=``, not ``=``, and orders by
# ``priority DESC, seq``: with ``=`` the planner treats the priority as constant, so primary-key
# order satisfies ``ORDER BY seq``, and below a low floor (no row yet, or lowered to an old retried
# job) it walked every finished row in seq order (100,000 succeeded jobs ahead of the ready ones:
# 139,000 buffers, 50-140 ms a claim); the two bounds leave the claim index the only ordered path.
# The statement comes in two variants (``_claim_pg``), so that each stays under the 4,096 bytes
# up to which psycopg keeps a statement's parsed form (longer ones are split into parts again on
# every call): the plain one (the floor's three bands) and the keyed one (``keyed``, for a
# queue with key_concurrency, plus the due-keys check of ``expired``). Each claims only from a
# queue of its kind, read from the queue row in the statement itself; for the other kind its
# ``go`` is empty and it changes nothing, and PostgresStore.claim_statement runs the other variant
# (and remembers the queue's kind, so that costs one statement when a queue changes kind).
_CLAIM_PG = """
WITH q0 AS (
    SELECT id, concurrency > 0 OR rate_limit > 0 OR key_rate_limit > 0 AS limited, visibility_ms, paused,
        key_concurrency + key_rate_limit AS key_concurrency
    FROM {queue} WHERE name = %(name)s),
fl AS (
    SELECT COALESCE(MAX(f.priority), 0) AS p, COALESCE(MAX(f.seq), 0) AS s, COALESCE(MAX(f.lease_from), 0) AS lf
    FROM {floor} f WHERE f.queue_id = (SELECT id FROM q0)),
q AS (
    SELECT q0.id, q0.limited, q0.visibility_ms, q0.paused,
        EXISTS (SELECT 1 FROM {lease} l
            WHERE l.queue_id = q0.id AND l.deadline >= fl.lf AND l.deadline <= (SELECT {now})){wake} AS expired
    FROM q0 CROSS JOIN fl),
go AS (
    SELECT id, COALESCE(%(vis)s::bigint, visibility_ms) AS vis FROM q
    WHERE NOT limited AND (SELECT key_concurrency FROM q0) {kind} 0 AND (NOT expired OR %(after_reap)s::boolean)),
c AS (SELECT {now} AS t{relax}),
h AS (SELECT string_to_array(%(hashes)s, ',') AS a),
g AS (SELECT id FROM go WHERE NOT (SELECT paused FROM q)),
picked AS (
    SELECT seq, priority, payload_size FROM ({bands}) AS bands LIMIT %(n)s),
ranked AS (
    SELECT seq, ROW_NUMBER() OVER w AS rn, SUM(payload_size) OVER w AS cum
    FROM picked WINDOW w AS (ORDER BY priority DESC, seq ROWS UNBOUNDED PRECEDING)),
c2 AS (SELECT {now} AS t FROM (SELECT COUNT(*) FROM picked) AS after_locks),
taken AS (
    UPDATE {job} j SET state = 'running', attempts = j.attempts + 1, generation = j.generation + 1,
        claimed_at = c2.t, changed_at = c2.t, worker = %(w)s, {clear}
    FROM ranked, c2 WHERE j.seq = ranked.seq AND ranked.cum <= %(cap)s
    RETURNING j.seq, j.uid, j.payload, j.generation, j.attempts, j.max_attempts, j.priority,
        j.enqueued_at, j.run_at, j.timeout_ms, j.claimed_at, ranked.rn, j.metadata, j.has_dependents),
leases AS (
    INSERT INTO {lease} (job_id, queue_id, generation, receipt_hash, claimed_at, deadline, timeout_at, worker)
    SELECT seq, (SELECT id FROM go), generation, (SELECT a FROM h)[rn], claimed_at,
        CASE WHEN timeout_ms > 0 THEN LEAST(claimed_at + (SELECT vis FROM go), claimed_at + timeout_ms)
             ELSE claimed_at + (SELECT vis FROM go) END,
        CASE WHEN timeout_ms > 0 THEN claimed_at + timeout_ms END, %(w)s
    FROM taken),
totals AS (
    SELECT COUNT(*) AS k, COALESCE(SUM(GREATEST(0, claimed_at - GREATEST(enqueued_at, run_at))), 0) AS wait
    FROM taken),
shard AS (
    UPDATE {counter} s SET claimed = s.claimed + totals.k, wait_ms_sum = s.wait_ms_sum + totals.wait,
        wait_count = s.wait_count + totals.k
    FROM totals WHERE totals.k > 0
        AND s.id = (SELECT id FROM {counter} WHERE queue_id = (SELECT id FROM go) LIMIT 1 FOR UPDATE SKIP LOCKED)
    RETURNING s.id),
spare AS (
    INSERT INTO {counter} (queue_id, claimed, wait_ms_sum, wait_count)
    SELECT (SELECT id FROM go), k, wait, k FROM totals WHERE k > 0 AND NOT EXISTS (SELECT 1 FROM shard))
SELECT q.id, q.limited, q.visibility_ms, q.expired, (SELECT vis FROM go), seq, uid, payload, generation,
    attempts, max_attempts, priority, enqueued_at, timeout_ms, claimed_at, rn, metadata, has_dependents,
    GREATEST(0, claimed_at - GREATEST(enqueued_at, run_at))
FROM q LEFT JOIN taken ON true
"""

# One band of the claim's jobs, in claim order, locked as the outer LIMIT pulls.
_CLAIM_BAND = """SELECT * FROM (SELECT seq, priority, payload_size FROM {{job}}
    WHERE (SELECT id FROM g) IS NOT NULL AND queue_id = (SELECT id FROM g) AND state = 'queued'
        AND run_at <= (SELECT t FROM c){bound}
    ORDER BY priority DESC, seq LIMIT %(n)s FOR UPDATE SKIP LOCKED) AS {name}"""

#: The plain variant's bands: above the floor's priority, at it from its seq on, below it.
_CLAIM_FLOOR_BANDS = " UNION ALL ".join(
    _CLAIM_BAND.format(name=name, bound=bound)
    for name, bound in (
        ("above", " AND priority > (SELECT p FROM fl)"),
        ("at_floor", " AND priority >= (SELECT p FROM fl) AND priority <= (SELECT p FROM fl) AND seq >= (SELECT s FROM fl)"),
        ("below", " AND priority < (SELECT p FROM fl)"),
    )
)

#: The keyed variant's parts: one band; held jobs of keys with room that became due make ``expired``.
_CLAIM_KEYED_BAND = _CLAIM_BAND.format(name="keyed", bound="")
_CLAIM_KEY_WAKE = " OR EXISTS (SELECT 1 FROM {keys} k WHERE k.wake_at <= (SELECT {now}) AND k.queue_id = q0.id)"

#: What folding the claim's whitespace replaces, in order (see _fold_sql).
_FOLDS = ((", ", ","), ("( ", "("), (" (", "("), (" )", ")"), (") ", ")"), (" = ", "="))


def _fold_sql(sql: str) -> str:
    """``sql`` with its runs of whitespace made one space, and none next to a bracket, a comma or " = ".

    Only for statements none of whose literals holds whitespace (the claim's: ``'queued'``,
    ``','``, ...), whose meaning it then keeps.
    """
    sql = sql.replace("\n", " ")
    while "  " in sql:
        sql = sql.replace("  ", " ")
    for old, new in _FOLDS:
        sql = sql.replace(old, new)
    return sql.strip()


@functools.lru_cache(maxsize=64)  # four in production; tests' shifted clocks (FQ_TEST_CLOCK_OFFSET_MS) make more
def _claim_pg(keyed: bool, now: str, relaxed: bool) -> str:
    """The claim statement of one variant (``keyed``: for a queue with key_concurrency), formatted once.

    Folded (:func:`_fold_sql`) to stay under the 4,096 bytes psycopg keeps parsed.
    """
    # Autocommit: this statement is its own transaction, and set_config(..., true)
    # relaxes just that transaction's commit (see db.relaxed_commit).
    relax = " FROM (SELECT set_config('synchronous_commit', 'off', true)) AS relaxed" if relaxed else ""
    text = _CLAIM_PG.replace("{bands}", _CLAIM_KEYED_BAND if keyed else _CLAIM_FLOOR_BANDS).replace(
        "{wake}", _CLAIM_KEY_WAKE if keyed else ""
    )
    return _fold_sql(
        text.format(
            now=now, clear=CLEAR_PROGRESS_SQL, relax=relax, queue=QUEUE_TABLE, job=JOB_TABLE, lease=LEASE_TABLE,
            counter=COUNTER_TABLE, floor=FLOOR_TABLE, keys=KEY_TABLE, kind=">" if keyed else "=",
        )
    )


# What both ack statements do once ``v`` (seq, result, args: the leases to end,
# locked) and ``c`` (now, read after the locks) are known: end the leases still
# live, mark their jobs succeeded, add to the queue's counters (queue id: ``q``).
# ``gone`` returns ``v``'s columns with each lease it deleted, so no later part
# joins two CTEs: PostgreSQL cannot index a CTE and joined them by a nested loop,
# quadratic in the batch (a 500-job ack spent most of its time there).
_ACK_TAIL = (
    """
gone AS (
    DELETE FROM {lease} l USING v, c WHERE l.job_id = v.seq AND l.deadline > c.t
    RETURNING l.job_id, l.claimed_at, l.receipt_hash, v.*),
done AS (
    UPDATE {job} j SET state = 'succeeded', result = gone.result, settled_hash = gone.receipt_hash,
        settled_args = gone.args, settled_op = 'ack', settled_outcome = '"""
    + _ACKED_JSON.replace("{", "{{").replace("}", "}}")
    + """',
        finished_at = c.t, changed_at = c.t
    FROM gone CROSS JOIN c WHERE j.seq = gone.job_id),
totals AS (SELECT COUNT(*) AS k, COALESCE(SUM(GREATEST(0, c.t - gone.claimed_at)), 0) AS run FROM gone, c),
shard AS (
    UPDATE {counter} s SET acked = s.acked + totals.k, active = s.active - totals.k,
        run_ms_sum = s.run_ms_sum + totals.run, run_count = s.run_count + totals.k
    FROM totals WHERE totals.k > 0
        AND s.id = (SELECT id FROM {counter} WHERE queue_id = (SELECT id FROM q) LIMIT 1 FOR UPDATE SKIP LOCKED)
    RETURNING s.id),
spare AS (
    INSERT INTO {counter} (queue_id, acked, active, run_ms_sum, run_count)
    SELECT (SELECT id FROM q), k, -k, run, k FROM totals WHERE k > 0 AND NOT EXISTS (SELECT 1 FROM shard))
"""
)

# The common ack on PostgreSQL as one statement: lock the leases the receipts
# name (in job order), read the clock once the locks are held, then the tail.
# A job with a concurrency key is left to the general ack, which gives its key's
# slot back in the same transaction (the key never changes, so the snapshot's is right).
# A job others depend on is left out too (the caller acks it in a transaction that
# releases its dependents): the job row is locked too, so a flag set by an enqueue
# that committed while this waited is seen (the row is read again under the lock).
_ACK_MATCHING_PG = (
    """
WITH q AS (SELECT id FROM {queue} WHERE name = %(queue)s),
r AS (SELECT * FROM json_to_recordset(%(req)s::json) AS r(uid text, gen bigint, hash text, result text, args text)),
v AS (
    SELECT l.job_id AS seq, r.uid, r.result, r.args
    FROM r JOIN {job} j ON j.uid = r.uid JOIN {lease} l ON l.job_id = j.seq
    WHERE l.queue_id = (SELECT id FROM q) AND l.generation = r.gen AND l.receipt_hash = r.hash
        AND j.concurrency_key IS NULL AND NOT j.has_dependents
    ORDER BY l.job_id FOR UPDATE OF l FOR NO KEY UPDATE OF j),
c AS (SELECT {now} AS t FROM (SELECT COUNT(*) FROM v) AS after_locks{relax}),"""
    + _ACK_TAIL
    + """SELECT gone.uid, GREATEST(0, c.t - gone.claimed_at), c.t, (SELECT id FROM q) FROM gone CROSS JOIN c
"""
)

# Ack on PostgreSQL in one statement, under the lease locks the transaction
# already holds: end the leases still live now, mark their jobs succeeded,
# add to the counters. Returns the jobs acked.
_ACK_PG = (
    """
WITH q AS (SELECT %(q)s::bigint AS id),
c AS (SELECT {now} AS t),
v AS (
    SELECT *, NULL::text AS uid
    FROM unnest(%(seqs)s::bigint[], %(results)s::text[], %(args)s::text[]) AS v(seq, result, args)),"""
    + _ACK_TAIL
    + """SELECT gone.job_id, GREATEST(0, c.t - gone.claimed_at), c.t FROM gone CROSS JOIN c
"""
)

# The same ack for jobs others depend on, with their release (docs/reference/semantics.md §9
# "Dependencies"): the second statement of a transaction whose first locked the leases and the
# job rows (lock_leases with lock_jobs), so its snapshot, taken after the locks were granted,
# holds every edge an enqueue committed into these jobs (an enqueue sets has_dependents or
# reads the rows FOR SHARE: it waits for the locks, or they waited for it). Edges out of the
# jobs acked are closed through the (upstream, job) index; each dependent is counted down and,
# at zero, queued in one UPDATE of its row (a concurrent ack of its other dependency waits for
# the row and re-reads the count: released exactly once), locked first in seq order. Released
# jobs without a key limit lower their queue's claim floor and notify here; the keyed ones are
# returned for keys.admit_released. The batches the jobs acked are members of are counted here
# too (by the membership's primary key), for batches.settle: a round trip fewer on the
# hand-off (docs/performance.md#workflows). Rows: ('a', seq) per job acked, ('k', seq, queue id,
# priority, key, queue name) per keyed job released, ('b', batch id, members acked) per batch.
_ACK_RELEASE_PG = (
    """
WITH q AS (SELECT %(q)s::bigint AS id),
c AS (SELECT {now} AS t),
v AS (
    SELECT *, NULL::text AS uid
    FROM unnest(%(seqs)s::bigint[], %(results)s::text[], %(args)s::text[]) AS v(seq, result, args)),"""
    + _ACK_TAIL
    + """,
edges AS (
    UPDATE {dependency} e SET pending = FALSE FROM gone
    WHERE e.upstream_id = gone.job_id AND e.pending
    RETURNING e.job_id),
counts AS (SELECT job_id, COUNT(*) AS n FROM edges GROUP BY job_id),
locked AS (
    SELECT d.seq FROM {job} d WHERE d.seq IN (SELECT job_id FROM counts) AND d.state = 'waiting'
    ORDER BY d.seq FOR NO KEY UPDATE),
counted AS (
    UPDATE {job} d SET
        waiting_on = GREATEST(d.waiting_on - counts.n, 0),
        state = CASE WHEN d.waiting_on - counts.n <= 0 THEN 'queued' ELSE d.state END,
        run_at = CASE WHEN d.waiting_on - counts.n <= 0 THEN GREATEST(d.run_at, c.t) ELSE d.run_at END,
        changed_at = CASE WHEN d.waiting_on - counts.n <= 0 THEN c.t ELSE d.changed_at END
    FROM counts JOIN locked ON locked.seq = counts.job_id CROSS JOIN c
    WHERE d.seq = counts.job_id AND d.state = 'waiting'
    RETURNING d.seq, d.queue_id, d.priority, d.concurrency_key, d.state = 'queued' AS released),
rel AS (
    SELECT r.seq, r.queue_id, r.priority, r.concurrency_key, qq.name,
        r.concurrency_key IS NOT NULL AND qq.key_concurrency + qq.key_rate_limit > 0 AS keyed
    FROM counted r JOIN {queue} qq ON qq.id = r.queue_id WHERE r.released),
floors AS (
    UPDATE {floor} f SET seq = LEAST(f.seq, m.seq),
        pend_seq = CASE WHEN f.pend_seq > m.seq THEN m.seq ELSE f.pend_seq END
    FROM (SELECT queue_id, priority, MIN(seq) AS seq FROM rel WHERE NOT keyed GROUP BY queue_id, priority) AS m
    WHERE f.queue_id = m.queue_id AND f.priority = m.priority AND (f.seq > m.seq OR f.pend_seq > m.seq)
    RETURNING f.queue_id),
woken AS (
    SELECT pg_notify(%(channel)s, n.name) FROM (SELECT DISTINCT name FROM rel WHERE NOT keyed ORDER BY name) AS n),
members AS (
    SELECT m.batch_id, COUNT(*) AS n FROM {batch_member} m JOIN gone ON m.job_id = gone.job_id GROUP BY m.batch_id)
SELECT 'a', job_id, GREATEST(0, c.t - gone.claimed_at), NULL::integer, NULL::text, NULL::text FROM gone CROSS JOIN c
UNION ALL SELECT 't', t, NULL, NULL, NULL, NULL FROM c
UNION ALL SELECT 'k', seq, queue_id, priority, concurrency_key, name FROM rel WHERE keyed
UNION ALL SELECT 'n', COUNT(*), NULL, NULL, NULL, NULL FROM woken
UNION ALL SELECT 'b', batch_id, n, NULL, NULL, NULL FROM members
"""
)


#: Runs of a hot statement on one connection before psycopg prepares it (psycopg's own default).
PREPARE_THRESHOLD = 5

#: Bytes of escaped parameter text one statement carries at most (:meth:`PostgresStore.statement_budget`):
#: a quarter of PostgreSQL's 1 GB limit on one protocol message and on one text value.
STATEMENT_BUDGET_BYTES = 256 * 1024 * 1024


#: SQLSTATE classes (prefixes) of errors that say the server cannot serve now: connection exceptions,
#: insufficient resources (too many connections), operator intervention (shutdown, crash recovery).
UNAVAILABLE_SQLSTATES = ("08", "53", "57P")


class PostgresStore(Store):
    """PostgreSQL 14+ through Django's ``postgresql`` backend and psycopg 3."""

    vendor = "postgresql"
    supports_skip_locked = True
    supports_row_locks = True
    supports_listen_notify = True
    supports_partial_indexes = True
    supports_relaxed_commit = True
    supports_server_prepare = True
    supports_one_statement_claim = True
    supports_one_statement_ack = True
    supports_claim_floor = True
    embedded = False
    export_name = vendor
    key_share_sql = " FOR KEY SHARE"
    skip_locked_sql = " FOR UPDATE SKIP LOCKED"
    update_lock_sql = " FOR NO KEY UPDATE"  # enqueues' FOR KEY SHARE passes
    json_object_sql = "jsonb_build_object"
    json_param_sql = "%s::jsonb"
    clock_sql = NOW_SQL

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: Names of the queues whose claims last took the keyed variant of the claim (see _claim_pg).
        self._keyed_queues: set[str] = set()


    def json_contains_sql(self, target: str, needle: str) -> str:
        # The column is text (compact JSON, as written at enqueue): cast per row, no index.
        return f"(({target})::jsonb @> ({needle})::jsonb)"

    def greatest_sql(self, a: str, b: str) -> str:
        return f"GREATEST({a}, {b})"

    @contextlib.contextmanager
    def write_atomic(self, conn: Any):
        with transaction.atomic(using=conn.alias):
            yield conn

    def take_write_lock(self, conn: Any, queue_name: str) -> None:
        return None  # row locks are taken by the statements themselves

    def relax_commit(self, conn: Any) -> None:
        with conn.cursor() as cur:
            cur.execute("SET LOCAL synchronous_commit = off")

    def hot_cursor(self, conn: Any) -> Any:
        # Binds parameters on the server, so psycopg prepares a statement after
        # PREPARE_THRESHOLD runs on the connection (see django_fq.db.hot_cursor).
        from django.db.backends.postgresql.base import ServerBindingCursor

        conn.ensure_connection()
        pg = conn.connection
        if pg.prepare_threshold is None and "prepare_threshold" not in conn.settings_dict.get("OPTIONS", {}):
            # Django turns preparing off unless OPTIONS names a prepare_threshold. Its own
            # cursors bind on the client and never prepare, so this reaches only these
            # statements; an explicit OPTIONS["prepare_threshold"] (None: never) wins.
            pg.prepare_threshold = PREPARE_THRESHOLD
        with conn.wrap_database_errors:
            raw = ServerBindingCursor(pg)  # type: ignore[call-arg]  # psycopg's Cursor(connection)
        return conn._prepare_cursor(raw)

    def notify(self, conn: Any, channel: str, queue_name: str) -> None:
        with conn.cursor() as cur:
            cur.execute("SELECT pg_notify(%s, %s)", [channel, queue_name])

    def release_connection(self, conn: Any) -> bool:
        # A connection is a server process (and maybe a pooler slot) held while idle.
        if conn.in_atomic_block or conn.connection is None:
            return False
        conn.close()
        return True

    @contextlib.contextmanager
    def page_reads(self, conn: Any):
        with transaction.atomic(using=conn.alias):
            with conn.cursor() as cur:
                cur.execute("SET LOCAL jit = off")
            yield conn

    @contextlib.contextmanager
    def read_snapshot(self, conn: Any):
        with transaction.atomic(using=conn.alias):
            with conn.cursor() as cur:
                cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            yield conn

    def lock_queue_row(self, conn: Any, queue_table: str, queue_id: int, *, exclusive: bool = False) -> bool:
        # FOR KEY SHARE, as enqueues take it: a concurrent delete of the queue waits.
        # FOR UPDATE (a delete) waits for those and stops new ones.
        mode = "UPDATE" if exclusive else "KEY SHARE"
        with conn.cursor() as cur:
            cur.execute(f"SELECT id FROM {queue_table} WHERE id = %s FOR {mode}", [queue_id])
            return cur.fetchone() is not None

    def lock_queue_creation(self, conn: Any, key: int) -> None:
        with conn.cursor() as cur:
            cur.execute("SELECT pg_advisory_xact_lock(%s)", [key])

    def schema_sql(self, conn: Any, *, reverse: bool = False) -> list[str]:
        # Partial indexes as the models write them; a deterministic collation's equality is byte equality.
        return []

    def prepare_connection(self, conn: Any) -> None:
        return None  # clock_timestamp() is epoch-based: the session time zone does not enter the clock

    def check_server(self, conn: Any, *, tables: Sequence[str], max_payload_bytes: int) -> list[Finding]:
        return []  # PostgreSQL 14+ has everything django-fq uses, whatever its settings

    def journal_mode(self, conn: Any) -> str | None:
        return None  # the server's write-ahead log serves every process

    def startup_probe(self, conn: Any) -> None:
        return None  # no database-wide lock to meet; a worker may start before its server is up

    errors_filter_sql = "jsonb_typeof(errors) = 'array' AND errors <> '[]'::jsonb"

    def failure_entries_sql(self, newest: str, marks: str) -> str:
        # CASE keeps the cast away from entries whose "at" is not a whole number.
        return (
            "SELECT CASE WHEN jsonb_typeof(e.value -> 'at') = 'number' AND (e.value ->> 'at') ~ '^[0-9]{1,18}$' "
            "THEN CAST(e.value ->> 'at' AS bigint) END AS at "
            f"FROM ({newest}) AS j CROSS JOIN LATERAL jsonb_array_elements(j.errors) AS e(value) "
            f"WHERE jsonb_typeof(e.value) = 'object' AND e.value ->> 'kind' IN ({marks})"
        )

    def is_retryable(self, exc: BaseException) -> bool:
        # SQLSTATE 40P01 deadlock_detected, 40001 serialization_failure; psycopg puts the code
        # on the error Django wraps (__cause__). The message test serves errors without one.
        code = getattr(getattr(exc, "__cause__", None), "sqlstate", None) or getattr(exc, "sqlstate", None)
        text = str(exc).lower()
        return code in ("40P01", "40001") or "deadlock detected" in text or "could not serialize" in text

    # --- leases (claim, settle, expiry) ---

    def claim_statement(
        self,
        conn: Any,
        *,
        queue_name: str,
        count: int,
        visibility_ms: int | None,
        worker: str,
        after_reap: bool,
        cap: int,
        hashes: Sequence[str],
        relaxed: bool,
    ) -> list[tuple]:
        """:data:`_CLAIM_PG`, one statement in autocommit (see :meth:`Store.claim_statement`).

        Runs the variant of the queue's kind as last seen on this store (keyed: key_concurrency or
        key_rate_limit set); when the statement says it was the other kind (nothing claimed, and
        neither a limit nor an expired lease the caller must handle first emptied ``go``), the
        other variant runs at once and the kind is remembered.
        """
        from .. import db

        now, keyed_queues = db.now_sql(conn), self._keyed_queues
        params = {
            "name": queue_name,
            "after_reap": after_reap,
            "n": count,
            "w": worker,
            "cap": cap,
            "vis": visibility_ms,
            "hashes": ",".join(hashes),  # hex: one text, not an array to encode
        }
        keyed = queue_name in keyed_queues
        with self.hot_cursor(conn) as cur:
            cur.execute(_claim_pg(keyed, now, relaxed), params)
            rows = cur.fetchall()
            if rows and rows[0][4] is None and not rows[0][1] and (after_reap or not rows[0][3]):
                keyed = not keyed  # go was empty for the queue's kind alone: the other variant claims
                cur.execute(_claim_pg(keyed, now, relaxed), params)
                rows = cur.fetchall()
                if keyed:
                    keyed_queues.add(queue_name)
                else:
                    keyed_queues.discard(queue_name)
            return rows

    # --- the claim floor (docs/explanation/storage.md#the-claim-floor) -------------------------

    def create_claim_floor(self, conn: Any, queue_id: int) -> None:
        """``INSERT … SELECT`` from the queue row (none: the queue is gone), unless a floor row is there already."""
        with conn.cursor() as cur:
            cur.execute(
                f"INSERT INTO {FLOOR_TABLE} (queue_id, priority, seq, lease_from) "
                f"SELECT id, 0, 0, 0 FROM {QUEUE_TABLE} WHERE id = %s "
                # A row another transaction holds (the raise passed over it) is seen here and
                # left alone: ON CONFLICT alone would wait for that transaction.
                f"AND NOT EXISTS (SELECT 1 FROM {FLOOR_TABLE} WHERE queue_id = %s) ON CONFLICT (queue_id) DO NOTHING",
                [queue_id, queue_id],
            )

    def claim_floor_ripe(self, conn: Any, queue_id: int) -> tuple[int | None, bool] | None:
        """One ``SELECT``: the floor row's ``pend_xmax`` and whether every transaction of this database
        with an id at or below it has ended (None: no floor row).

        Running transactions are read from ``pg_locks`` (each holds its own id's
        lock until it ends; the view needs no privilege), their database from
        ``pg_stat_activity`` (a backend found there in no database counts as this
        one's), prepared ones from ``pg_prepared_xacts``. Ids are 32 bits there:
        one is at or below ``pend_xmax`` when it is not less than 2³¹ ahead of
        its low 32 bits (a running id is always within 2³¹ of any id of its time).
        Other databases' transactions cannot write this database's rows, so they
        are not waited for.
        """
        # How far id {x} is ahead of pend_xmax, modulo 2**32 (mod(): "%" is the driver's placeholder).
        ahead = "mod(mod({x}::text::bigint - mod(f.pend_xmax, 4294967296), 4294967296) + 4294967296, 4294967296)"
        older = f"({ahead} = 0 OR {ahead} >= 2147483648)"
        with conn.cursor() as cur:
            cur.execute(
                # First the server's oldest transaction in progress (cheap): past pend_xmax, every older
                # transaction has ended. Only otherwise the lock table (milliseconds on a busy server).
                f"SELECT f.pend_xmax, f.pend_xmax IS NOT NULL AND CASE "
                f"WHEN pg_snapshot_xmin(pg_current_snapshot())::text::bigint > f.pend_xmax THEN true ELSE "
                f"NOT EXISTS (SELECT 1 FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid "
                f"WHERE l.locktype = 'transactionid' AND l.mode = 'ExclusiveLock' AND l.granted "
                f"AND l.pid IS DISTINCT FROM pg_backend_pid() "
                f"AND (a.datid IS NULL OR a.datid = (SELECT oid FROM pg_database WHERE datname = current_database())) "
                f"AND {older.format(x='l.transactionid')}) "
                f"AND NOT EXISTS (SELECT 1 FROM pg_prepared_xacts p WHERE p.database = current_database() "
                f"AND {older.format(x='p.transaction')}) END "
                f"FROM {FLOOR_TABLE} f WHERE f.queue_id = %s",
                [queue_id],
            )
            found = cur.fetchone()
        return None if found is None else (found[0], bool(found[1]))

    def claim_floor_facts(self, conn: Any, queue_id: int) -> dict | None:
        """One ``SELECT`` that assigns no transaction id (nothing before it in the raise does either).

        ``started_ms`` is ``statement_timestamp()``, set before
        that snapshot is taken (plus the test clock offset, as :func:`~django_fq.db.now_sql`).
        """
        from .. import conf

        started = f"(FLOOR(EXTRACT(EPOCH FROM statement_timestamp()) * 1000)::bigint + {conf.clock_offset_ms():d})"
        with conn.cursor() as cur:
            cur.execute(
                f"SELECT f.priority, f.seq, f.lease_from, f.pend_seq, f.pend_lease_from, f.pend_xmax, "
                f"(SELECT j.seq FROM {JOB_TABLE} j WHERE j.queue_id = f.queue_id AND j.state = 'queued' "
                f"AND j.priority >= f.priority AND j.priority <= f.priority AND j.seq >= f.seq "
                f"ORDER BY j.priority DESC, j.seq LIMIT 1), "
                f"(SELECT MAX(seq) FROM {JOB_TABLE}), "
                f"(SELECT MIN(l.deadline) FROM {LEASE_TABLE} l WHERE l.queue_id = f.queue_id "
                f"AND l.deadline >= f.lease_from), {started} "
                f"FROM {FLOOR_TABLE} f WHERE f.queue_id = %s",
                [queue_id],
            )
            found = cur.fetchone()
        if found is None:
            return None
        names = ("priority", "seq", "lease_from", "pend_seq", "pend_lease_from", "pend_xmax")
        first_seq, max_seq, lease_min, started_ms = found[6:]
        return {
            "row": dict(zip(names, found[:6], strict=True)), "first_seq": first_seq,
            "max_seq": max_seq, "lease_min": lease_min, "started_ms": int(started_ms),
        }  # fmt: skip

    def write_claim_floor(self, conn: Any, *, queue_id: int, seen: dict, new: dict) -> bool:
        """One ``UPDATE`` of the row locked ``FOR UPDATE SKIP LOCKED`` in a subquery: never waits.

        The ``UPDATE`` gives the transaction its id, after the facts' snapshot;
        ``pend_xmax`` is that id (``pg_current_xact_id()``) when ``new`` has a
        pending value.
        """
        cols = ("priority", "seq", "lease_from", "pend_seq", "pend_lease_from", "pend_xmax")
        same = " AND ".join(f"{c} IS NOT DISTINCT FROM %s" for c in cols)
        with conn.cursor() as cur:
            cur.execute(
                f"UPDATE {FLOOR_TABLE} SET seq = %s, lease_from = %s, pend_seq = %s, pend_lease_from = %s, "
                f"pend_xmax = CASE WHEN %s THEN pg_current_xact_id()::text::bigint END "
                f"WHERE queue_id = (SELECT queue_id FROM {FLOOR_TABLE} WHERE queue_id = %s AND {same} "
                f"FOR UPDATE SKIP LOCKED)",
                [
                    new["seq"], new["lease_from"], new["pend_seq"], new["pend_lease_from"], new["pending"],
                    queue_id, *(seen[c] for c in cols),
                ],
            )
            return cur.rowcount == 1

    def lower_claim_floors(self, conn: Any, jobs: Sequence[tuple[int, int, int]]) -> None:
        """One ``UPDATE … FROM unnest(…)`` that writes (and locks) only the floors it must lower.

        A floor already at or below every job writes nothing, so the common nack
        leaves no row version behind; one it lowers stays locked until commit,
        which a raise (``SKIP LOCKED``) then passes over.
        """
        if not jobs:
            return
        with conn.cursor() as cur:
            cur.execute(
                f"UPDATE {FLOOR_TABLE} f SET seq = LEAST(f.seq, v.seq), "
                f"pend_seq = CASE WHEN f.pend_seq > v.seq THEN v.seq ELSE f.pend_seq END "
                f"FROM (SELECT queue_id, priority, MIN(seq) AS seq "
                f"FROM unnest(%s::bigint[], %s::integer[], %s::bigint[]) AS u(queue_id, priority, seq) "
                f"GROUP BY queue_id, priority) AS v "
                f"WHERE f.queue_id = v.queue_id AND f.priority = v.priority AND (f.seq > v.seq OR f.pend_seq > v.seq)",
                [[j[0] for j in jobs], [j[1] for j in jobs], [j[2] for j in jobs]],
            )

    def admit_held(self, conn: Any, *, now: str, queue_id: int, rooms: dict[str, int]) -> list[tuple[str, int, int]]:
        """:meth:`Store.admit_held` as one statement over every key: a ``LATERAL`` read of each key's held jobs.

        Each key's read walks the held index in claim order from its start and
        stops after its room, so a key with a hundred thousand held jobs costs
        what a key with one does.
        """
        if not rooms:
            return []
        keys = sorted(rooms)
        with conn.cursor() as cur:
            cur.execute(
                f"WITH c AS (SELECT {now} AS t), r AS (SELECT * FROM unnest(%s::text[], %s::int[]) AS r(k, room)), "
                f"p AS (SELECT r.k, h.priority, h.seq FROM r CROSS JOIN LATERAL (SELECT priority, seq FROM {JOB_TABLE} "
                f"WHERE queue_id = %s AND state = 'held' AND concurrency_key = r.k AND run_at <= (SELECT t FROM c) "
                f"ORDER BY priority DESC, seq LIMIT r.room FOR UPDATE SKIP LOCKED) AS h), "
                f"u AS (UPDATE {JOB_TABLE} j SET state = 'queued', changed_at = (SELECT t FROM c) FROM p "
                f"WHERE j.seq = p.seq RETURNING p.k, p.priority, p.seq) SELECT k, priority, seq FROM u",
                [keys, [rooms[k] for k in keys], queue_id],
            )
            return [(k, p, s) for k, p, s in cur.fetchall()]

    def take_jobs(
        self,
        conn: Any,
        *,
        queue_id: int,
        count: int,
        concurrency: int,
        worker: str,
        cap: int,
        rate: RateGate | None = None,
    ) -> list[dict]:
        """Up to four round trips: the limits re-read under ``FOR NO KEY UPDATE`` and the live leases counted
        (only with a concurrency limit), the jobs locked ``FOR UPDATE SKIP LOCKED``, then one ``UPDATE …
        RETURNING``; a rate limit adds its gate (:meth:`Store.open_rate_gate`, :meth:`Store.close_rate_gate`)."""
        from django.db.models import Exists

        from .. import db
        from ..models import Job, Queue

        queue, job, lease = QUEUE_TABLE, JOB_TABLE, LEASE_TABLE
        now = db.now_sql(conn)
        rate_limited = rate is not None and rate.limit > 0
        with conn.cursor() as cur:
            if concurrency > 0 or rate_limited:
                # Re-read the limits under the lock: a configure() that committed
                # meanwhile must not be overruled by the values read above. NO KEY
                # UPDATE still serializes claims and configure, but does not wait
                # for enqueues, which hold the row FOR KEY SHARE until they commit.
                cur.execute(
                    f"SELECT concurrency, rate_limit, rate_window_ms FROM {queue} WHERE id = %s FOR NO KEY UPDATE",
                    [queue_id],
                )
                concurrency, rate_limit, window_ms = cur.fetchone()
                if concurrency > 0:  # 0 now means unlimited
                    cur.execute(f"SELECT COUNT(*) FROM {lease} WHERE queue_id = %s", [queue_id])
                    count = min(count, concurrency - cur.fetchone()[0])
                    if count <= 0:
                        return []
                if rate is not None:
                    rate.limit, rate.window_ms = rate_limit, window_ms
                    if rate_limit > 0:
                        count = self.open_rate_gate(conn, rate, queue_id=queue_id, want=count)
                        if count <= 0:
                            return []
            # The pause flag in the statement that locks the jobs (an uncorrelated subquery,
            # evaluated once): the jobs and the flag come from one snapshot.
            paused = Queue.objects.using(conn.alias).filter(id=queue_id, paused=True)
            picked = list(
                Job.objects.using(conn.alias)
                .filter(~Exists(paused), queue_id=queue_id, state="queued", run_at__lte=db.DbNow())
                .order_by("-priority", "seq")
                .select_for_update(skip_locked=True)
                .values_list("seq", "payload_size")[:count]
            )
            seqs = within_cap(picked, cap)
            if not seqs:
                return []
            marks = ", ".join(["%s"] * len(seqs))
            returning = ", ".join(TAKEN_COLUMNS)
            cur.execute(
                f"WITH c AS (SELECT {now} AS t) UPDATE {job} SET state = 'running', attempts = attempts + 1, "
                f"generation = generation + 1, claimed_at = c.t, changed_at = c.t, worker = %s, {CLEAR_PROGRESS_SQL} "
                f"FROM c WHERE seq IN ({marks}) RETURNING {returning}",
                [worker, *seqs],
            )
            taken = fetch_dicts(cur)
        if rate is not None and rate.limit > 0:
            self.close_rate_gate(conn, rate, queue_id=queue_id, rows=taken)
        return taken

    def end_expired_leases(self, conn: Any, *, queue_id: int | None, limit: int) -> list[dict]:
        """:meth:`Store.end_expired_leases` as one ``DELETE … WHERE job_id = ANY(ARRAY(…))``.

        The array makes the locked, expired leases the driving side: as ``IN
        (…)`` the planner, trusting a small table's statistics, read every entry
        of the lease primary key and probed the subquery from there, which walks
        all the dead entries a long-running snapshot keeps (1,052 buffers for
        nothing to expire). The clock is read once, so ``deadline <= now`` bounds
        the index scan; of one queue, the scan starts at its floor's ``lease_from``.
        """
        from .. import db

        now = db.now_sql(conn)
        where = "deadline <= (SELECT t FROM c)"
        params: list[Any] = []
        if queue_id is not None:
            where = (
                f"queue_id = %s AND deadline >= COALESCE((SELECT lease_from FROM {FLOOR_TABLE} WHERE queue_id = %s), 0) "
                f"AND {where}"
            )
            params = [queue_id, queue_id]
        with conn.cursor() as cur:
            cur.execute(
                f"WITH c AS (SELECT {now} AS t) DELETE FROM {LEASE_TABLE} WHERE job_id = ANY(ARRAY("
                f"SELECT job_id FROM {LEASE_TABLE} WHERE {where} ORDER BY deadline LIMIT %s FOR UPDATE SKIP LOCKED)) "
                f"RETURNING job_id, queue_id, generation, receipt_hash, claimed_at, deadline, timeout_at, worker, "
                f"{now} AS now",
                [*params, limit],
            )
            return fetch_dicts(cur)

    # --- dependencies: arrays instead of long IN lists (storage/dependencies.py) ------------------

    dependency_chunk = 50_000

    def in_sql(self, column: str, values: Sequence[Any]) -> tuple[str, list]:
        # One array parameter: psycopg would split a statement of thousands of placeholders client-side.
        return f"{column} = ANY(%s)", [list(values)]

    def insert_dependencies(self, conn: Any, rows: Sequence[tuple[int, int, str, bool, str | None]]) -> None:
        """One ``INSERT … SELECT FROM unnest(…)`` for every edge (see :meth:`Store.insert_dependencies`)."""
        if not rows:
            return
        with conn.cursor() as cur:
            cur.execute(
                f"INSERT INTO {DEPENDENCY_TABLE} (job_id, upstream_id, on_failure, pending, name) "
                "SELECT * FROM unnest(%s::bigint[], %s::bigint[], %s::text[], %s::boolean[], %s::text[])",
                [
                    [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows], [bool(r[3]) for r in rows],
                    [r[4] for r in rows],
                ],
            )  # fmt: skip

    def lock_leases(
        self,
        conn: Any,
        queue_id: int | None,
        uids: Sequence[str],
        *,
        judge: bool = True,
        lock_jobs: bool = False,
        relax: bool = False,
        queue_name: str | None = None,
    ) -> list[dict]:
        """One round trip (``judge=False``: the lock alone) or two (the lock, then the verdict).

        ``relax``: the locking statement also sets ``synchronous_commit`` off
        for the transaction (``set_config(..., true)``, as ``SET LOCAL``), so
        :func:`django_fq.db.relax_commit` costs no round trip of its own.
        ``queue_name`` (with ``queue_id`` None): the queue is found by name in
        the same statement, and each row carries its ``queue_id``.
        """
        from .. import db

        job, lease = JOB_TABLE, LEASE_TABLE
        now = db.now_sql(conn)
        columns = "l.job_id, l.generation, l.receipt_hash, l.claimed_at, l.deadline, l.timeout_at, l.worker, j.uid, j.concurrency_key"
        if lock_jobs:
            columns += ", j.has_dependents"
        queue: Any = queue_id
        which = "%s"
        if queue_id is None:
            if queue_name is None:
                raise ValueError("lock_leases: a queue_id or a queue_name")
            queue, which = queue_name, f"(SELECT id FROM {QUEUE_TABLE} WHERE name = %s)"
            columns += ", l.queue_id"
        match = f"FROM {lease} l JOIN {job} j ON j.seq = l.job_id WHERE l.queue_id = {which} AND j.uid = ANY(%s)"
        locks = "FOR UPDATE OF l FOR NO KEY UPDATE OF j" if lock_jobs else "FOR UPDATE OF l"
        # Set once a row is locked (the target list runs after the locks): with no row found the
        # transaction writes nothing, so there is no commit to relax.
        relaxing = ", set_config('synchronous_commit', 'off', true) AS relaxed" if relax else ""
        with self.hot_cursor(conn) as cur:
            # Lock first, then judge the deadline: a verdict computed while
            # waiting for the lock would be stale once the lock is granted.
            locking = f"SELECT {columns if not judge else 'l.job_id'}{relaxing} {match} ORDER BY l.job_id {locks}"
            cur.execute(locking, [queue, list(uids)])
            if judge:
                cur.execute(
                    f"SELECT {columns}, CASE WHEN l.deadline > {now} THEN 1 ELSE 0 END AS live, {now} AS now {match}",
                    [queue, list(uids)],
                )
            return fetch_dicts(cur)

    def paused_past_snapshot(self, conn: Any, queue_name: str) -> bool:
        """In a caller's transaction: one round trip, the queue row read ``FOR SHARE`` unless READ COMMITTED.

        Under REPEATABLE READ or SERIALIZABLE every statement of the claim reads
        the snapshot of the transaction's first statement, so the one-statement
        claim (and :meth:`take_jobs`) would see the queue as it was before a
        later ``pause()``. The locking read fails with a serialization failure
        (SQLSTATE 40001) when the row was changed since the snapshot, a pause
        included; otherwise the row is held shared until the caller's
        transaction ends, so a ``pause()`` waits for that claim to commit, as on
        SQLite. ``FOR KEY SHARE`` would not do: it passes over a non-key update.
        Under READ COMMITTED (each statement reads the newest commit) the row is
        neither matched nor locked. Outside a transaction: False, no round trip.
        """
        if not conn.in_atomic_block:
            return False
        with conn.cursor() as cur:
            cur.execute(
                f"SELECT paused FROM {QUEUE_TABLE} WHERE name = %s "
                "AND current_setting('transaction_isolation') <> 'read committed' FOR SHARE",
                [queue_name],
            )
            row = cur.fetchone()
        return bool(row and row[0])

    def statement_budget(self, conn: Any) -> int:
        """:data:`STATEMENT_BUDGET_BYTES`: a quarter of PostgreSQL's 1 GB limit on one message or value.

        The one-statement ack sends its results inside one JSON text, so a
        completer batch of large results (up to 500 of 32 MiB) must be cut
        (:func:`~django_fq.services.leases.ack_many`). A quarter leaves room
        for the server's copies of the text while it decodes it.
        """
        return STATEMENT_BUDGET_BYTES

    def ack_matching(
        self, conn: Any, *, queue_name: str, requests_json: str, relaxed: bool
    ) -> dict[str, tuple[int, int, int]]:
        """:data:`_ACK_MATCHING_PG`, one statement in autocommit (see :meth:`Store.ack_matching`)."""
        from .. import db

        queue, job, lease, counter = QUEUE_TABLE, JOB_TABLE, LEASE_TABLE, COUNTER_TABLE
        relax = ", (SELECT set_config('synchronous_commit', 'off', true)) AS relaxed" if relaxed else ""
        sql = _ACK_MATCHING_PG.format(
            now=db.now_sql(conn), relax=relax, queue=queue, job=job, lease=lease, counter=counter
        )
        with self.hot_cursor(conn) as cur:
            # One JSON text: psycopg encodes it far faster than five arrays.
            cur.execute(sql, {"queue": queue_name, "req": requests_json})
            return {r[0]: r[1:] for r in cur.fetchall()}  # bigints: ints already

    def ack_locked(
        self, conn: Any, *, queue_id: int, seqs: Sequence[int], results: Sequence[str | None], args: Sequence[str]
    ) -> dict[int, tuple[int, int]]:
        """:data:`_ACK_PG`, one statement (see :meth:`Store.ack_locked`)."""
        from .. import db

        job, lease, counter = JOB_TABLE, LEASE_TABLE, COUNTER_TABLE
        with self.hot_cursor(conn) as cur:
            cur.execute(
                _ACK_PG.format(now=db.now_sql(conn), job=job, lease=lease, counter=counter),
                {"q": queue_id, "seqs": list(seqs), "results": list(results), "args": list(args)},
            )
            return {r[0]: r[1:] for r in cur.fetchall()}

    def ack_locked_releasing(
        self,
        conn: Any,
        *,
        queue_id: int,
        seqs: Sequence[int],
        results: Sequence[str | None],
        args: Sequence[str],
        channel: str,
    ) -> tuple[dict[int, tuple[int, int]], list[dict], dict[int, int]]:
        """:data:`_ACK_RELEASE_PG`, one statement (see :meth:`Store.ack_locked_releasing`)."""
        from .. import db

        sql = _ACK_RELEASE_PG.format(
            now=db.now_sql(conn), job=JOB_TABLE, lease=LEASE_TABLE, counter=COUNTER_TABLE, queue=QUEUE_TABLE,
            floor=FLOOR_TABLE, dependency=DEPENDENCY_TABLE, batch_member=BATCH_MEMBER_TABLE,
        )  # fmt: skip
        with self.hot_cursor(conn) as cur:
            cur.execute(
                sql,
                {"q": queue_id, "seqs": list(seqs), "results": list(results), "args": list(args), "channel": channel},
            )
            rows = cur.fetchall()
        now = next((int(r[1]) for r in rows if r[0] == "t"), 0)
        acked = {int(r[1]): (int(r[2]), now) for r in rows if r[0] == "a"}
        keyed = [
            {"seq": int(r[1]), "queue_id": int(r[2]), "priority": int(r[3]), "concurrency_key": r[4], "queue": r[5]}
            for r in rows
            if r[0] == "k"
        ]
        batches = {int(r[1]): int(r[2]) for r in rows if r[0] == "b"}
        return acked, keyed, batches

    def history_append_row_sql(self, column: str, entry_sql: str, keep: int) -> str:
        """The ``jsonb`` form: drop the oldest entry when full (``- 0``), append the row's entry."""
        base = f"COALESCE({column}, '[]'::jsonb)"
        return (
            f"(CASE WHEN jsonb_array_length({base}) >= {int(keep)} THEN {base} - 0 ELSE {base} END) "
            f"|| jsonb_build_array({entry_sql})"
        )

    def component_sql(self, limit: int) -> str:
        """:meth:`Store.component <django_fq.storage.dependencies.DependencySql.component>` on PostgreSQL.

        The recursive term may name the walk once only, so both directions sit
        in one ``LATERAL`` union (each by its own index). PostgreSQL computes a
        recursive CTE only as far as its reader fetches: the ``LIMIT`` ends
        the walk after ``limit`` jobs, nearest first (it works breadth first).
        """
        dep = DEPENDENCY_TABLE
        return f"""
WITH RECURSIVE reach(seq) AS (
    SELECT %s::bigint
    UNION
    SELECT x.seq FROM reach r CROSS JOIN LATERAL (
        SELECT e.upstream_id AS seq FROM {dep} e WHERE e.job_id = r.seq
        UNION ALL SELECT e.job_id FROM {dep} e WHERE e.upstream_id = r.seq) AS x),
found AS MATERIALIZED (SELECT seq FROM reach LIMIT %s)
SELECT 'n', seq, NULL::bigint FROM found
UNION ALL
SELECT 'e', e.job_id, e.upstream_id FROM found a JOIN {dep} e ON e.job_id = a.seq"""

    def mark_acked(self, conn: Any, *, now: int, acks: Sequence[tuple[int, str | None, str, str]]) -> None:
        """One ``UPDATE … FROM unnest(…)`` (the services use :meth:`ack_locked` here; this serves the interface)."""
        job = JOB_TABLE
        with conn.cursor() as cur:
            cur.execute(
                f"UPDATE {job} SET state = 'succeeded', result = v.result, settled_hash = v.hash, "
                f"settled_args = v.args, settled_op = 'ack', settled_outcome = %s::jsonb, finished_at = %s, "
                f"changed_at = %s FROM unnest(%s::bigint[], %s::text[], %s::text[], %s::text[]) "
                f"AS v(seq, result, hash, args) WHERE {job}.seq = v.seq",
                [
                    ACKED_JSON, now, now,
                    [a[0] for a in acks], [a[1] for a in acks], [a[2] for a in acks], [a[3] for a in acks],
                ],
            )

    # --- enqueue, queues, counters, maintenance ---------------------------------------------

    supports_one_statement_enqueue = True

    def enqueue_plain(
        self, conn: Any, queue: str, items: Sequence[Any], *, now: str, max_jobs: int, channel: str
    ) -> tuple[list[Any] | None, bool]:
        """The plain enqueue (see :meth:`Store.enqueue_plain`): one statement, or COPY for a large batch.

        Below :data:`COPY_MIN_ROWS` (500) items: :data:`_PLAIN_PG`, one round trip in
        autocommit. From there on: :meth:`_enqueue_copy` (one transaction, or a
        savepoint inside the caller's), cheaper per row on both sides.
        """
        n = len(items)
        if n >= COPY_MIN_ROWS and _driver_has_copy():
            return self._enqueue_copy(conn, queue, items, now=now, max_jobs=max_jobs, channel=channel)
        uids = new_uids(n)
        # Metadata columns only when an item has metadata: without, the statement is the one it was before
        # metadata existed (two more recordset columns cost a measurable few percent of a bulk enqueue).
        with_meta = any(it.metadata is not None for it in items)
        sql = _PLAIN_PG_META if with_meta else _PLAIN_PG_BARE
        sql = sql.format(queue=QUEUE_TABLE, counter=COUNTER_TABLE, job=JOB_TABLE, now=now)
        rows = [
            {
                "o": i,
                "uid": uid,
                "priority": it.priority,
                "delay_ms": it.delay_ms or 0,
                "max_attempts": it.max_attempts,
                "timeout_ms": it.timeout_ms,
                "payload": it.payload,
                "size": it.size,
            }
            for i, (uid, it) in enumerate(zip(uids, items, strict=True))
        ]
        if with_meta:
            for row, it in zip(rows, items, strict=True):
                if it.metadata is not None:  # absent keys read as NULL: rows without metadata stay as short
                    row["metadata"] = it.metadata
                    row["tags"] = it.tags
        params = [
            queue,
            json.dumps(rows, ensure_ascii=False),
            n,
            max_jobs,
            n,
            n,
            n,
            n,
            channel,
            queue,
        ]
        with self.hot_cursor(conn) as cur:
            cur.execute(sql, params)
            inserted, _, _, found, enqueued_at = cur.fetchone()
        if inserted != n:
            return None, bool(found)
        return [EnqueueResult(uid, True, int(enqueued_at)) for uid in uids], True

    def _enqueue_copy(
        self, conn: Any, queue: str, items: Sequence[Any], *, now: str, max_jobs: int, channel: str
    ) -> tuple[list[Any] | None, bool]:
        """The plain enqueue of a large batch: :data:`_COPY_HEAD_PG`, then the rows through ``COPY … FROM STDIN``.

        In one transaction (a savepoint inside the caller's, so a failed COPY
        takes the counters and the NOTIFY back with it): the head statement
        looks the queue up (``FOR KEY SHARE``, as every enqueue), reads the
        clock once, checks the queue-full limit against the counters and, when
        the batch fits, adds it to a counter shard and queues the NOTIFY; then
        the rows stream in input order (their ``seq``, hence claim order, is
        the order COPY writes them), stamped with that instant. Nothing is
        shipped when the queue is missing (``(None, False)``) or full
        (``(None, True)``). Four round trips (BEGIN, head, COPY, COMMIT); the
        text format keeps the Python side to one f-string per row.
        """
        n = len(items)
        head = _COPY_HEAD_PG.format(queue=QUEUE_TABLE, counter=COUNTER_TABLE, now=now)
        with self.write_atomic(conn):
            with self.hot_cursor(conn) as cur:
                cur.execute(head, {"name": queue, "n": n, "max": max_jobs, "channel": channel})
                row = cur.fetchone()
            if row is None:
                return None, False
            queue_id, max_attempts, timeout_ms, t, fits = row
            if not fits:
                return None, True
            uids = new_uids(n)
            chunks = copy_chunks(items, uids, queue_id=queue_id, t=t, max_attempts=max_attempts, timeout_ms=timeout_ms)
            # Django's cursor does not translate the errors of copy(): wrap_database_errors does.
            with conn.cursor() as cur, conn.wrap_database_errors, cur.copy(_COPY_PG) as copy:
                for chunk in chunks:
                    copy.write(chunk)
        return [EnqueueResult(uid, True, t) for uid in uids], True

    def take_tokens(
        self, conn: Any, *, now: str, queue_id: int, rows: Sequence[tuple[str, str, int]]
    ) -> tuple[dict[str, str], int]:
        """:meth:`Store.take_tokens` with the rows as arrays: the same three round trips at most.

        The shared statement writes one ``VALUES`` tuple per token with the
        clock as two subqueries each; PostgreSQL's planning of that grows
        faster than the rows (4,000 tokens took 40 s here), so the rows travel
        as three arrays and the clock is read once, in order of ``rows``.
        """
        table = TOKEN_TABLE
        tokens = [r[0] for r in rows]
        with conn.cursor() as cur:
            cur.execute(
                f"SELECT token FROM {table} WHERE queue_id = %s AND token = ANY(%s::text[])", [queue_id, tokens]
            )
            existing = {r[0] for r in cur.fetchall()}
            cur.execute(
                f"WITH c AS (SELECT {now} AS t) "
                f"INSERT INTO {table} (queue_id, token, job_uid, created_at, expires_at) "
                f"SELECT %s, r.token, r.uid, c.t, c.t + r.retention "
                f"FROM unnest(%s::text[], %s::text[], %s::bigint[]) WITH ORDINALITY AS r(token, uid, retention, o) "
                f"CROSS JOIN c ORDER BY r.o "
                f"ON CONFLICT (queue_id, token) DO UPDATE SET job_uid = excluded.job_uid, "
                f"created_at = excluded.created_at, expires_at = excluded.expires_at "
                f"WHERE {table}.expires_at <= excluded.created_at RETURNING token",
                [queue_id, tokens, [r[1] for r in rows], [r[2] for r in rows]],
            )
            owned = {r[0] for r in cur.fetchall()}
            named = {token: uid for token, uid, _ in rows if token in owned}
            others = [t for t in tokens if t not in owned]
            if others:
                cur.execute(
                    f"SELECT token, job_uid FROM {table} WHERE queue_id = %s AND token = ANY(%s::text[])",
                    [queue_id, others],
                )
                named.update(cur.fetchall())
        return named, len(owned - existing)

    def insert_jobs(self, conn: Any, *, now: str, queue_id: int, rows: Sequence[tuple]) -> dict[str, int]:
        """:meth:`Store.insert_jobs` with the rows as one JSON text and the clock read once (one round trip).

        As :meth:`take_tokens`: per-row ``VALUES`` with clock subqueries cost
        planning time that grows faster than the rows.
        """
        data = [
            {
                "o": i, "uid": uid, "priority": priority, "at": at, "delay_ms": delay_ms, "max_attempts": max_attempts,
                "timeout_ms": timeout_ms, "payload": payload, "size": size, "unique_key": unique_key, "token": token,
                "metadata": meta, "tags": tags, "ckey": ckey, "state": state,
            }
            for i, (uid, priority, at, delay_ms, max_attempts, timeout_ms, payload, size, unique_key, token, meta, tags,
                    ckey, state)
            in enumerate(full_row(row) for row in rows)
        ]  # fmt: skip
        with conn.cursor() as cur:
            cur.execute(
                f"WITH c AS (SELECT {now} AS t) INSERT INTO {JOB_TABLE} (uid, queue_id, state, priority, run_at, "
                f"enqueued_at, changed_at, attempts, max_attempts, generation, timeout_ms, payload, payload_size, "
                f"last_error, errors, unique_key, idempotency, worker, metadata, tags, concurrency_key) "
                f"SELECT r.uid, %s, r.state, r.priority, COALESCE(r.at, c.t + r.delay_ms), c.t, c.t, 0, r.max_attempts, "
                f"0, r.timeout_ms, r.payload, r.size, '', '[]', r.unique_key, r.token, '', r.metadata, r.tags, r.ckey "
                f"FROM json_to_recordset(%s::json) AS r(o integer, uid text, priority integer, at bigint, delay_ms bigint, "
                f"max_attempts integer, timeout_ms bigint, payload text, size integer, unique_key text, token text, "
                f"metadata text, tags text, ckey text, state text) CROSS JOIN c ORDER BY r.o "
                f"ON CONFLICT DO NOTHING RETURNING uid, enqueued_at",
                [queue_id, json.dumps(data, ensure_ascii=False)],
            )
            return {r[0]: int(r[1]) for r in cur.fetchall()}

    def lock_unique_keys(self, conn: Any, queue_id: int, keys: Sequence[str]) -> None:
        # Transaction-scoped advisory locks, one per (queue, key), taken in key order.
        if len(keys) < 2:
            return
        with conn.cursor() as cur:
            cur.execute(
                "SELECT pg_advisory_xact_lock(%s, hashtext(k)) FROM unnest(%s::text[]) AS k ORDER BY k",
                [queue_id, list(keys)],
            )


    # --- edges: driver errors, backup rows, listening -------------------------------------------

    driver_modules = ("psycopg", "psycopg2")

    @classmethod
    def is_unavailable(cls, cause: BaseException) -> bool:
        if not cls.is_driver_error(cause):
            return False
        # Connection exceptions, insufficient resources (too many connections), operator
        # intervention (shutdown, crash); none at all: libpq's own failures (refused, timeout, closed).
        state = getattr(cause, "sqlstate", None) or getattr(cause, "pgcode", None)
        return state is None or str(state).startswith(UNAVAILABLE_SQLSTATES)

    def listen(self, channel: str, *, stop: Any, on_listening: Any, on_note: Any, timeout_s: float = 1.0) -> None:
        import psycopg
        from django.db import connections

        params = connections[self.alias].get_connection_params()
        params.pop("cursor_factory", None)
        params.pop("context", None)
        with psycopg.connect(**params, autocommit=True) as pg:
            pg.execute(f"LISTEN {channel}")
            on_listening()
            while not stop.is_set():
                for note in pg.notifies(timeout=timeout_s):
                    on_note(note.payload)


# The whole plain enqueue in one statement: look the queue up, check the
# queue-full limit against the counters, insert the rows in input order, add
# to a free counter shard (or a new one), and notify idle workers. Outside the
# caller's transaction autocommit makes it atomic: one round trip per call.
# The rows travel as one JSON text (the C encoder writes it; PostgreSQL parses
# it), much cheaper than encoding one array per column in Python.
_PLAIN_PG = """
WITH q AS (SELECT id, max_attempts, timeout_ms FROM {queue} WHERE name = %s FOR KEY SHARE),
c AS (SELECT {now} AS t),
cap AS (SELECT COALESCE(SUM(active), 0) AS active FROM {counter} WHERE queue_id = (SELECT id FROM q)),
ins AS (
    INSERT INTO {job} (uid, queue_id, state, priority, run_at, enqueued_at, changed_at, attempts, max_attempts,
        generation, timeout_ms, payload, payload_size, last_error, errors, unique_key, idempotency, worker{meta_columns})
    SELECT u.uid, q.id, 'queued', u.priority, c.t + u.delay_ms, c.t, c.t, 0, COALESCE(u.max_attempts, q.max_attempts),
        0, COALESCE(u.timeout_ms, q.timeout_ms), u.payload, u.size, '', '[]', NULL, NULL, ''{meta_values}
    FROM json_to_recordset(%s::json)
        AS u(o integer, uid text, priority integer, delay_ms bigint, max_attempts integer, timeout_ms bigint,
             payload text, size integer{meta_types})
    CROSS JOIN q CROSS JOIN c CROSS JOIN cap
    WHERE cap.active + %s <= %s
    ORDER BY u.o
    RETURNING 1
),
bump AS (
    UPDATE {counter} SET enqueued = enqueued + %s, active = active + %s
    WHERE id = (SELECT id FROM {counter} WHERE queue_id = (SELECT id FROM q) LIMIT 1 FOR UPDATE SKIP LOCKED)
    AND EXISTS (SELECT 1 FROM ins)
    RETURNING 1
),
shard AS (
    INSERT INTO {counter} (queue_id, enqueued, active) SELECT id, %s, %s FROM q
    WHERE NOT EXISTS (SELECT 1 FROM bump) AND EXISTS (SELECT 1 FROM ins)
    RETURNING 1
),
wake AS (SELECT pg_notify(%s, %s) WHERE EXISTS (SELECT 1 FROM ins))
SELECT (SELECT count(*) FROM ins), (SELECT count(*) FROM bump) + (SELECT count(*) FROM shard), (SELECT count(*) FROM wake),
    (SELECT count(*) FROM q), (SELECT t FROM c)
"""

#: :data:`_PLAIN_PG` for items without metadata, and with (``{queue}`` etc. still to fill).
_PLAIN_PG_BARE = _PLAIN_PG.replace("{meta_columns}", "").replace("{meta_values}", "").replace("{meta_types}", "")
_PLAIN_PG_META = (
    _PLAIN_PG.replace("{meta_columns}", ", metadata, tags")
    .replace("{meta_values}", ", u.metadata, u.tags")
    .replace("{meta_types}", ", metadata text, tags text")
)


#: Items from which a plain enqueue streams its rows with COPY instead of one JSON text: below, COPY's three
#: extra round trips (BEGIN, COPY, COMMIT) cost more than it saves. On a loaded 2-core machine the two
#: paths broke even near 400 items (docs/performance.md#bulk-enqueue-copy); an idle one favours COPY sooner.
COPY_MIN_ROWS = 500

# The head of a COPY enqueue, in its transaction: the queue (locked FOR KEY SHARE, as every enqueue
# locks it, so a delete waits for the commit), the clock read once for every row, and when the batch
# fits under the queue-full limit, the counters and the NOTIFY (sent at commit). No row: no such queue.
_COPY_HEAD_PG = """
WITH q AS (SELECT id, max_attempts, timeout_ms FROM {queue} WHERE name = %(name)s FOR KEY SHARE),
c AS (SELECT {now} AS t),
cap AS (SELECT COALESCE(SUM(active), 0) AS active FROM {counter} WHERE queue_id = (SELECT id FROM q)),
fits AS (SELECT q.id FROM q, cap WHERE cap.active + %(n)s::bigint <= %(max)s::bigint),
bump AS (
    UPDATE {counter} SET enqueued = enqueued + %(n)s::bigint, active = active + %(n)s::bigint
    WHERE id = (SELECT id FROM {counter} WHERE queue_id = (SELECT id FROM fits) LIMIT 1 FOR UPDATE SKIP LOCKED)
    RETURNING 1),
shard AS (
    INSERT INTO {counter} (queue_id, enqueued, active) SELECT id, %(n)s::bigint, %(n)s::bigint FROM fits
    WHERE NOT EXISTS (SELECT 1 FROM bump)
    RETURNING 1),
wake AS (SELECT pg_notify(%(channel)s, %(name)s) FROM fits)
SELECT q.id, q.max_attempts, q.timeout_ms, c.t,
    (SELECT count(*) FROM bump) + (SELECT count(*) FROM shard) + (SELECT count(*) FROM wake) > 0
FROM q CROSS JOIN c
"""

#: The columns a COPY enqueue writes, in the order of :func:`copy_chunks`' fields: first those of
#: each row, then those every row of a batch shares. The others keep their defaults (NULL).
_COPY_COLUMNS = (
    "uid", "payload", "payload_size", "priority", "run_at", "max_attempts", "timeout_ms", "metadata", "tags",
    "queue_id", "state", "enqueued_at", "changed_at", "attempts", "generation", "last_error", "errors", "worker",
)  # fmt: skip
_COPY_PG = f"COPY {JOB_TABLE} ({', '.join(_COPY_COLUMNS)}) FROM STDIN"

#: Text of the rows of one ``copy.write`` (characters): large enough that the writes cost nothing
#: per row, small enough that PostgreSQL parses one chunk while Python formats the next.
COPY_CHUNK_CHARS = 1 << 20

#: COPY's text format reads these four characters as syntax: escaped where a field holds one.
_COPY_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})


def copy_field(text: str) -> str:
    """``text`` as one field of COPY's text format (backslash, tab, newline and carriage return escaped)."""
    return text.translate(_COPY_ESCAPES)


def copy_chunks(
    items: Sequence[Any], uids: Sequence[str], *, queue_id: int, t: int, max_attempts: int, timeout_ms: int
):
    """The rows of a COPY enqueue in COPY's text format, as strings of about :data:`COPY_CHUNK_CHARS`.

    ``items`` have the attributes of ``services.enqueue._Item`` (payload and
    metadata already compact JSON text, no token, unique key or ``at``);
    ``uids`` one new job id each; ``t`` the clock (epoch ms) the head
    statement read: every row is enqueued and changed at ``t``, runs at
    ``t + delay_ms``. ``max_attempts`` and ``timeout_ms`` are the queue's,
    for items without their own. Fields follow :data:`_COPY_COLUMNS`.

    Compact JSON text never holds a raw tab, newline or carriage return (the
    encoder escapes every control character), so only backslashes are
    doubled per field; each chunk is then checked to hold exactly one newline
    and 17 tabs per row and no carriage return, and formatted again with every field fully escaped
    (:func:`copy_field`) if not, so no text can shift a field or a row.
    """
    shared = f"\t{queue_id:d}\tqueued\t{t:d}\t{t:d}\t0\t0\t\t[]\t\n"
    # The fields after payload and size of an item with no option of its own (the common bulk row).
    bare = f"\t0\t{t:d}\t{max_attempts:d}\t{timeout_ms:d}\t\\N\t\\N{shared}"
    tabs = len(_COPY_COLUMNS) - 1
    out: list[str] = []
    size = 0
    start = 0
    for i, (uid, it) in enumerate(zip(uids, items, strict=True)):
        payload = it.payload
        if "\\" in payload:
            payload = payload.replace("\\", "\\\\")
        if (
            it.priority == 0
            and it.delay_ms is None
            and it.max_attempts is None
            and it.timeout_ms is None
            and it.metadata is None
        ):
            out.append(f"{uid}\t{payload}\t{it.size:d}{bare}")
        else:
            out.append(_copy_row(uid, payload, it, t, max_attempts, timeout_ms, shared, _escape_backslashes))
        size += len(payload)
        if size >= COPY_CHUNK_CHARS:
            yield _checked(out, items, uids, start, tabs, t, max_attempts, timeout_ms, shared)
            out, size, start = [], 0, i + 1
    if out:
        yield _checked(out, items, uids, start, tabs, t, max_attempts, timeout_ms, shared)


def _escape_backslashes(text: str) -> str:
    return text.replace("\\", "\\\\") if "\\" in text else text


def _copy_row(uid: str, payload: str, it: Any, t: int, max_attempts: int, timeout_ms: int, shared: str, escape) -> str:
    """One row of :func:`copy_chunks` for an item with options (``payload`` escaped already; ``escape`` for metadata)."""
    meta = "\\N" if it.metadata is None else escape(it.metadata)
    tags = "\\N" if it.tags is None else escape(it.tags)
    return (
        f"{uid}\t{payload}\t{it.size:d}\t{it.priority:d}\t{t + (it.delay_ms or 0):d}\t"
        f"{max_attempts if it.max_attempts is None else it.max_attempts:d}\t"
        f"{timeout_ms if it.timeout_ms is None else it.timeout_ms:d}\t{meta}\t{tags}{shared}"
    )


def _checked(rows: list[str], items, uids, start: int, tabs: int, t, max_attempts, timeout_ms, shared) -> str:
    """The chunk of ``rows`` (items ``start`` on), formatted again fully escaped unless its syntax counts are right."""
    chunk = "".join(rows)
    if chunk.count("\n") == len(rows) and chunk.count("\t") == tabs * len(rows) and "\r" not in chunk:
        return chunk
    return "".join(
        _copy_row(copy_field(uid), copy_field(it.payload), it, t, max_attempts, timeout_ms, shared, copy_field)
        for uid, it in zip(uids[start : start + len(rows)], items[start : start + len(rows)], strict=True)
    )


def new_uids(n: int) -> list[str]:
    """``n`` new job ids: 32 hex characters of 128 random bits each, from one read of the system's CSPRNG.

    The same bits ``secrets.token_hex(16)`` would draw, ``n`` times fewer calls
    (id minting was a tenth of the Python side of a 20,000-job enqueue).
    """
    text = secrets.token_bytes(16 * n).hex()
    return [text[i : i + 32] for i in range(0, 32 * n, 32)]


def _driver_has_copy() -> bool:
    """True when Django's PostgreSQL driver is psycopg 3, whose cursors have ``copy()`` (psycopg2's have not).

    Asked at call time, on a PostgreSQL connection: importing Django's driver
    module at import time would fail on a site that has no PostgreSQL driver
    at all (every store module is imported, whatever the database).
    """
    from django.db.backends.postgresql.psycopg_any import is_psycopg3

    return is_psycopg3
