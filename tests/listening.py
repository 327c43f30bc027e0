"""A LISTEN session of a test's own, opened where django-fq's wakeup listener opens its one.

Behind a transaction-pooling PgBouncer a LISTEN cannot go through the pooled
alias: the pooler hands the session back after the statement, and the
notifications reach a server connection no client is linked to. The project
then names a direct alias in ``FQ_LISTEN_DATABASE`` (docs/scaling.md, "PgBouncer
and other poolers"; tests/settings.py does so under ``FQ_TEST_PG_POOLER``), and
a test that listens for django-fq's notifications itself must use that alias
too, as :class:`django_fq.wakeup.Listener` does. The NOTIFY is still sent by
the enqueue's own transaction on the pooled alias.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.conf import settings
from django.db import connections

from django_fq import conf
from django_fq.db import NOTIFY_CHANNEL


def listen_alias() -> str:
    """The alias a LISTEN must use: ``FQ_LISTEN_DATABASE``, else ``FQ_DATABASE`` (as the wakeup listener)."""
    return getattr(settings, "FQ_LISTEN_DATABASE", None) or conf.database()


@contextmanager
def listening(channel: str = NOTIFY_CHANNEL) -> Iterator[Any]:
    """A psycopg connection (autocommit) on :func:`listen_alias` that has run ``LISTEN channel``.

    Read what it hears with ``conn.notifies(timeout=seconds)``; it is closed on exit.
    """
    import psycopg

    params = connections[listen_alias()].get_connection_params()
    for key in ("cursor_factory", "context", "prepare_threshold"):
        params.pop(key, None)
    with psycopg.connect(**params, autocommit=True) as conn:
        conn.execute(f"LISTEN {channel}")
        yield conn
