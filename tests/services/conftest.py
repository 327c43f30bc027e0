"""Fixtures for the contract tests of the Python API (``django_fq.services``)."""

from __future__ import annotations

import pytest

from django_fq import conf
from django_fq import db as fqdb
from django_fq import services as fq

from .helpers import QUEUE, FrozenClock


@pytest.fixture
def q(db):
    """A queue with the default policy, created through the API; returns its name."""
    fq.configure(QUEUE)
    return QUEUE


@pytest.fixture
def frozen(db, clock, settings, monkeypatch):
    """Freeze the database clock at its current value (see :class:`FrozenClock`).

    Needed where a test must hit an instant to the millisecond (a lease at
    deadline − 1 ms versus at its deadline), which a moving clock cannot do.
    The clock SQL of :func:`django_fq.db.now_sql` becomes a constant plus the
    ``clock`` fixture's offset, so every comparison still happens in SQL.
    """
    start = fqdb.db_now_ms()

    def frozen_now_sql(conn=None) -> str:
        # A bare integer literal: a bigint on every backend (MySQL has no CAST … AS BIGINT).
        return f"({start + conf.clock_offset_ms():d})"

    monkeypatch.setattr(fqdb, "now_sql", frozen_now_sql)
    frozen = FrozenClock(clock, settings, start)
    assert fqdb.db_now_ms() == frozen.now
    return frozen
