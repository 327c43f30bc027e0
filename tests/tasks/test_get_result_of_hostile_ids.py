"""``get_result`` of an id no job can have is ``TaskResultDoesNotExist``, never a database error.

A result id often comes from a URL (a status page ``/tasks/<id>/``), where
``%00`` is a NUL character. PostgreSQL cannot compare text holding NUL
(``DataError``) and no database takes a lone surrogate (``UnicodeEncodeError``),
so ``get_result`` answered those ids with a traceback instead of Django's
documented ``TaskResultDoesNotExist`` (docs/tasks.md, "Results").
"""

from __future__ import annotations

import pytest

from django_fq import services as fq
from django_fq.tasks import _compat

pytestmark = pytest.mark.django_db

HOSTILE_IDS = ["a\x00b", "\x00", "0" * 31 + "\x00", "\ud800", "tok-\udfff", "t" * 256, "a" * 255 + "\x00", 7, None, ""]


@pytest.mark.parametrize("result_id", HOSTILE_IDS, ids=repr)
def test_an_id_no_job_can_have_does_not_exist(backend, result_id):
    fq.configure("tk.default")
    with pytest.raises(_compat.TaskResultDoesNotExist):
        backend.get_result(result_id)


def test_real_ids_and_provisional_tokens_still_resolve(backend):
    from tests.tasks.sample import add

    result = add.using(backend="default").enqueue(2, 3)
    assert backend.get_result(result.id).id == result.id
