"""Large payloads kept out of the hot job row (docs/explanation/storage.md#large-payloads).

A payload larger than ``FQ_PAYLOAD_OFFLOAD_BYTES`` (bytes of compact UTF-8
JSON) is written to the side table ``django_fq_payload`` in the transaction
that inserts its job; the job row's ``payload`` column holds the marker
:data:`~django_fq.storage.base.OFFLOADED` (``""``) and ``payload_size`` the
body's size. Every read of a payload goes through :func:`fill` or
:func:`text_of`, so callers see the same JSON text either way. The SQL is the
store's (:meth:`~django_fq.storage.base.Store.insert_bodies`,
``fetch_bodies``, ``delete_bodies``).
"""

from __future__ import annotations

from collections.abc import MutableMapping, Sequence
from typing import Any

from . import conf, db, storage
from .storage.base import OFFLOADED

__all__ = ["OFFLOADED", "fill", "is_offloaded", "split", "text_of"]


def is_offloaded(stored: Any) -> bool:
    """Whether a job row's stored ``payload`` value is the offload marker (its body is in the side table)."""
    return stored == OFFLOADED


def split(rows: Sequence[tuple[str, str, int]]) -> tuple[list[str], list[tuple[str, str]]]:
    """Decide, per ``(uid, payload JSON text, size in bytes)``, what the job row stores.

    Returns ``(stored, bodies)``: ``stored[i]`` is the text for row ``i``'s
    ``payload`` column (the text itself, or :data:`OFFLOADED` when ``size`` is
    above ``FQ_PAYLOAD_OFFLOAD_BYTES``) and ``bodies`` the ``(uid, text)`` pairs
    to give :meth:`~django_fq.storage.base.Store.insert_bodies` in the same transaction.
    """
    limit = conf.payload_offload_bytes()
    stored: list[str] = []
    bodies: list[tuple[str, str]] = []
    for uid, text, size in rows:
        if size > limit:
            stored.append(OFFLOADED)
            bodies.append((uid, text))
        else:
            stored.append(text)
    return stored, bodies


def fill(
    conn: Any, rows: Sequence[MutableMapping], *, uid_key: str = "uid", key: str = "payload", latest: bool = False
) -> list[str]:
    """Replace the offload marker in ``rows[i][key]`` by the job's body, read in one statement on ``conn``.

    No round trip when no row is offloaded. A row whose body is gone (its job
    was deleted meanwhile) keeps the marker; returns the uids of those rows.
    ``latest``: the rows come from a claim's locking read, so the bodies are
    read from the latest commit too (:meth:`~django_fq.storage.base.Store.fetch_bodies`).
    """
    wanted = [r[uid_key] for r in rows if is_offloaded(r[key])]
    if not wanted:
        return []
    bodies = storage.for_connection(conn).fetch_bodies(conn, wanted, latest=latest)
    missing = []
    for r in rows:
        if is_offloaded(r[key]):
            body = bodies.get(r[uid_key])
            if body is None:
                missing.append(r[uid_key])
            else:
                r[key] = body
    return missing


def text_of(uid: str, stored: str) -> str:
    """A job's payload JSON text from its row's stored ``payload``: ``stored`` itself unless offloaded.

    An offloaded body is read on django-fq's connection (one query). A body
    that is gone gives back the marker (an empty text, which reads decode as
    their "not valid JSON" stand-in).
    """
    if not is_offloaded(stored):
        return stored
    conn = db.connection()
    return storage.for_connection(conn).fetch_bodies(conn, [uid]).get(uid, stored)
