"""The job list's search form: what each filter means, and the index that bounds it.

Every search is served by an index of ``django_fq_job`` (docs/admin.md "Searching jobs"):

* job id: the unique index ``fq_job_uid``;
* queue, state and the time ranges: ``fq_job_state_changed`` ``(queue_id, state,
  changed_at)``. A state without a queue is asked of every queue
  (``queue_id IN (…)``: PostgreSQL 15 cannot skip the index's first column). A
  job's ``changed_at`` is its last transition, so ``enqueued_at >= t`` implies
  ``changed_at >= t``, and a finished job's ``changed_at`` is its
  ``finished_at``: both ranges become index ranges on ``changed_at`` besides
  their exact conditions;
* worker, error text, payload and metadata containment and tag: no index
  (a trigram or JSON index would be rewritten by every claim and ack). They
  need a queue and a state, and are tried on the newest :data:`CANDIDATES`
  jobs of that queue and state (by last change) in the time range; the page
  says so when the range held more.

Bad input (malformed JSON, a date that is not one, an unknown queue) is a form
error naming the field; the list then shows nothing, never a 500.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass

from django import forms
from django.db.models import QuerySet

from .. import conf, db, storage, validation
from ..exceptions import FqError
from ..models import QUEUED_STATES, Job, Queue, Stored
from ..types import STATE_NAMES

#: Jobs (of one queue and state) the filters no index serves are tried on at most, newest first.
CANDIDATES = 100_000
#: Longest JSON text a containment filter takes (bytes).
MAX_JSON = 10_000
#: The form's parameter prefix in the list's URL (``?fq-queue=emails&fq-state=dead``).
PREFIX = "fq"

#: Reported state -> the stored states it is read from.
STORED_OF = {
    "scheduled": QUEUED_STATES,
    "ready": QUEUED_STATES,
    "waiting": (Stored.WAITING,),
    "running": (Stored.RUNNING,),
    "succeeded": (Stored.SUCCEEDED,),
    "dead": (Stored.DEAD,),
    "cancelled": (Stored.CANCELLED,),
}
ALL_STORED = tuple(s.value for s in Stored)
FINISHED_STORED = (Stored.SUCCEEDED, Stored.DEAD, Stored.CANCELLED)
#: The filters no index serves (they need a queue and a state, or a job id).
UNINDEXED = ("worker", "error", "payload", "metadata", "tag", "enqueued_to")
_DIGITS = re.compile(r"[0-9]{1,15}")
#: The instants a field takes (epoch ms): the years 1 to 9999 of UTC, which the pages can print.
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_MIN_MS = -((_EPOCH - dt.datetime.min.replace(tzinfo=dt.UTC)) // dt.timedelta(milliseconds=1))
_MAX_MS = (dt.datetime.max.replace(tzinfo=dt.UTC) - _EPOCH) // dt.timedelta(milliseconds=1)


class InstantField(forms.CharField):
    """A point in time: ``YYYY-MM-DD[ HH:MM[:SS[.mmm]]]`` (UTC unless an offset is given) or epoch milliseconds."""

    def to_python(self, value):
        text = (super().to_python(value) or "").strip()
        if not text:
            return None
        if _DIGITS.fullmatch(text):
            return self._in_range(int(text))
        if len(text) > 40:
            raise forms.ValidationError("not a date and time: too long", code="invalid")
        try:
            when = dt.datetime.fromisoformat(text.replace(" ", "T", 1) if len(text) > 10 else text)
        except ValueError:
            raise forms.ValidationError(
                "not a date and time: use YYYY-MM-DD HH:MM[:SS] (UTC) or epoch milliseconds", code="invalid"
            ) from None
        if when.tzinfo is None:
            when = when.replace(tzinfo=dt.UTC)
        # Integer arithmetic: a float timestamp rounds 9999-12-31 23:59:59.9999 up past the last year.
        return self._in_range((when - _EPOCH) // dt.timedelta(milliseconds=1))

    @staticmethod
    def _in_range(ms: int) -> int:
        # 15 digits of epoch ms reach the year 33658, and an offset can push 0001-01-01 or
        # 9999-12-31 past UTC's years: the list and the bulk page could not print them.
        if not _MIN_MS <= ms <= _MAX_MS:
            raise forms.ValidationError("not a date and time: outside the years 1 to 9999 (UTC)", code="invalid")
        return ms


class JsonObjectField(forms.CharField):
    """A JSON object given as text; the value is its compact JSON text (checked like a payload)."""

    def to_python(self, value):
        text = (super().to_python(value) or "").strip()
        if not text:
            return None
        try:
            parsed, compact, _ = validation.parse_json(text, str(self.label), MAX_JSON)
        except FqError as exc:
            raise forms.ValidationError(exc.message.removeprefix(f"{self.label} "), code="invalid") from None
        if not isinstance(parsed, dict):
            raise forms.ValidationError('give a JSON object, e.g. {"user_id": 42}', code="invalid")
        return compact


class SearchForm(forms.Form):
    """The search of the job list (GET parameters ``fq-<name>``); see the module's docstring."""

    id = forms.CharField(label="job id", required=False, max_length=64)
    queue = forms.CharField(label="queue", required=False, max_length=200)
    state = forms.ChoiceField(label="state", required=False, choices=[("", "any")] + [(s, s) for s in STATE_NAMES])
    worker = forms.CharField(label="worker", required=False, max_length=200)
    error = forms.CharField(label="error text", required=False, max_length=200)
    payload = JsonObjectField(label="payload contains", required=False, max_length=MAX_JSON)
    metadata = JsonObjectField(label="metadata contains", required=False, max_length=MAX_JSON)
    tag = forms.CharField(label="tag", required=False, max_length=64)
    enqueued_from = InstantField(label="enqueued from", required=False)
    enqueued_to = InstantField(label="enqueued to", required=False)
    finished_from = InstantField(label="finished from", required=False)
    finished_to = InstantField(label="finished to", required=False)

    def __init__(self, data=None, **kwargs):
        super().__init__(data, prefix=PREFIX, **kwargs)
        self.queue_row: Queue | None = None

    def clean(self):
        data = super().clean() or {}
        for field, value in list(data.items()):
            if isinstance(value, str) and "\x00" in value:
                self.add_error(field, "holds a NUL character")
        job_id = data.get("id")
        if job_id and not validation.job_id(job_id):
            self.add_error("id", "job ids are 32 lowercase hex characters")
        name = data.get("queue")
        if name and not self.has_error("queue"):
            self.queue_row = Queue.objects.using(conf.database()).filter(name=name).first()
            if self.queue_row is None:
                self.add_error("queue", "no queue of that name")
        tag = data.get("tag")
        if tag and not validation.TAG.fullmatch(tag):
            self.add_error("tag", "tags are 1-64 characters from [A-Za-z0-9:._-]")
        for low, high in (("enqueued_from", "enqueued_to"), ("finished_from", "finished_to")):
            lo, hi = data.get(low), data.get(high)
            if lo is not None and hi is not None and lo > hi:
                self.add_error(high, f"is before {self.fields[low].label}")
        unindexed = [n for n in UNINDEXED if data.get(n) not in (None, "")]
        if unindexed and not job_id and not (name and data.get("state")):
            for n in unindexed:
                self.add_error(n, "needs a queue and a state too (no index serves this filter alone)")
        return data

    def is_active(self) -> bool:
        """Whether any field of the form was filled in (valid or not)."""
        return any(self.data.get(self.add_prefix(n), "").strip() for n in self.fields) if self.is_bound else False


@dataclass
class Search:
    """A valid search, ready to narrow a job queryset (:meth:`apply`)."""

    values: dict
    queue_id: int | None
    #: The oldest last-change instant the unindexed filters reach (None: every candidate is reached).
    boundary: int | None = None
    #: Whether :attr:`boundary` cut jobs off (the range held more than :data:`CANDIDATES`).
    capped: bool = False

    @classmethod
    def of(cls, form: SearchForm) -> Search:
        data = form.cleaned_data
        return cls(values=data, queue_id=form.queue_row.pk if form.queue_row else None)

    @property
    def unindexed(self) -> bool:
        return any(self.values.get(n) not in (None, "") for n in UNINDEXED)

    @property
    def anchored(self) -> bool:
        """Whether an index range bounds the rows (not only the job id)."""
        v = self.values
        return bool(
            self.queue_id or v.get("state") or v.get("enqueued_from") is not None
            or v.get("finished_from") is not None or v.get("finished_to") is not None
        )  # fmt: skip

    @property
    def index_ordered(self) -> bool:
        """Whether the list is best ordered by last change (``fq_job_state_changed``'s order).

        One queue and one stored state: the index gives that order, a page reads
        one page of entries. Unindexed filters: their candidates are bounded by
        last change (:attr:`boundary`), so the primary key's order would let the
        planner walk the whole table looking for rare matches.
        """
        return bool(self.queue_id and not self.values.get("id") and (len(self._stored()) == 1 or self.unindexed))

    def _stored(self) -> tuple[str, ...]:
        state = self.values.get("state")
        if state:
            return tuple(STORED_OF[state])
        if self.values.get("finished_from") is not None or self.values.get("finished_to") is not None:
            return FINISHED_STORED
        return ALL_STORED

    def _index_range(self, qs: QuerySet, stored: tuple[str, ...]) -> QuerySet:
        """``qs`` with the conditions ``fq_job_state_changed`` serves: queue(s), stored state(s), changed_at range."""
        v = self.values
        if self.queue_id is not None:
            qs = qs.filter(queue_id=self.queue_id)
        else:
            ids = list(Queue.objects.using(conf.database()).values_list("pk", flat=True))
            qs = qs.filter(queue_id__in=ids)
        qs = qs.filter(state__in=stored) if len(stored) > 1 else qs.filter(state=stored[0])
        lows = [t for t in (v.get("enqueued_from"), v.get("finished_from")) if t is not None]
        if lows:
            qs = qs.filter(changed_at__gte=max(lows))
        if v.get("finished_to") is not None:
            qs = qs.filter(changed_at__lte=v["finished_to"])
        return qs

    def find_boundary(self) -> None:
        """Set :attr:`boundary`: the last change of the :data:`CANDIDATES`-th newest job per stored state.

        One index-only walk of ``fq_job_state_changed`` per stored state (two
        for scheduled/ready): at most :data:`CANDIDATES` entries each.
        """
        if not self.unindexed or self.values.get("id") or self.queue_id is None:
            return
        base = Job.objects.using(conf.database())
        marks: list[int] = []
        for state in self._stored():
            qs = self._index_range(base, (state,)).order_by("-changed_at")
            mark = qs.values_list("changed_at", flat=True)[CANDIDATES - 1 : CANDIDATES]
            marks.extend(mark)
        if marks:
            self.boundary = max(marks)
            self.capped = True

    def apply(self, qs: QuerySet) -> QuerySet:
        """``qs`` (jobs) narrowed to the matches; call :meth:`find_boundary` first (or set :attr:`boundary`)."""
        v = self.values
        if v.get("id"):
            qs = qs.filter(uid=v["id"])
        if self.anchored or self.unindexed:
            qs = self._index_range(qs, self._stored())
        state = v.get("state")
        if state == "scheduled":
            qs = qs.filter(run_at__gt=db.DbNow())
        elif state == "ready":
            qs = qs.filter(run_at__lte=db.DbNow())
        if v.get("enqueued_from") is not None:
            qs = qs.filter(enqueued_at__gte=v["enqueued_from"])
        if v.get("enqueued_to") is not None:
            qs = qs.filter(enqueued_at__lte=v["enqueued_to"])
        if v.get("finished_from") is not None:
            qs = qs.filter(finished_at__gte=v["finished_from"])
        if v.get("finished_to") is not None:
            qs = qs.filter(finished_at__lte=v["finished_to"])
        if self.boundary is not None:
            qs = qs.filter(changed_at__gte=self.boundary)
        store = storage.for_connection(db.connection())
        if v.get("worker"):
            qs = qs.filter(worker=v["worker"])
        if v.get("error"):
            qs = qs.filter(last_error__icontains=v["error"])
        if v.get("tag"):
            qs = store.filter_tag(qs, v["tag"])
        if v.get("payload"):
            qs = store.filter_json_contains(qs, "payload", v["payload"])
        if v.get("metadata"):
            qs = store.filter_json_contains(qs, "metadata", v["metadata"])
        return qs

    def describe(self) -> str:
        """The search in words, for the bulk action's page and the admin's history."""
        form = SearchForm()
        parts = []
        for name, field in form.fields.items():
            value = self.values.get(name)
            if value in (None, ""):
                continue
            if isinstance(field, InstantField):
                from .display import instant

                value = instant(value)
            parts.append(f"{field.label} {value}")
        return ", ".join(parts) or "every job"


def parse(params) -> tuple[SearchForm, Search | None]:
    """The form bound to ``params`` (a QueryDict) and, when it is filled in and valid, its :class:`Search`."""
    form = SearchForm(params)
    if not form.is_active():
        return form, None
    if not form.is_valid():
        return form, None
    search = Search.of(form)
    return form, search
