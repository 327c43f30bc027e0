"""Formatting helpers shared by the admin pages: instants, durations, JSON.

Every instant django-fq stores is an integer of epoch milliseconds taken from
the database clock. The admin shows it as a UTC date and time to the
millisecond and keeps the raw number beside it, so what a person reads can be
matched with what the API, the CLI and the logs print.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import re
from collections.abc import Mapping
from typing import Any, ClassVar, cast, overload

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.exceptions import DisallowedModelAdminLookup
from django.contrib.admin.utils import NotRelationField, get_fields_from_path
from django.core.exceptions import FieldDoesNotExist
from django.db.models import IntegerField, Q
from django.http import HttpResponseBadRequest, HttpResponseRedirect
from django.utils.html import format_html

from .. import db, routing, storage

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
EMPTY = "—"

#: Largest part of a payload or result rendered on a detail page (characters of
#: the pretty-printed text). Payloads may be up to 32 MiB; a page that size helps
#: nobody, so the rest is cut with a note.
MAX_SHOWN_CHARS = 200_000


#: Most jobs a list or a count cell counts exactly; past it, "more than" this many (the count stops there).
COUNT_CAP = 10_000


class AtLeast(int):
    """A count that stopped early: the number is one more than the bound; it reads "more than <bound>".

    A sum with other counts stays one (``AtLeast(10_001) + 5`` reads "more than
    10,005"), so a total over capped counts never passes for an exact number.
    """

    def __str__(self) -> str:
        return f"more than {int(self) - 1:,}"

    def __add__(self, other):
        return AtLeast(int(self) + int(other)) if isinstance(other, int) else NotImplemented

    __radd__ = __add__


@overload
def utc(ms: int) -> dt.datetime: ...
@overload
def utc(ms: None) -> None: ...
@overload
def utc(ms: int | None) -> dt.datetime | None: ...


def utc(ms: int | None) -> dt.datetime | None:
    """The aware UTC datetime of ``ms`` epoch milliseconds (``None`` stays ``None``)."""
    if ms is None:
        return None
    return _EPOCH + dt.timedelta(milliseconds=int(ms))


def instant(ms: int | None) -> str:
    """``ms`` as ``YYYY-MM-DD HH:MM:SS.mmm UTC`` (an em dash when unset)."""
    when = utc(ms)
    if when is None:
        return EMPTY
    return when.strftime("%Y-%m-%d %H:%M:%S.") + f"{when.microsecond // 1000:03d} UTC"


def instant_short(ms: int | None):
    """``ms`` as ``YYYY-MM-DD HH:MM:SS`` (UTC, whole seconds) that does not wrap, for list columns."""
    when = utc(ms)
    if when is None:
        return EMPTY
    return format_html('<span class="fq-nowrap" title="{}">{}</span>', instant(ms), when.strftime("%Y-%m-%d %H:%M:%S"))


def instant_html(ms: int | None):
    """``ms`` as readable UTC text followed by the raw epoch milliseconds, for detail pages."""
    if ms is None:
        return EMPTY
    return format_html('{} <span class="fq-raw">({} ms)</span>', instant(ms), ms)


def duration(ms: int | float | None) -> str:
    """A duration in ms as short text: ``850 ms``, ``1.25 s``, ``3 min 5 s``, ``2 h 0 min``, ``1 d 2 h``."""
    if ms is None:
        return EMPTY
    ms = float(ms)
    if ms < 1000:
        return f"{ms:.0f} ms" if ms == int(ms) or ms >= 10 else f"{ms:.1f} ms"
    seconds = ms / 1000
    if seconds < 60:
        return f"{seconds:.3g} s" if seconds < 10 else f"{seconds:.0f} s"
    minutes, sec = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {sec} s" if sec else f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h" if hours else f"{days} d"


def average(total: int, count: int) -> str:
    """``total / count`` as a duration, or an em dash when nothing was measured."""
    return duration(total / count) if count else EMPTY


def pretty_json(value, *, limit: int = MAX_SHOWN_CHARS) -> str:
    """``value`` as indented JSON text, cut after ``limit`` characters with a note.

    The text is built piece by piece and the encoding stops at the cut:
    indented, a payload nesting 64 levels holds up to 130 spaces per value,
    so a 1 MiB payload would be a 68 MB string before it was cut.
    """
    parts: list[str] = []
    size = 0
    for chunk in _INDENTED.iterencode(value):
        parts.append(chunk)
        size += len(chunk)
        if size > limit:
            return "".join(parts)[:limit] + f"\n… [cut: only the first {limit} characters are shown]"
    return "".join(parts)


_INDENTED = json.JSONEncoder(indent=2, ensure_ascii=False)


def json_block(value):
    """``value`` pretty-printed inside an escaped ``<pre>`` block."""
    return format_html('<pre class="fq-json">{}</pre>', pretty_json(value))


#: Columns holding digests of receipts or of settle arguments. The admin never shows them, and a URL may
#: not filter on them either: a changelist that answers `?receipt_hash__startswith=…` differently for a
#: right and a wrong prefix would read a digest out one character at a time.
DIGEST_FIELDS = frozenset({"receipt_hash", "settled_hash", "settled_args", "settled_outcome"})


def names_a_digest(lookup: str) -> bool:
    """Whether an admin URL lookup (``job__settled_hash__startswith``) touches a digest column."""
    return any(part in DIGEST_FIELDS for part in lookup.split("__"))


_INT64_MAX = 2**63 - 1
_INT64_MIN = -(2**63)
#: A row id as a form posts it (what ``_selected_action`` holds).
_ID = re.compile(r"[0-9]{1,19}")
#: An integer as a URL filter may spell it (Django reads it with ``int()``).
_INT = re.compile(r"\s*[+-]?[0-9]+\s*")


def ints_in_range(value: object, *, many: bool = False) -> bool:
    """Whether no integer in ``value`` (a URL parameter; comma-separated when ``many``) is past 64 bits.

    A part that is not an integer at all passes: Django refuses it itself (the
    list page answers with its ``?e=1`` redirect).
    """
    if isinstance(value, (list, tuple)):
        return all(ints_in_range(v, many=many) for v in value)
    if not isinstance(value, str):
        return True
    for part in value.split(",") if many else (value,):
        if not _INT.fullmatch(part):
            continue
        digits = part.strip().lstrip("+-").lstrip("0")
        # Length first: int() of thousands of digits is slow, and refused past 4300.
        if len(digits) > 19 or not _INT64_MIN <= int(part) <= _INT64_MAX:
            return False
    return True


def is_row_id(value: object) -> bool:
    """Whether ``value`` (a URL part) is a row id: 1-19 digits, at most 2**63 - 1 (else no row has it)."""
    return isinstance(value, str) and bool(_ID.fullmatch(value)) and int(value) <= _INT64_MAX


def has_nul(value: object) -> bool:
    """Whether ``value`` (a URL parameter: a string or a list of them) holds a NUL character.

    PostgreSQL cannot store or compare text with NUL (it raises ``DataError``), and no
    stored id, name or token holds one, so such a value can never match.
    """
    if isinstance(value, (list, tuple)):
        return any(has_nul(v) for v in value)
    return isinstance(value, str) and "\x00" in value


def _alias_shown() -> str:
    """The alias the page being rendered shows (the innermost :func:`django_fq.routing.using`, else the first alias)."""
    return routing.current() or routing.aliases()[0]


class DatabaseActionForm(helpers.ActionForm):
    """Django's action form, plus a hidden ``fq_db`` naming the database the list shows (several databases only).

    A list's rows are numbered per database, so the selection it posts means
    something on that database alone: the hidden field makes the action run
    there (:func:`selected_alias`) even if another tab switched the session since.
    """

    fq_db = forms.CharField(label="", required=False, widget=forms.HiddenInput, initial=_alias_shown)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if not routing.enabled():
            del self.fields["fq_db"]


class FqModelAdmin(admin.ModelAdmin):
    """The base of django-fq's model admins: which filters a URL may ask for, and a NUL-safe search.

    * ``url_lookups`` maps a field path to the lookups a changelist URL may use on it
      (``{"queue__id": {"exact", "in"}}`` allows ``?queue__id__exact=3`` and
      ``?queue__id=3``). Anything else — ``?payload__regex=…``, ``?payload__contains=…``,
      a digest column — is refused with Django's 400 (``DisallowedModelAdminLookup``):
      a view-only user must not run arbitrary scans over every payload.
    * A filter value with a NUL character is refused the same way (400) instead of
      reaching the database, where PostgreSQL would answer with a 500.
    * ``exact_search`` names the fields the search box matches exactly (OR-ed);
      empty means Django's own search over ``search_fields``. A search term with a
      NUL character finds nothing.
    """

    url_lookups: ClassVar[Mapping[str, frozenset[str]]] = {}
    exact_search: ClassVar[tuple[str, ...]] = ()
    action_form = DatabaseActionForm

    @property
    def urls(self):
        """Every view of this admin (Django's and the subclass's own) on the database alias the page shows.

        With ``FQ_QUEUE_DATABASES`` a page reads one database at a time: the one
        picked with ``?fq_db=ALIAS`` (remembered in the session), else
        ``FQ_DATABASE`` (:func:`selected_alias`). The view runs, and its
        response is rendered, inside :func:`django_fq.routing.using` that
        alias, so the changelist, the detail pages, the actions and the
        dashboard all read and write that database.
        """
        patterns = self.get_urls()
        for pattern in patterns:
            if getattr(pattern, "callback", None) is not None and not getattr(pattern.callback, "_fq_routed", False):
                pattern.callback = _on_selected_alias(_page_reads(pattern.callback))
        return patterns

    def changelist_view(self, request, extra_context=None):
        """Django's changelist, with the database switcher when queues are on several databases."""
        extra_context = {**(extra_context or {}), "fq_databases": database_choices(request)}
        return super().changelist_view(request, extra_context)

    def changeform_view(self, request, object_id=None, form_url="", extra_context=None):
        """Django's add/change page; with several databases its form posts to a URL naming the database shown.

        So saving a queue's policy changes the queue the page showed, even after
        another tab switched the session's database.
        """
        if routing.enabled() and not form_url:
            query = request.GET.urlencode()  # without fq_db (selected_alias took it off)
            form_url = pinned(request.path + ("?" + query if query else ""))
        return super().changeform_view(request, object_id, form_url, extra_context)

    def lookup_allowed(self, lookup, value, request=None):
        if names_a_digest(lookup):
            return False
        if has_nul(value):
            raise DisallowedModelAdminLookup(f"Filtering by {lookup} not allowed: the value holds a NUL character")
        if lookup in self.url_lookups:
            path, op = lookup, "exact"
            if op not in self.url_lookups[lookup]:
                return False
        else:
            path, _, op = lookup.rpartition("__")
            if not path or op not in self.url_lookups.get(path, ()):
                return False
        if self._integer_path(path) and not ints_in_range(value, many=op == "in"):
            # SQLite cannot bind such an int at all ("Python int too large") and Django
            # passes it on for __in: a 500 otherwise. No row has such an id.
            raise DisallowedModelAdminLookup(f"Filtering by {lookup} not allowed: the value is out of range")
        return True

    def _integer_path(self, path: str) -> bool:
        """Whether the URL field path ``path`` (``queue``, ``queue__id``) ends on an integer column."""
        try:
            field = get_fields_from_path(self.model, path)[-1]
        except (FieldDoesNotExist, NotRelationField):
            return False
        target = getattr(field, "target_field", None) if field.is_relation else field
        return isinstance(target, IntegerField)

    def response_action(self, request, queryset, *args, **kwargs):
        """Run a bulk action, refusing a selection that is not a list of row ids (a forged POST).

        Django filters ``pk__in`` with the posted values as they are, so a value
        that is not an integer, or one past 64 bits, ended in a 500. Here it is
        an error message and nothing is changed.
        """
        selected = request.POST.getlist(helpers.ACTION_CHECKBOX_NAME)
        if not all(_ID.fullmatch(v) and int(v) <= _INT64_MAX for v in selected):  # _ID: at most 19 digits
            self.message_user(
                request, "The selection is not a list of row ids; nothing was changed.", messages.ERROR
            )
            return HttpResponseRedirect(request.get_full_path())
        return super().response_action(request, queryset, *args, **kwargs)  # Django 6.1: action_location

    def get_search_results(self, request, queryset, search_term):
        if has_nul(search_term):
            return queryset.none(), False
        if not self.exact_search:
            return super().get_search_results(request, queryset, search_term)
        term = search_term.strip()
        if not term:
            return queryset, False
        match = Q()
        for name in self.exact_search:
            match |= Q(**{name: term})
        return queryset.filter(match), False


#: The query parameter that picks the database an admin page shows, and the session key that remembers it.
DATABASE_PARAM = "fq_db"
DATABASE_SESSION_KEY = "django_fq_database"


def selected_alias(request) -> str:
    """The database alias the admin shows ``request``: ``?fq_db=`` (then remembered), the session's, or ``FQ_DATABASE``.

    Only aliases of :func:`django_fq.routing.aliases` are accepted; another
    value is ignored, and a GET says so in a warning message naming the parameter. The parameter is taken off ``request.GET`` so the
    changelist does not read it as a filter.

    A POST may name its database in the form too (the hidden ``fq_db`` of the list's
    action form, :class:`DatabaseActionForm`); it then runs there, whatever the session
    says. A POST naming an alias that holds no queues, or two different ones (URL and
    form), raises :class:`WrongDatabasePosted` (a 400 naming ``fq_db``; nothing is run).
    """
    names = routing.aliases()
    session = getattr(request, "session", None)
    asked = request.GET.get(DATABASE_PARAM)
    posted = request.POST.get(DATABASE_PARAM) if request.method == "POST" else None
    if request.method == "POST":
        if posted is not None or asked is not None:
            # A form names the database its page showed (hidden field or URL): the POST acts
            # there or nowhere; falling back to another database would act on other rows.
            named = {v for v in (posted, asked) if v is not None}
            if len(named) > 1 or not named <= set(names):
                shown = ", ".join(repr(v[:100]) for v in sorted(named))
                raise WrongDatabasePosted(
                    f"{DATABASE_PARAM}: the form names database {shown}, not one database of {', '.join(names)}; nothing was changed"
                )
        if asked is None and posted is not None:
            return posted  # for this POST only: the session keeps the database it shows
    if asked is not None:
        query = request.GET.copy()
        del query[DATABASE_PARAM]
        request.GET = query
        if asked in names and session is not None:
            session[DATABASE_SESSION_KEY] = asked
        elif asked in names:
            return asked
        elif request.method == "GET":
            # Said on the page, so a mistyped or stale link does not pass for the database it named.
            messages.warning(
                request,
                f"Database {asked[:100]!r} of fq_db holds no queues (known: {', '.join(names)}); this page shows another.",
                fail_silently=True,
            )
    remembered = session.get(DATABASE_SESSION_KEY) if session is not None else None
    return remembered if remembered in names else names[0]


class WrongDatabasePosted(Exception):
    """A POST of the admin named no single database that holds queues (``fq_db``); answered with a 400."""


def pinned(url: str) -> str:
    """``url`` with ``?fq_db=`` the alias this page shows, when queues are on several databases (else ``url``).

    For the links and form targets that name a row by its primary key: row
    numbers are per database, so a POST from a page of one database must not
    run on another one the session switched to meanwhile (another tab).
    """
    if not routing.enabled():
        return url
    return f"{url}{'&' if '?' in url else '?'}{DATABASE_PARAM}={_alias_shown()}"


def database_choices(request) -> list[dict]:
    """``[{"alias", "url", "current"}]``: the switcher of a changelist (empty without ``FQ_QUEUE_DATABASES``)."""
    if not routing.enabled():
        return []
    current = routing.current() or routing.aliases()[0]
    return [
        {"alias": alias, "url": f"?{DATABASE_PARAM}={alias}", "current": alias == current}
        for alias in routing.aliases()
    ]


def _on_selected_alias(view):
    @functools.wraps(view)
    def routed(request, *args, **kwargs):
        if not routing.enabled():
            return view(request, *args, **kwargs)
        try:
            alias = selected_alias(request)
        except WrongDatabasePosted as exc:
            return HttpResponseBadRequest(str(exc), content_type="text/plain; charset=utf-8")
        with routing.using(alias):
            response = view(request, *args, **kwargs)
            if hasattr(response, "render") and not getattr(response, "is_rendered", True):
                response.render()  # its lazy querysets read the database now, on this alias
            return response

    routed._fq_routed = True  # type: ignore[attr-defined]
    return routed


def _page_reads(view):
    """``view`` whose GET/HEAD requests run and render in the store's ``page_reads`` (POSTs as they are)."""

    @functools.wraps(view)
    def reads(request, *args, **kwargs):
        if request.method not in ("GET", "HEAD"):
            return view(request, *args, **kwargs)
        conn = db.connection()
        # This process's unwritten history first: inside the page's transaction it would wait
        # (services.history.Tally.flush leaves an alias in a transaction for later).
        from ..services import history

        history.flush()
        with storage.for_connection(conn).page_reads(conn):
            response = view(request, *args, **kwargs)
            if hasattr(response, "render") and not getattr(response, "is_rendered", True):
                response.render()  # its lazy querysets read the database now, inside the context
            return response

    return reads


#: ``url_lookups`` entries: exact and a list of values.
EXACT_OR_IN = frozenset({"exact", "in"})
EXACT = frozenset({"exact"})


#: Most queues offered by a list's queue filter; the last choice links to the queue list for the rest.
FILTER_QUEUES = 100


class QueueFilter(admin.RelatedFieldListFilter):
    """A list's queue filter with at most :data:`FILTER_QUEUES` choices (the first queues by name).

    Django's own filter lists every queue: with thousands of them each list page
    would carry a megabyte of links (and, with facets, a count per queue). The
    queues picked in the URL are among the choices (at most :data:`FILTER_QUEUES`
    more of them); a last entry links to the queue list, whose search finds any
    queue and whose counts link back here.

    The choices never carry facet counts, even with "Show counts" (``?_facets``):
    each count is one more aggregate over the whole job table, so a view-only
    user's click would cost a scan with a hundred of them. The queue list shows
    the counts per queue from its counters instead (docs/admin.md, "Jobs").
    """

    def field_choices(self, field, request, model_admin):
        from .. import conf
        from ..models import Queue

        queues = Queue.objects.using(conf.database()).order_by("name")
        rows = list(queues.values_list("pk", "name")[: FILTER_QUEUES + 1])
        self.fq_more = len(rows) > FILTER_QUEUES
        rows = rows[:FILTER_QUEUES]
        picked = {int(v) for v in (self.lookup_val or ()) if isinstance(v, str) and v.isdigit() and len(v) < 19}
        missing = sorted(picked - {pk for pk, _ in rows})[:FILTER_QUEUES]  # a URL may name thousands
        if missing:
            rows += list(queues.filter(pk__in=missing).values_list("pk", "name"))
        return rows

    def choices(self, changelist):
        yield from super().choices(cast(Any, _WithoutFacets(changelist)))  # a ChangeList stand-in
        if getattr(self, "fq_more", False):
            from django.urls import reverse

            yield {
                "selected": False,
                "query_string": reverse("admin:django_fq_queue_changelist", current_app=changelist.model_admin.admin_site.name),
                "display": f"More queues… (first {FILTER_QUEUES} by name shown)",
            }


class _WithoutFacets:
    """A changelist as a filter sees it, with facets off (see :class:`QueueFilter`)."""

    add_facets = False

    def __init__(self, changelist):
        self._changelist = changelist

    def __getattr__(self, name):
        return getattr(self._changelist, name)
