"""django-fq's models pass Django's model checks on every database, with nothing to silence.

On MariaDB/MySQL Django drops the conditions of partial indexes and unique constraints
(warnings models.W037/W036); migration 0003 builds their equivalents there
(docs/explanation/storage.md), so django-fq's models raise neither, while a user's own
model keeps Django's warning.
"""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.models import Q, UniqueConstraint

from django_fq.models import Job

pytestmark = pytest.mark.django_db


def test_django_fq_models_raise_no_dropped_condition_warning():
    assert [e.id for e in Job.check(databases=["default"])] == []


def test_a_users_conditional_constraint_keeps_djangos_warning_where_conditions_are_dropped():
    theirs = UniqueConstraint(fields=["uid"], name="users_partial", condition=Q(state="queued"))
    run = getattr(theirs, "check", None) or theirs._check  # public from Django 6.0, _check on 5.2
    ids = [e.id for e in run(Job, connection)]
    assert ("models.W036" in ids) == (not connection.features.supports_partial_indexes)
