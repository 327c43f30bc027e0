"""``enqueue_many`` names the item to blame in every error's field (found while writing the docs).

Its docstring promises that an invalid item's error has its ``field``
prefixed with ``items[i].``. Checks made before the batch is written honour
that; the "``at`` more than 10 years ahead" check, made against the database
clock while writing, reported a bare ``at``, so a caller of a large batch
could not tell which item was wrong.
"""

from __future__ import annotations

import pytest

from django_fq import services as fq
from django_fq.exceptions import InvalidTime
from django_fq.validation import MAX_DELAY_MS

pytestmark = pytest.mark.django_db

QUEUE = "docs-found:fields"


def test_at_too_far_ahead_names_its_item_and_writes_nothing():
    far = 2**62  # epoch ms far beyond now + 10 years, whatever the clock says
    assert far > MAX_DELAY_MS
    with pytest.raises(InvalidTime) as err:
        fq.enqueue_many(QUEUE, [{"payload": 1}, {"payload": 2, "at": far}])
    assert err.value.field == "items[1].at"
    assert QUEUE not in [q.name for q in fq.queues()]  # the whole batch rolled back, queue included
