"""The SQL of dependencies between jobs (docs/reference/semantics.md §9 "Dependencies").

A mixin of :class:`~django_fq.storage.base.Store`: each method is one round
trip or a few, in portable SQL (no ``RETURNING``: MariaDB/MySQL have none for
``UPDATE``), with the store's own lock clauses. The rules (which edge is
satisfied, which dependent is cancelled) are the services'
(:mod:`django_fq.services.dependencies`); these methods only read and write rows.

Locking: an enqueue that depends on jobs sets their ``has_dependents`` flag and
reads their states under a share lock, in the enqueue's transaction; the ack
(and every other writer that finishes a job) updates the job row, so the two
are serialised on that row, and the finisher's next statement, which looks
for pending edges, sees every edge committed before its update of the row.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

#: The edge table (:class:`~django_fq.models.Dependency`).
DEPENDENCY_TABLE = "django_fq_dependency"
_JOB = "django_fq_job"
_LEASE = "django_fq_lease"
_QUEUE = "django_fq_queue"
#: Batch rows and batch memberships (:class:`~django_fq.models.Batch`, :class:`~django_fq.models.BatchMember`).
BATCH_TABLE = "django_fq_batch"
BATCH_MEMBER_TABLE = "django_fq_batch_member"
#: Batch states whose callback has not fired yet: their members are never pruned.
OPEN_BATCH_SQL = "'open', 'sealed'"
#: Rows per statement of an ``IN`` list or a multi-row ``INSERT``: under every backend's parameter limit.
CHUNK = 500
#: Stored states of a job that is not finished: a finished job a job in one of these still depends on
#: is never pruned (it may be retried, or read, later).
UNFINISHED_STATES = ("waiting", "queued", "held", "running", "dead")
UNFINISHED_SQL = ", ".join(f"'{state}'" for state in UNFINISHED_STATES)


def _chunks(values: Sequence[Any], size: int = CHUNK) -> Iterable[Sequence[Any]]:
    for start in range(0, len(values), size):
        yield values[start : start + size]


def _marks(n: int) -> str:
    return ", ".join(["%s"] * n)


class DependencySql:
    """Dependency statements shared by every store (mixed into :class:`~django_fq.storage.base.Store`)."""

    #: Lock clause of a read that the finishing writers' row updates must wait for (and that waits for them).
    share_lock_sql: ClassVar[str] = " FOR SHARE"
    update_lock_sql: ClassVar[str]

    #: A parameter holding JSON text, where a JSON column's value is a branch of a ``CASE`` (PostgreSQL: a cast).
    json_param_sql: ClassVar[str] = "%s"
    #: Values per statement of the methods below (PostgreSQL passes arrays, so it takes more at once).
    dependency_chunk: ClassVar[int] = CHUNK

    if TYPE_CHECKING:
        supports_row_locks: ClassVar[bool]

        def greatest_sql(self, a: str, b: str) -> str: ...

        def lock_queue_row(self, conn: Any, queue_table: str, queue_id: int, *, exclusive: bool = False) -> bool: ...

    def in_sql(self, column: str, values: Sequence[Any]) -> tuple[str, list]:
        """``column IN (%s, …)`` and its parameters (PostgreSQL: ``= ANY(%s)``, one array parameter)."""
        return f"{column} IN ({_marks(len(values))})", list(values)

    def delete_leases(self, cur: Any, seqs: Sequence[int]) -> None:
        """Delete the lease rows of the jobs ``seqs`` (their locks already held): one statement on ``cur``."""
        where, params = self.in_sql("job_id", seqs)
        cur.execute(f"DELETE FROM {_LEASE} WHERE {where}", params)

    def _parts(self, values: Sequence[Any]) -> Iterable[Sequence[Any]]:
        return _chunks(values, self.dependency_chunk)

    def _select_in(self, cur: Any, sql: str, column: str, values: Sequence[Any]) -> list[tuple]:
        """The rows of ``sql`` (its ``{where}`` becomes ``column IN values``), one statement per part of ``values``."""
        out: list[tuple] = []
        for part in self._parts(values):
            where, params = self.in_sql(column, part)
            cur.execute(sql.format(where=where), params)
            out += cur.fetchall()
        return out

    def lock_dependencies(self, conn: Any, uids: Sequence[str]) -> dict[str, tuple[int, str, int]]:
        """In the enqueue's transaction: the jobs ``uids`` (public ids, any queue) as ``{uid: (seq, state, queue_id)}``.

        First holds their queues' rows shared (where rows lock: one round trip
        per 500 ids and one per queue), so a delete of one of those queues
        waits for this transaction, or this for it; then marks each
        ``has_dependents`` (an update, so a concurrent ack of one of them waits
        for this transaction, or this for it), then reads them under a share
        lock in ``seq`` order. Ids not found are missing from the answer. Two
        more round trips per 500 ids.
        """
        ordered = sorted(set(uids))
        with conn.cursor() as cur:
            if self.supports_row_locks:
                # Hold the dependencies' queue rows shared first, as an enqueue holds its own: a
                # delete_queue (or a time to live's expiry) of one of them waits for this commit and
                # then sees the new edges, or this waits for it and finds the job gone. Without it
                # the delete read the queue's dependents before this committed and left the new job
                # waiting on an edge to a deleted job. Queue rows before job rows: the delete's order.
                found = self._select_in(cur, f"SELECT DISTINCT queue_id FROM {_JOB} WHERE {{where}}", "uid", ordered)
                queue_ids = {int(qid) for (qid,) in found}
                for queue_id in sorted(queue_ids):
                    self.lock_queue_row(conn, _QUEUE, queue_id)
            for part in self._parts(ordered):
                where, params = self.in_sql("uid", part)
                cur.execute(f"UPDATE {_JOB} SET has_dependents = TRUE WHERE {where} AND NOT has_dependents", params)
            rows = self._select_in(
                cur, f"SELECT uid, seq, state, queue_id FROM {_JOB} WHERE {{where}} ORDER BY seq{self.share_lock_sql}",
                "uid", ordered,
            )  # fmt: skip
        return {uid: (int(seq), state, int(queue_id)) for uid, seq, state, queue_id in rows}

    def job_seqs(self, conn: Any, uids: Sequence[str]) -> dict[str, int]:
        """``{uid: seq}`` of the jobs ``uids`` (written by this transaction: a plain read). One round trip per 500."""
        with conn.cursor() as cur:
            rows = self._select_in(cur, f"SELECT uid, seq FROM {_JOB} WHERE {{where}}", "uid", list(uids))
        return {uid: int(seq) for uid, seq in rows}

    def job_states(self, conn: Any, uids: Sequence[str]) -> dict[str, tuple[int, str]]:
        """``{uid: (seq, state)}`` of the jobs ``uids`` (written by this transaction: a plain read). One round trip per part."""
        with conn.cursor() as cur:
            rows = self._select_in(cur, f"SELECT uid, seq, state FROM {_JOB} WHERE {{where}}", "uid", list(uids))
        return {uid: (int(seq), state) for uid, seq, state in rows}

    def insert_dependencies(self, conn: Any, rows: Sequence[tuple[int, int, str, bool, str | None]]) -> None:
        """Insert edges ``(job seq, upstream seq, on_failure, pending, name)``. One round trip per 500."""
        with conn.cursor() as cur:
            for part in _chunks(list(rows)):
                cur.execute(
                    f"INSERT INTO {DEPENDENCY_TABLE} (job_id, upstream_id, on_failure, pending, name) VALUES "
                    f"{', '.join(['(%s, %s, %s, %s, %s)'] * len(part))}",
                    [v for row in part for v in row],
                )

    def mark_waiting(self, conn: Any, jobs: Sequence[tuple[int, int]]) -> None:
        """Jobs this transaction inserted, ``(seq, pending edges)`` each, become ``waiting``. One round trip per count."""
        by_count: dict[int, list[int]] = {}
        for seq, n in jobs:
            by_count.setdefault(n, []).append(seq)
        with conn.cursor() as cur:
            for n, seqs in by_count.items():
                for part in self._parts(seqs):
                    where, params = self.in_sql("seq", part)
                    cur.execute(f"UPDATE {_JOB} SET state = 'waiting', waiting_on = %s WHERE {where}", [n, *params])

    def pending_edges(
        self, conn: Any, upstream_seqs: Sequence[int], *, lock: bool = True
    ) -> list[tuple[int, int, int, str]]:
        """The pending edges out of jobs ``upstream_seqs``, locked, as ``(edge id, job seq, upstream seq, on_failure)``.

        Through the ``(upstream, job)`` index: cost proportional to the direct
        dependents, never a scan of a workflow. One round trip per 500 jobs.
        ``lock=False``: a plain read (a plan, checked again under the locks).
        """
        sql = (
            f"SELECT id, job_id, upstream_id, on_failure FROM {DEPENDENCY_TABLE} "
            f"WHERE {{where}} AND pending ORDER BY id{self.update_lock_sql if lock else ''}"
        )
        with conn.cursor() as cur:
            rows = self._select_in(cur, sql, "upstream_id", sorted(set(upstream_seqs)))
        return [(int(a), int(b), int(c), d) for a, b, c, d in rows]

    def close_edges(self, conn: Any, edge_ids: Sequence[int]) -> None:
        """Edges ``edge_ids`` no longer count (satisfied, or their dependent cancelled). One round trip per 500."""
        with conn.cursor() as cur:
            for part in self._parts(sorted(edge_ids)):
                where, params = self.in_sql("id", part)
                cur.execute(f"UPDATE {DEPENDENCY_TABLE} SET pending = FALSE WHERE {where}", params)

    def count_down(self, conn: Any, *, now: str, counts: dict[int, int]) -> list[dict]:
        """Take ``counts[seq]`` satisfied edges off each waiting job; those left with none become queued.

        A job released keeps its priority and sequence number (its place in
        claim order); its ``run_at`` becomes the later of its own and now, so
        a delay given at enqueue still holds and the wait time counts from
        eligibility. The decrement locks each job row (in ``seq`` order), so
        two finishers of one job's last two dependencies release it exactly
        once: the second sees the first's count. Returns the jobs released:
        dicts of ``seq``, ``uid``, ``queue_id``, ``queue`` (name),
        ``priority``, ``concurrency_key`` and, as ``key_concurrency``, the
        queue's ``key_concurrency`` + ``key_rate_limit`` (above 0: it admits its keyed jobs; read plainly: a ``configure()`` of it locks waiting keyed jobs too, so
        it waits for this transaction or this for it; see ``key_census``).
        Three round trips (more past 500 jobs).
        """
        by_n: dict[int, list[int]] = {}
        for seq, n in counts.items():
            by_n.setdefault(n, []).append(seq)
        seqs = sorted(counts)
        with conn.cursor() as cur:
            for n, group in sorted(by_n.items()):
                for part in self._parts(sorted(group)):
                    where, params = self.in_sql("seq", part)
                    cur.execute(
                        f"UPDATE {_JOB} SET waiting_on = waiting_on - %s WHERE {where} AND state = 'waiting'",
                        [n, *params],
                    )
            found = self._select_in(
                cur,
                f"SELECT j.seq, j.uid, j.queue_id, q.name, j.priority, j.concurrency_key, q.key_concurrency + q.key_rate_limit "
                f"FROM {_JOB} j JOIN {_QUEUE} q ON q.id = j.queue_id "
                f"WHERE {{where}} AND j.state = 'waiting' AND j.waiting_on <= 0",
                "j.seq",
                seqs,
            )
            released = [
                {
                    "seq": int(s), "uid": u, "queue_id": int(qid), "queue": name, "priority": int(p),
                    "concurrency_key": key, "key_concurrency": int(limit),
                }
                for s, u, qid, name, p, key, limit in found
            ]  # fmt: skip
            for part in self._parts([r["seq"] for r in released]):
                where, params = self.in_sql("seq", part)
                cur.execute(
                    f"UPDATE {_JOB} SET state = 'queued', waiting_on = 0, "
                    f"run_at = {self.greatest_sql('run_at', now)}, changed_at = {now} WHERE {where} AND state = 'waiting'",
                    params,
                )
        return released

    def cancel_waiting(self, conn: Any, *, now: str, seqs: Sequence[int], error: str, entry_json: str) -> list[dict]:
        """Waiting jobs ``seqs`` become cancelled (a dependency went dead or was cancelled).

        ``error`` is the last error; ``entry_json`` the history entry (a JSON
        object). A waiting job never ran, so its history becomes this one entry.
        Returns the jobs cancelled: dicts of ``seq``, ``uid``, ``queue_id`` and
        ``has_dependents``. Two round trips per 500 jobs (per 50,000 on PostgreSQL).
        """
        with conn.cursor() as cur:
            found = self._select_in(
                cur,
                f"SELECT seq, uid, queue_id, has_dependents FROM {_JOB} WHERE {{where}} "
                f"AND state = 'waiting' ORDER BY seq{self.update_lock_sql}",
                "seq",
                sorted(set(seqs)),
            )
            gone = [{"seq": int(s), "uid": u, "queue_id": int(qid), "has_dependents": bool(h)} for s, u, qid, h in found]
            for part in self._parts([r["seq"] for r in gone]):
                where, params = self.in_sql("seq", part)
                cur.execute(
                    f"UPDATE {_JOB} SET state = 'cancelled', waiting_on = 0, finished_at = {now}, changed_at = {now}, "
                    f"last_error = %s, errors = %s WHERE {where} AND state = 'waiting'",
                    [error, f"[{entry_json}]", *params],
                )
        return gone

    def cancel_waiting_each(self, conn: Any, *, now: str, rows: Sequence[tuple[int, str, str]]) -> list[dict]:
        """Waiting jobs become cancelled, each with its own reason: ``rows`` are ``(seq, error, entry_json)``.

        :meth:`cancel_waiting` for jobs cancelled by different dependencies (a
        workflow's steps cancelled at enqueue, each by the step before it): the
        reasons go in one ``CASE`` per statement, so the cost is two round trips
        per 500 jobs, not per reason. Returns what :meth:`cancel_waiting` returns.
        """
        reason = {int(seq): (error, entry) for seq, error, entry in rows}
        gone: list[dict] = []
        with conn.cursor() as cur:
            for part in _chunks(sorted(reason)):
                where, params = self.in_sql("seq", part)
                cur.execute(
                    f"SELECT seq, uid, queue_id, has_dependents FROM {_JOB} WHERE {where} "
                    f"AND state = 'waiting' ORDER BY seq{self.update_lock_sql}",
                    params,
                )
                found = [
                    {"seq": int(s), "uid": u, "queue_id": int(q), "has_dependents": bool(h)}
                    for s, u, q, h in cur.fetchall()
                ]
                if not found:
                    continue
                seqs = [r["seq"] for r in found]
                cases = " ".join(["WHEN %s THEN %s"] * len(seqs))
                json_cases = " ".join([f"WHEN %s THEN {self.json_param_sql}"] * len(seqs))
                where, params = self.in_sql("seq", seqs)
                cur.execute(
                    f"UPDATE {_JOB} SET state = 'cancelled', waiting_on = 0, finished_at = {now}, changed_at = {now}, "
                    f"last_error = CASE seq {cases} END, errors = CASE seq {json_cases} END "
                    f"WHERE {where} AND state = 'waiting'",
                    [
                        *(v for s in seqs for v in (s, reason[s][0])),
                        *(v for s in seqs for v in (s, f"[{reason[s][1]}]")),
                        *params,
                    ],
                )
                gone += found
        return gone

    def flag_dependents(self, conn: Any, seqs: Sequence[int]) -> None:
        """Jobs ``seqs`` (inserted by this transaction) have dependents: set ``has_dependents``. One round trip per part."""
        with conn.cursor() as cur:
            for part in self._parts(sorted(set(seqs))):
                where, params = self.in_sql("seq", part)
                cur.execute(f"UPDATE {_JOB} SET has_dependents = TRUE WHERE {where} AND NOT has_dependents", params)

    #: The function that builds a JSON object from key/value pairs (SQLite's; PostgreSQL and MariaDB override).
    json_object_sql: ClassVar[str] = "json_object"
    #: Lock clause of a read of lease rows a settle would change ("" where the write transaction holds the database).
    lease_lock_sql: ClassVar[str] = " FOR UPDATE"

    def history_append_row_sql(self, column: str, entry_sql: str, keep: int) -> str:
        """SQL for JSON array ``column`` with the object ``entry_sql`` (an expression of the row) appended,
        keeping the newest ``keep`` entries (SQLite's JSON1; the other stores override)."""
        base = f"COALESCE({column}, '[]')"
        return (
            f"json_insert(CASE WHEN json_array_length({base}) >= {int(keep)} THEN json_remove({base}, '$[0]') "
            f"ELSE {base} END, '$[#]', {entry_sql})"
        )

    def cancel_unfinished(
        self, conn: Any, *, now: str, seqs: Sequence[int], keep: int, dead: bool = False
    ) -> list[dict]:
        """Jobs ``seqs`` still waiting, queued, held or running become cancelled, a few statements per 500 jobs.

        The set-based form of ``cancel`` (a batch's cancel,
        docs/reference/semantics.md §9 "Batches"): locks the jobs' leases (job
        order), then the jobs still unfinished (seq order), so a concurrent
        ack or claim waits or is waited for; a running job's lease ends and
        its settle is recorded as a cancel (its receipt then raises
        ``ReceiptCancelled``); every job gets the history entry ``cancel`` /
        ``cancelled`` (its attempt and worker), keeping ``keep`` entries. Jobs
        that finished meanwhile are left alone. ``now``: the clock's SQL.
        Returns the jobs cancelled: dicts of ``seq``, ``uid``, ``queue_id``,
        ``state`` (before), ``concurrency_key`` and ``has_dependents``. Five
        round trips per 500 jobs (per 50,000 on PostgreSQL); the services
        apply counters, key slots and the dependents' policies. ``dead``: dead
        jobs are cancelled too (a workflow's cancel; a batch's leaves them dead).
        """
        lease = _LEASE
        states = "'waiting', 'queued', 'held', 'running'" + (", 'dead'" if dead else "")
        entry = (
            f"{self.json_object_sql}('at', {now}, 'attempt', attempts, 'kind', 'cancel', 'error', 'cancelled', "
            f"'worker', COALESCE(worker, ''))"
        )
        errors = self.history_append_row_sql("errors", entry, keep)
        gone: list[dict] = []
        with conn.cursor() as cur:
            for part in self._parts(sorted(set(seqs))):
                where, params = self.in_sql("job_id", part)
                cur.execute(f"SELECT job_id FROM {lease} WHERE {where} ORDER BY job_id{self.lease_lock_sql}", params)
                where, params = self.in_sql("seq", part)
                cur.execute(
                    f"SELECT seq, uid, queue_id, state, concurrency_key, has_dependents FROM {_JOB} "
                    f"WHERE {where} AND state IN ({states}) ORDER BY seq{self.update_lock_sql}",
                    params,
                )
                rows = [
                    {"seq": int(s), "uid": u, "queue_id": int(q), "state": st, "concurrency_key": k, "has_dependents": bool(h)}
                    for s, u, q, st, k, h in cur.fetchall()
                ]
                if not rows:
                    continue
                running = [r["seq"] for r in rows if r["state"] == "running"]
                if running:
                    where, params = self.in_sql("seq", running)
                    cur.execute(
                        f"UPDATE {_JOB} SET settled_op = 'cancel', settled_outcome = '"
                        + '{"state":"cancelled","run_at":null}'
                        + f"', settled_hash = (SELECT l.receipt_hash FROM {lease} l WHERE l.job_id = {_JOB}.seq) "
                        f"WHERE {where} AND EXISTS (SELECT 1 FROM {lease} l WHERE l.job_id = {_JOB}.seq)",
                        params,
                    )
                    self.delete_leases(cur, running)
                where, params = self.in_sql("seq", [r["seq"] for r in rows])
                cur.execute(
                    f"UPDATE {_JOB} SET state = 'cancelled', waiting_on = 0, finished_at = {now}, changed_at = {now}, "
                    f"errors = {errors} WHERE {where} AND state IN ({states})",
                    params,
                )
                gone += rows
        return gone

    def delete_dependencies(self, conn: Any, seqs: Sequence[int]) -> None:
        """Delete the edges into and out of jobs ``seqs`` (being deleted in this transaction), and their batch
        memberships. Three round trips per 500."""
        with conn.cursor() as cur:
            for part in self._parts(sorted(set(seqs))):
                for table, column in (
                    (DEPENDENCY_TABLE, "job_id"), (DEPENDENCY_TABLE, "upstream_id"), (BATCH_MEMBER_TABLE, "job_id"),
                ):  # fmt: skip
                    where, params = self.in_sql(column, part)
                    cur.execute(f"DELETE FROM {table} WHERE {where}", params)

    def join_batch(self, conn: Any, batch_id: int, uids: Sequence[str]) -> None:
        """Jobs ``uids`` (inserted by this transaction) become members of batch ``batch_id``.

        Each is flagged ``has_dependents``, so whoever finishes it (the
        one-statement ack leaves flagged jobs to the judged path) counts it in
        its batch. Two round trips per 500 jobs.
        """
        with conn.cursor() as cur:
            for part in self._parts(list(uids)):
                where, params = self.in_sql("uid", part)
                cur.execute(
                    f"INSERT INTO {BATCH_MEMBER_TABLE} (job_id, batch_id) SELECT seq, %s FROM {_JOB} WHERE {where}",
                    [batch_id, *params],
                )
                cur.execute(f"UPDATE {_JOB} SET has_dependents = TRUE WHERE {where} AND NOT has_dependents", params)

    def component_sql(self, limit: int) -> str:
        """The statement of :meth:`component` (SQLite's: one recursive select over either index of the edges).

        Parameters: the start seq, then the cap. ``UNION`` keeps each job once,
        so the walk ends when no new job is reached; SQLite's ``LIMIT`` on the
        recursive select stops it after ``limit`` jobs, nearest first (its
        queue is read first in, first out).
        """
        return f"""
WITH RECURSIVE reach(seq) AS (
    SELECT %s
    UNION
    SELECT CASE WHEN e.job_id = r.seq THEN e.upstream_id ELSE e.job_id END
    FROM reach r JOIN {DEPENDENCY_TABLE} e ON e.job_id = r.seq OR e.upstream_id = r.seq
    LIMIT %s),
found AS MATERIALIZED (SELECT seq FROM reach)
SELECT 'n', seq, NULL FROM found
UNION ALL
SELECT 'e', e.job_id, e.upstream_id FROM found a CROSS JOIN {DEPENDENCY_TABLE} e WHERE e.job_id = a.seq"""

    def component(self, conn: Any, seq: int, *, limit: int) -> tuple[list[int], list[tuple[int, int]]]:
        """The jobs connected to job ``seq`` by dependency edges (either way), and the edges among them.

        One statement, whatever the depth: a recursive CTE that reaches each
        job once through the ``(job, upstream)`` and ``(upstream, job)``
        indexes. Returns ``(seqs, edges)``: at most ``limit`` seqs (``seq``
        first, then breadth first as the database walks), and each edge
        ``(job seq, upstream seq)`` between two of them (the statement reads the
        edges into the jobs found by the ``(job, upstream)`` index; those from
        a job the cap left out are dropped here: testing that in SQL made
        SQLite probe every job found for each edge). More than ``limit`` jobs
        reached: the caller asked for one more than it shows, to tell.
        """
        if limit < 1:
            return [], []
        with conn.cursor() as cur:
            cur.execute(self.component_sql(limit), [seq, limit])
            rows = cur.fetchall()
        seqs = [int(r[1]) for r in rows if r[0] == "n"]
        found = set(seqs)
        edges = [(int(r[1]), int(r[2])) for r in rows if r[0] == "e" and int(r[2]) in found]
        return seqs, edges

    def batches_of(self, conn: Any, seqs: Sequence[int]) -> dict[int, int]:
        """``{batch id: members among jobs seqs}`` by the membership's primary key. One round trip per 500."""
        out: dict[int, int] = {}
        with conn.cursor() as cur:
            rows = self._select_in(cur, f"SELECT batch_id FROM {BATCH_MEMBER_TABLE} WHERE {{where}}", "job_id", sorted(set(seqs)))
        for (batch_id,) in rows:
            out[int(batch_id)] = out.get(int(batch_id), 0) + 1
        return out

    def queue_dependency_rows(self, conn: Any, queue_id: int) -> list[tuple[int, str]]:
        """``(seq, state)`` of queue ``queue_id``'s jobs that others depend on (``has_dependents``). One round trip."""
        with conn.cursor() as cur:
            cur.execute(
                f"SELECT seq, state FROM {_JOB} WHERE queue_id = %s AND has_dependents ORDER BY seq", [queue_id]
            )
            return [(int(s), st) for s, st in cur.fetchall()]

    def delete_queue_dependencies(self, conn: Any, queue_id: int) -> None:
        """Delete the edges into and out of queue ``queue_id``'s jobs (before the jobs go), and the queue's
        batches with their memberships. Five round trips."""
        with conn.cursor() as cur:
            for table, column in (
                (DEPENDENCY_TABLE, "job_id"), (DEPENDENCY_TABLE, "upstream_id"), (BATCH_MEMBER_TABLE, "job_id"),
            ):  # fmt: skip
                cur.execute(
                    f"DELETE FROM {table} WHERE {column} IN (SELECT seq FROM {_JOB} WHERE queue_id = %s)", [queue_id]
                )
            cur.execute(
                f"DELETE FROM {BATCH_MEMBER_TABLE} WHERE batch_id IN (SELECT id FROM {BATCH_TABLE} WHERE queue_id = %s)",
                [queue_id],
            )
            cur.execute(f"DELETE FROM {BATCH_TABLE} WHERE queue_id = %s", [queue_id])

    def prunable_sql(self, alias: str) -> str:
        """SQL condition: job ``alias`` (a finished one prune looks at) has no unfinished dependent.

        Nor is it a member of a batch whose callback has not fired (open or
        sealed: its members stay listed until then). Only jobs flagged
        ``has_dependents`` pay for the probes, by the ``(upstream, job)`` index
        and the membership's primary key.
        """
        return (
            f"(NOT {alias}.has_dependents OR (NOT EXISTS (SELECT 1 FROM {DEPENDENCY_TABLE} e "
            f"JOIN {_JOB} d ON d.seq = e.job_id WHERE e.upstream_id = {alias}.seq AND d.state IN ({UNFINISHED_SQL})) "
            f"AND NOT EXISTS (SELECT 1 FROM {BATCH_MEMBER_TABLE} m JOIN {BATCH_TABLE} b ON b.id = m.batch_id "
            f"WHERE m.job_id = {alias}.seq AND b.state IN ({OPEN_BATCH_SQL}))))"
        )
