"""Waking idle consumers when work arrives.

On PostgreSQL every enqueue that creates jobs runs ``pg_notify('django_fq',
queue)`` inside its transaction, so the notification is delivered at commit
and never after a rollback. This module keeps **one** listening connection per
process (a daemon thread), shared by every waiter in the process — worker
loops and long-poll claims alike — so a thousand waiting requests cost one
connection, not a thousand.

The listening connection uses the connection parameters of the alias named
by the setting ``FQ_LISTEN_DATABASE`` (default: django-fq's own alias,
``FQ_DATABASE``; a dict ``{alias: listen alias}`` with queues over several
databases, where each alias has a listener of its own: see
:func:`listen_alias_for`). Point it at a direct or session-pooled connection when
``FQ_DATABASE`` goes through a transaction-pooling PgBouncer, which cannot
keep a LISTEN (the notifications themselves are sent by the enqueue's own
transaction and pass through any pooler).

On SQLite and MariaDB/MySQL there is nothing to listen to: callers poll.
An enqueue (or a retry, a release) committed by *this* process still wakes
its waiters at once: :func:`django_fq.db.notify` registers
:func:`notify_in_process` to run at commit (never after a rollback), and
:meth:`Listener.wait` waits on the same condition the listening thread would
wake.

Usage, free of lost wakeups::

    mark = wakeup.listener().mark()          # before looking for work
    jobs = services.claim(...)
    if not jobs:
        wakeup.listener().wait(mark, {"emails"}, timeout=0.2)

A consumer that must also wake for reasons of its own (the worker: a job
finished, a stop was requested) can instead :meth:`Listener.subscribe` a
callback and wait on its own condition; the callback is called from the
listening thread with the queue name (``None``: "look again everywhere").
"""

from __future__ import annotations

import logging
import threading
import time

from django.conf import settings

from . import conf, db, storage

log = logging.getLogger("django_fq.wakeup")

_lock = threading.Lock()
_listeners: dict[str, Listener] = {}


def listener() -> Listener:
    """The process-wide :class:`Listener` for django-fq's database alias (started on first use)."""
    alias = conf.database()
    with _lock:
        found = _listeners.get(alias)
        if found is None or not found.alive():
            found = _listeners[alias] = Listener(alias)
        return found


def listen_alias_for(alias: str) -> str:
    """The alias whose connection parameters the listener of ``alias`` uses (``FQ_LISTEN_DATABASE``).

    ``FQ_LISTEN_DATABASE`` is an alias (it then serves ``FQ_DATABASE``'s
    listener only: with ``FQ_QUEUE_DATABASES`` every other alias listens on
    itself) or a dict ``{alias: listen alias}``. Default: ``alias`` itself.
    """
    setting = getattr(settings, "FQ_LISTEN_DATABASE", None)
    if isinstance(setting, dict):
        return setting.get(alias) or alias
    if setting and alias == conf.get("FQ_DATABASE"):
        return setting
    return alias


def notify_in_process(alias: str, queue: str) -> None:
    """Wake this process's waiters on ``queue`` (a queue name) of database alias ``alias``.

    Called at commit of a transaction that made jobs of ``queue`` ready where
    the database cannot notify (no LISTEN/NOTIFY). Starts no listener: when
    none exists for ``alias``, nothing in this process waits on it.
    """
    with _lock:
        found = _listeners.get(alias)
    if found is not None and found.alive():
        found.notify_local(queue)


def shutdown_all(timeout: float = 3.0) -> None:
    """Stop every listener of this process and wait for their threads (tests, process exit)."""
    with _lock:
        found = list(_listeners.values())
        _listeners.clear()
    for one in found:
        one.stop()
    for one in found:
        if one._thread is not None:
            one._thread.join(timeout)


class Listener:
    """Counts notifications per queue and lets threads wait for a change.

    ``mark()`` snapshots the counters; ``wait(mark, queues, timeout)`` returns
    True as soon as one of ``queues`` (``None``: any) was notified after the
    snapshot, False after ``timeout`` seconds.
    """

    def __init__(self, alias: str, listen_alias: str | None = None):
        self.alias = alias
        #: The alias whose connection parameters the listening connection uses.
        self.listen_alias = listen_alias or listen_alias_for(alias)
        self._cond = threading.Condition()
        self._seen: dict[str, int] = {}
        self._total = 0
        self._epoch = 0  # bumped when every waiter must look again (listener (re)connected)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._subscribers: list = []
        self.listening = False
        if storage.get(alias).supports_listen_notify and storage.get(self.listen_alias).supports_listen_notify:
            self._thread = threading.Thread(target=self._run, name="django-fq-listener", daemon=True)
            self._thread.start()

    def alive(self) -> bool:
        """False once :meth:`stop` was called."""
        return not self._stop.is_set()

    def stop(self) -> None:
        """Stop the listening thread (it exits within a second)."""
        self._stop.set()

    def mark(self) -> tuple:
        """A snapshot of the notification counters, to pass to :meth:`wait`."""
        with self._cond:
            return self._epoch, self._total, dict(self._seen)

    def wait(self, mark: tuple, queues: set[str] | None, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for a notification on ``queues`` newer than ``mark``.

        Without a listening thread only this process's notifications
        (:func:`notify_in_process`) end the wait early.
        """
        give_up = time.monotonic() + timeout
        with self._cond:
            while True:
                if self._changed(mark, queues):
                    return True
                remaining = give_up - time.monotonic()
                if remaining <= 0:
                    return False
                self._cond.wait(remaining)

    @property
    def active(self) -> bool:
        """True when this listener delivers other processes' notifications (LISTEN); False where callers must poll."""
        return self._thread is not None

    def subscribe(self, callback) -> None:
        """Call ``callback(queue)`` on every notification (``queue`` None: everything may have changed).

        Callbacks run in the listening thread: they must be quick and must not
        block (set a flag, notify a condition).
        """
        with self._cond:
            self._subscribers = [*self._subscribers, callback]

    def unsubscribe(self, callback) -> None:
        """Stop calling ``callback`` (no error if it was not subscribed)."""
        with self._cond:
            self._subscribers = [c for c in self._subscribers if c is not callback]

    def notify_local(self, queue: str) -> None:
        """Record a wakeup for ``queue`` from this process (also used by tests)."""
        with self._cond:
            self._seen[queue] = self._seen.get(queue, 0) + 1
            self._total += 1
            self._cond.notify_all()
            subscribers = self._subscribers
        self._call(subscribers, queue)

    @staticmethod
    def _call(subscribers, queue) -> None:
        for callback in subscribers:
            try:
                callback(queue)
            except Exception:  # a broken subscriber must not stop the listener
                log.exception("wakeup subscriber failed")

    def _changed(self, mark, queues) -> bool:
        epoch, total, seen = mark
        if epoch != self._epoch:
            return True
        if queues is None:
            return self._total != total
        return any(self._seen.get(q, 0) != seen.get(q, 0) for q in queues)

    def _run(self) -> None:
        pause = 0.1
        store = storage.get(self.listen_alias)

        def on_listening() -> None:
            nonlocal pause
            pause = 0.1
            self.listening = True
            # Anything enqueued while we were not listening: wake everyone once.
            self._wake_all()

        while not self._stop.is_set():
            try:
                store.listen(db.NOTIFY_CHANNEL, stop=self._stop, on_listening=on_listening, on_note=self.notify_local)
            except Exception as exc:  # noqa: BLE001 - any failure: log, back off, reconnect
                self.listening = False
                if self._stop.is_set():
                    break
                log.warning("wakeup listener lost its connection (%s); reconnecting in %.1fs", type(exc).__name__, pause)
                time.sleep(pause)
                pause = min(pause * 2, 5.0)
        self.listening = False

    def _wake_all(self) -> None:
        with self._cond:
            self._epoch += 1
            self._cond.notify_all()
            subscribers = self._subscribers
        self._call(subscribers, None)
