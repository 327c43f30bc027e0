"""The views of the REST API: thin adapters from HTTP to :mod:`django_fq.services`.

Each view decodes the JSON body (or query string), hands the values to the
service verb unchanged — so every rule, error code and field name is the one
of the Python API and of ``manage.py fq`` — and renders the result as the
CLI's ``--json`` does (but ``created`` is ``true``/``false``).

The views opt out of ``ATOMIC_REQUESTS``: django-fq runs its own short
transactions (and retries them on deadlocks only when it owns them), and a
long poll must not sit in a transaction for 20 seconds.

The lease views (claim, ack, nack, release, extend) are marked
``sensitive_variables``: Django's error reports of a 500 (the mail to
``ADMINS``, error-tracking tools that honour the mark) show the local
variables of every frame under them as stars, so the receipts in their
bodies and in the services' arguments stay out of those reports.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import asdict

from django.conf import settings
from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.db import connections, transaction
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from django.views.decorators.debug import sensitive_variables
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, PolymorphicProxySerializer, extend_schema
from rest_framework import status
from rest_framework.exceptions import AuthenticationFailed, UnsupportedMediaType
from rest_framework.exceptions import PermissionDenied as DrfPermissionDenied
from rest_framework.renderers import JSONRenderer
from rest_framework.response import Response
from rest_framework.views import APIView

from .. import batches, services, validation, workflows
from ..exceptions import (
    CountOutOfRange,
    FqError,
    InvalidArgument,
    InvalidDependency,
    InvalidJson,
    InvalidTime,
    QueueNotFound,
)
from ..services import dependencies, history, upstream
from ..services.enqueue import ENVELOPE_KEYS
from ..services.jobs import job_not_found
from ..types import STATE_NAMES, QueuePolicy
from . import conf, longpoll
from . import serializers as s
from .exceptions import exception_handler
from .parsers import FqJSONParser
from .permissions import CONSUME, MANAGE, PERMISSION_OF, PRODUCE, holds

POLICY_FIELDS = frozenset(QueuePolicy.__dataclass_fields__)
#: Methods that change something: they must declare a JSON body (see :meth:`FqAPIView.initial`).
WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
#: Default ``timeout_ms`` of ``wait`` over HTTP (also its maximum).
DEFAULT_WAIT_MS = 20_000


def _doc(**kwargs):
    """``extend_schema`` on drf-spectacular's AutoSchema, whatever the project's ``DEFAULT_SCHEMA_CLASS``."""

    def decorate(method):
        method.kwargs = {"schema": AutoSchema}  # extend_schema builds on the schema class found here
        return extend_schema(**kwargs)(method)

    return decorate


def _errors(*codes: int) -> dict:
    return {code: OpenApiResponse(s.ErrorSerializer, description=_ERROR_TEXT[code]) for code in codes}


_ERROR_TEXT = {
    400: "bad input (the field is named)",
    401: "not authenticated",
    403: "not authenticated, or missing the django-fq permission",
    404: "no such queue or job",
    408: "the job did not finish within timeout_ms (code wait_timeout)",
    409: "invalid or expired receipt (invalid_receipt), job cancelled (cancelled), wrong state (invalid_state), "
    "or a new queue would pass FQ_MAX_QUEUES (too_many_queues)",
    413: "request body or payload too large",
    415: "a write without Content-Type: application/json (even with an empty body), or a body that is not JSON",
    429: "queue full, or throttled",
    503: "the database refused the connection or is busy (Retry-After says when to try again)",
}
_COMMON = (400, 401, 403, 503)
_WAIT_TEXT = (
    "Users who may manage the queue get the whole job; producers get its outcome only "
    "(id, queue, state, result), never the payload, error texts or workers."
)
_WAIT_ANSWER = OpenApiResponse(
    PolymorphicProxySerializer(
        component_name="JobWaitAnswer",
        serializers=[s.JobSerializer, s.JobOutcomeSerializer],
        resource_type_field_name=None,
    ),
    description="the job (manage) or its outcome (produce only)",
)
_QUEUE_PARAM = OpenApiParameter(
    "queue",
    {"type": "string", "pattern": r"^[A-Za-z0-9:._-]{1,200}$", "minLength": 1, "maxLength": 200},
    OpenApiParameter.PATH,
    description="queue name: 1-200 of [A-Za-z0-9:._-]",
)
_JOB_PARAM = OpenApiParameter("job_id", {"type": "string", "minLength": 1}, OpenApiParameter.PATH, description="job id")
_BATCH_PARAM = OpenApiParameter(
    "batch_id", {"type": "string", "minLength": 1}, OpenApiParameter.PATH, description="batch id (of this queue)"
)


# --- the base view ----------------------------------------------------------------------------


class CompactJSONRenderer(JSONRenderer):
    """DRF's JSON renderer without the ``indent`` a client may ask for (``Accept: application/json; indent=8``).

    Indenting writes each value on its own line after up to 8 spaces per
    level: a claim of payloads nesting 64 levels (as allowed) would answer
    hundreds of times the bytes it reads, built in memory by Python's pure
    encoder. Every answer is compact JSON (docs/rest-api.md, "Limits").
    """

    def get_indent(self, accepted_media_type, renderer_context):
        return None


class FqAPIView(APIView):
    """Base of every django-fq view: settings read per request, JSON only, uniform errors.

    ``capabilities`` maps an HTTP method to the capabilities of which any
    one admits the request (see :mod:`django_fq.api.permissions`).
    """

    capabilities: dict[str, tuple[str, ...]] = {}
    parser_classes = [FqJSONParser]
    renderer_classes = [CompactJSONRenderer]

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "schema" not in cls.__dict__:
            # drf-spectacular's inspector whatever the project's DEFAULT_SCHEMA_CLASS; one per view class.
            cls.schema = AutoSchema()

    @classmethod
    def as_view(cls, **initkwargs):
        view = super().as_view(**initkwargs)
        # Opt out of ATOMIC_REQUESTS on every database (see the module docstring).
        for alias in connections:
            view = transaction.non_atomic_requests(using=alias)(view)
        return view

    def get_authenticators(self):
        return [auth() for auth in conf.authentication_classes()]

    def get_permissions(self):
        return [perm() for perm in conf.permission_classes()]

    def get_exception_handler(self):
        return exception_handler

    def perform_authentication(self, request):
        """Refuse credentials holding a NUL character before any authentication class looks them up.

        HTTP Basic sends the user name base64-encoded, and Django unquotes
        ``"\\000"`` in a cookie, so a user name or a session key may hold a NUL
        although no header can; PostgreSQL cannot compare such text and the
        lookup would fail with ``DataError`` (a 500). No user name, token or
        session key holds one, so the request cannot authenticate anyway: it
        gets ``authentication_failed`` (401, or 403 without a scheme). See
        docs/security.md ("Credentials the database cannot compare").
        """
        problem = validation.credentials_problem(
            request.META.get("HTTP_AUTHORIZATION", ""), request.COOKIES.get(settings.SESSION_COOKIE_NAME)
        )
        if problem:
            raise AuthenticationFailed(problem)
        APIView.perform_authentication(self, request)  # not super(): the schema view borrows this method

    def initial(self, request, *args, **kwargs):
        """Authenticate, check permissions and throttles, then refuse a write that is not JSON.

        A request that changes something must say ``Content-Type:
        application/json``, even with an empty body (cancel, retry, delete):
        an HTML form or a ``text/plain`` fetch from another site cannot set
        that type without a CORS preflight, so with HTTP Basic (which has no
        CSRF token) it cannot retry or cancel jobs on a user's behalf. The
        check runs after the permission check, so a denied request still gets
        401/403. See docs/security.md ("Cross-site requests cannot write").
        """
        super().initial(request, *args, **kwargs)
        method = request.method.upper()
        if method in WRITE_METHODS and hasattr(self, method.lower()):  # else the 405 says more
            media = (request.content_type or "").split(";", 1)[0].strip().lower()
            if media != "application/json":
                raise UnsupportedMediaType(
                    media or "(none)",
                    detail=f"a {method} must send Content-Type: application/json "
                    f"(even with an empty body), not {media or 'none'}",
                )

    def max_body_bytes(self) -> int:
        """Largest request body this view accepts (checked against Content-Length before parsing)."""
        return conf.max_body_bytes()


# --- request helpers ----------------------------------------------------------------------------



class ProgressView(FqAPIView):
    """Store how far a leased job got (``consume``)."""

    capabilities = {"POST": (CONSUME,)}

    @_doc(
        operation_id="progress",
        summary="Store the progress of a running job: a percentage and a short message (each call writes once)",
        parameters=[_QUEUE_PARAM],
        request=s.ProgressSerializer,
        responses={200: s.ProgressSerializer, **_errors(*_COMMON, 404, 409, 413, 415)},
        tags=["leases"],
    )
    @sensitive_variables()  # error reports must not show receipts (see the module docstring)
    def post(self, request, queue):
        body = _body(request, {"receipt", "progress", "message"}, required=("receipt", "progress"))
        value, message = services.report_progress(queue, body["receipt"], body["progress"], body.get("message"))
        return Response({"progress": value, "message": message})


def _body(request, allowed, *, required=()) -> dict:
    """The request body as a dict: a JSON object with only ``allowed`` keys and every ``required`` one."""
    data = request.data
    if not isinstance(data, dict):
        raise InvalidJson("the request body must be a JSON object")
    for name in sorted(map(str, data)):
        if name not in allowed:
            raise InvalidArgument(f"unknown field: {name}", field=name)
    for name in required:
        if name not in data:
            raise InvalidArgument(f"{name} is required", field=name)
    return dict(data)


def _given(body: dict, name: str, default=None):
    """``body[name]``, or ``default`` when it is missing or null."""
    value = body.get(name)
    return default if value is None else value


def _query_int(request, name: str, default):
    """An integer query parameter; a non-integer is passed on for the services to reject by name."""
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    text = raw.strip()
    digits = text[1:] if text[:1] in "+-" else text
    if digits.isascii() and digits.isdigit() and len(digits) <= 30:
        return int(text)
    return raw


def _job_id(queue: str, job_id: str) -> str:
    # No stored id contains NUL, and PostgreSQL cannot even compare text with one.
    if "\x00" in job_id:
        raise job_not_found(queue, job_id)
    return job_id


def _at(value, field: str):
    """``at`` as the services take it: epoch ms as given, or an ISO 8601 string made an aware datetime."""
    if not isinstance(value, str):
        return value
    try:
        parsed = parse_datetime(value.strip())
    except (ValueError, OverflowError):
        parsed = None
    if parsed is None or timezone.is_naive(parsed):
        raise InvalidTime(f"{field} must be epoch milliseconds or an ISO 8601 date-time with a UTC offset", field=field)
    return parsed


def _envelope(raw: dict, prefix: str = "") -> dict:
    """Check one enqueue envelope's keys; return it with ``at`` converted."""
    for name in sorted(map(str, raw)):
        if name not in ENVELOPE_KEYS:
            raise InvalidArgument(f"unknown enqueue option: {prefix}{name}", field=f"{prefix}{name}")
    if "payload" not in raw:
        raise InvalidArgument(f"{prefix}payload is required", field=f"{prefix}payload")
    out = dict(raw)
    if out.get("at") is not None:
        out["at"] = _at(out["at"], f"{prefix}at")
    return out


def _worker(request, body: dict) -> str:
    worker = body.get("worker")
    if worker is None:
        name = request.user.get_username() if getattr(request.user, "is_authenticated", False) else ""
        return f"api:{name}" if name else "api"
    if not isinstance(worker, str) or len(worker) > 200:
        raise InvalidArgument("worker must be a string of at most 200 characters", field="worker")
    if "\x00" in worker or any("\ud800" <= ch <= "\udfff" for ch in worker):
        raise InvalidArgument("worker contains a NUL character or a lone surrogate", field="worker")
    return worker


# --- response helpers ------------------------------------------------------------------------------


def _queue_config(queue: str, policy: QueuePolicy) -> dict:
    return {"queue": queue, **asdict(policy)}


def _queue_info(info) -> dict:
    return {
        "name": info.name,
        "policy": asdict(info.policy),
        "counts": dict(info.counts),
        "created_at": info.created_at,
        "paused": info.paused,
        "paused_at": info.paused_at,
    }


def _enqueued(result) -> dict:
    return {"id": result.id, "created": bool(result.created)}


def _claimed(job) -> dict:
    return {
        "id": job.id,
        "payload": job.payload,
        "receipt": job.receipt,
        "deadline": job.deadline,
        "attempts": job.attempts,
        "enqueued_at": job.enqueued_at,
        "metadata": job.metadata or {},
    }


def _settled(result) -> dict:
    return {"id": result.id, "state": result.state, "run_at": result.run_at, "replay": bool(result.replay)}


def _job(info, request, view) -> dict:
    """The whole job, its ``depends_on`` and ``dependents`` cut to the jobs of queues the user may manage.

    A permission class may limit a user to some queues (docs/rest-api.md):
    an edge to another queue's job would show that job's id, queue and state.
    """
    out = asdict(info)
    for key in ("depends_on", "dependents"):
        edges = out.get(key) or []
        if edges:
            allowed = _managed(request, view, {e["queue"] for e in edges})
            out[key] = [e for e in edges if e["queue"] in allowed]
    return out


def _outcome(info) -> dict:
    """What a producer may learn of a job by ``wait``: its id, queue, state and result."""
    return {"id": info.id, "queue": info.queue, "state": info.state, "result": info.result}


def _listed(info) -> dict:
    out = asdict(info)
    for key in ("payload", "result", "errors", "depends_on", "dependents"):
        out.pop(key, None)
    return out


def _queue_exists(queue: str) -> bool:
    try:
        services.policy(queue)
    except QueueNotFound:
        return False
    return True


# --- queues -----------------------------------------------------------------------------------------


class QueueListView(FqAPIView):
    """Every queue with its policy and its job counts per state (``manage``)."""

    capabilities = {"GET": (MANAGE,)}

    @_doc(
        operation_id="queues_list",
        summary="List the queues the user may manage, with their policy and job counts",
        responses={200: s.QueueInfoSerializer(many=True), **_errors(401, 403, 503)},
        tags=["queues"],
    )
    def get(self, request):
        # The list was admitted with queue=None; a permission class that limits users to some
        # queues is asked again for each one, so a user sees only the queues it may manage.
        perms = self.get_permissions()
        return Response(
            [_queue_info(q) for q in services.queues() if holds(request, self, MANAGE, q.name, perms)]
        )


class QueueDetailView(FqAPIView):
    """One queue: read its policy, set it (PUT: whole, PATCH: some fields; both create the queue), delete it (``manage``)."""

    capabilities = {"GET": (MANAGE,), "PUT": (MANAGE,), "PATCH": (MANAGE,), "DELETE": (MANAGE,)}

    @_doc(
        operation_id="queue_get",
        summary="A queue's policy (404 if it does not exist; never creates it)",
        parameters=[_QUEUE_PARAM],
        responses={200: s.QueueConfigSerializer, **_errors(*_COMMON, 404)},
        tags=["queues"],
    )
    def get(self, request, queue):
        return Response(_queue_config(queue, services.policy(queue)))

    @_doc(
        operation_id="queue_put",
        summary="Set a queue's whole policy (omitted fields: defaults), creating the queue",
        parameters=[_QUEUE_PARAM],
        request=s.PolicyInputSerializer,
        responses={200: s.QueueConfigSerializer, 201: s.QueueConfigSerializer, **_errors(*_COMMON, 409, 413, 415)},
        tags=["queues"],
    )
    def put(self, request, queue):
        body = self._policy_body(request, queue)
        defaults = asdict(QueuePolicy())
        changes = {name: _given(body, name, defaults[name]) for name in POLICY_FIELDS}
        return self._configure(queue, changes)

    @_doc(
        operation_id="queue_patch",
        summary="Change some policy fields of a queue, creating the queue",
        parameters=[_QUEUE_PARAM],
        request=s.PolicyInputSerializer,
        responses={200: s.QueueConfigSerializer, 201: s.QueueConfigSerializer, **_errors(*_COMMON, 409, 413, 415)},
        tags=["queues"],
    )
    def patch(self, request, queue):
        body = self._policy_body(request, queue)
        return self._configure(queue, {name: body[name] for name in POLICY_FIELDS if body.get(name) is not None})

    @_doc(
        operation_id="queue_delete",
        summary="Delete a queue with all its jobs, leases and idempotency tokens",
        parameters=[_QUEUE_PARAM],
        responses={200: s.DeletedSerializer, **_errors(*_COMMON, 404, 415)},
        tags=["queues"],
    )
    def delete(self, request, queue):
        _body(request, set())  # no fields: an unknown one is refused, not ignored
        services.delete_queue(queue)
        return Response({"queue": queue, "deleted": True})

    @staticmethod
    def _policy_body(request, queue: str) -> dict:
        body = _body(request, POLICY_FIELDS | {"queue"})
        if "queue" in body and body["queue"] != queue:
            raise InvalidArgument("queue in the body must be the queue of the URL", field="queue")
        return body

    @staticmethod
    def _configure(queue: str, changes: dict) -> Response:
        existed = _queue_exists(queue)  # for the status code only; an invalid name raises here
        policy = services.configure(queue, **changes)
        return Response(_queue_config(queue, policy), status=status.HTTP_200_OK if existed else status.HTTP_201_CREATED)


class QueuePauseView(FqAPIView):
    """Pause a queue: every claim of it hands out no job until it is resumed (``manage``)."""

    capabilities = {"POST": (MANAGE,)}

    @_doc(
        operation_id="queue_pause",
        summary="Pause a queue: claims get no job (running jobs settle as usual, enqueues go on)",
        parameters=[_QUEUE_PARAM],
        request=None,
        responses={200: s.PausedSerializer, **_errors(*_COMMON, 404, 415)},
        tags=["queues"],
    )
    def post(self, request, queue):
        _body(request, set())  # no fields: an unknown one is refused, not ignored
        return Response(asdict(services.pause(queue)))


class QueueResumeView(FqAPIView):
    """Resume a paused queue (``manage``)."""

    capabilities = {"POST": (MANAGE,)}

    @_doc(
        operation_id="queue_resume",
        summary="Resume a paused queue: claims take its jobs again",
        parameters=[_QUEUE_PARAM],
        request=None,
        responses={200: s.PausedSerializer, **_errors(*_COMMON, 404, 415)},
        tags=["queues"],
    )
    def post(self, request, queue):
        _body(request, set())
        return Response(asdict(services.resume(queue)))


class StatsView(FqAPIView):
    """Counts per state, totals and the sums/counts of wait and run times of a queue (``manage``)."""

    capabilities = {"GET": (MANAGE,)}

    @_doc(
        operation_id="queue_stats",
        summary="Counts per state, totals and wait/run time sums of a queue",
        parameters=[_QUEUE_PARAM],
        responses={200: s.StatsSerializer, **_errors(*_COMMON, 404)},
        tags=["queues"],
    )
    def get(self, request, queue):
        return Response(asdict(services.stats(queue)))


class HistoryView(FqAPIView):
    """A queue's per-minute history over the last hour, day or week (``manage``; docs/reference/history.md)."""

    capabilities = {"GET": (MANAGE,)}

    @_doc(
        operation_id="queue_history",
        summary="Throughput and wait/run time (median, p95) of a queue per bucket over the last hour, day or week",
        parameters=[
            _QUEUE_PARAM,
            OpenApiParameter(
                "span", str, enum=["hour", "day", "week"], description="hour (60 × 1 min, default), day (96 × 15 min), week (168 × 1 h)"
            ),
        ],
        responses={200: s.HistorySerializer, **_errors(*_COMMON, 404)},
        tags=["queues"],
    )
    def get(self, request, queue):
        return Response(history.history_series(queue, request.query_params.get("span", "hour")))


# --- jobs --------------------------------------------------------------------------------------------


class JobsView(FqAPIView):
    """A queue's jobs: list them (``manage``) or enqueue one (``produce``)."""

    capabilities = {"GET": (MANAGE,), "POST": (PRODUCE,)}

    @_doc(
        operation_id="jobs_list",
        summary="One page of a queue's jobs (metadata only, never a receipt)",
        parameters=[
            _QUEUE_PARAM,
            OpenApiParameter("state", str, enum=list(STATE_NAMES), description="only jobs in this state"),
            OpenApiParameter("cursor", str, description="next_cursor of the previous page; 0 or none: the first page"),
            OpenApiParameter(
                "count", {"type": "integer", "minimum": 1, "maximum": 1000}, description="page size (default 20)"
            ),
            OpenApiParameter(
                "tag",
                {"type": "string", "pattern": "^[A-Za-z0-9:._-]{1,64}$"},
                description='only jobs whose metadata "tags" hold this tag (exact); the cursor pages on with it',
            ),
        ],
        responses={200: s.JobPageSerializer, **_errors(*_COMMON, 404)},
        tags=["jobs"],
    )
    def get(self, request, queue):
        params = request.query_params
        page = services.jobs(
            queue,
            state=params.get("state") or None,
            cursor=params.get("cursor") or None,
            count=_query_int(request, "count", 20),
            tag=params.get("tag") or None,
        )
        return Response({"jobs": [_listed(j) for j in page.jobs], "next_cursor": page.next_cursor})

    @_doc(
        operation_id="job_enqueue",
        summary="Enqueue one job (201 created; 200 when a token or unique key matched an existing job)",
        parameters=[_QUEUE_PARAM],
        request=s.EnqueueSerializer,
        responses={
            201: s.EnqueuedSerializer,
            200: OpenApiResponse(s.EnqueuedSerializer, description="duplicate: the existing job's id"),
            **_errors(*_COMMON, 404, 409, 413, 415, 429),
        },
        tags=["jobs"],
    )
    def post(self, request, queue):
        env = _envelope(_body(request, ENVELOPE_KEYS, required=("payload",)))
        payload = env.pop("payload")
        _dependency_rule(request, self, queue, [("", env)])
        with _creation_rule(request, self, queue) as create:
            result = services.enqueue(queue, payload, create_queue=create, **env)
        code = status.HTTP_201_CREATED if result.created else status.HTTP_200_OK
        return Response(_enqueued(result), status=code, headers={"Location": f"{request.path.rstrip('/')}/{result.id}/"})


class BulkEnqueueView(FqAPIView):
    """Enqueue many jobs at once, all or nothing (``produce``)."""

    capabilities = {"POST": (PRODUCE,)}
    #: The field a refusal for too many JSON values names: the envelopes make up the body.
    values_field = "jobs"

    def max_body_bytes(self) -> int:
        return conf.max_bulk_body_bytes()

    @_doc(
        operation_id="job_enqueue_bulk",
        summary="Enqueue many jobs in one transaction, all or nothing; results in input order",
        parameters=[_QUEUE_PARAM],
        request=s.BulkEnqueueSerializer,
        responses={
            201: s.EnqueuedSerializer(many=True),
            200: OpenApiResponse(s.EnqueuedSerializer(many=True), description="every envelope was a duplicate"),
            **_errors(*_COMMON, 404, 409, 413, 415, 429),
        },
        tags=["jobs"],
    )
    def post(self, request, queue):
        body = _body(request, {"jobs"}, required=("jobs",))
        raw = body["jobs"]
        if not isinstance(raw, list):
            raise InvalidArgument("jobs must be a list of envelopes", field="jobs")
        limit = conf.max_bulk_jobs()
        if len(raw) > limit:
            raise CountOutOfRange(f"at most {limit} jobs per bulk enqueue (FQ_API_MAX_BULK_JOBS)", field="jobs")
        items = []
        for i, env in enumerate(raw):
            if not isinstance(env, dict):
                raise InvalidArgument(f"jobs[{i}] must be a JSON object", field=f"jobs[{i}]")
            items.append(_envelope(env, f"jobs[{i}]."))
        _dependency_rule(request, self, queue, [(f"jobs[{i}].", env) for i, env in enumerate(items)])
        try:
            with _creation_rule(request, self, queue) as create:
                results = services.enqueue_many(queue, items, create_queue=create)
        except FqError as exc:
            _rename_items(exc)
            raise
        code = status.HTTP_201_CREATED if any(r.created for r in results) else status.HTTP_200_OK
        return Response([_enqueued(r) for r in results], status=code)


@contextmanager
def _creation_rule(request, view, queue: str):
    """Whether this enqueue may create ``queue`` (``FQ_API_CREATE_QUEUES``); names the rule when it may not."""
    capability = conf.create_queues()
    create = holds(request, view, capability, queue)
    try:
        yield create
    except QueueNotFound as exc:
        if not create:
            exc.message = (
                f"no such queue: {queue}; an enqueue creates a queue only for users with "
                f"{PERMISSION_OF[capability]} (FQ_API_CREATE_QUEUES)"
            )
            exc.args = (exc.message,)
        raise


def _dependency_rule(request, view, queue: str, envelopes: list[tuple[str, dict]]) -> None:
    """A dependency on a job of another queue needs ``produce`` on that queue too (docs/rest-api.md).

    Where a permission class limits users to some queues, a producer of one
    queue must not reach into another's jobs through ``depends_on`` (learn its
    state, hold its pruning). Refused as a job that does not exist (no oracle
    of other queues' ids), before anything is written. A malformed
    ``depends_on`` is left to the enqueue, which names it.
    """
    wanted: list[tuple[str, int, str]] = []
    parsed: list[tuple[str, tuple]] = []
    for prefix, env in envelopes:
        try:
            edges = dependencies.parse(env.get("depends_on"), f"{prefix}depends_on") or ()
        except FqError:
            continue
        parsed.append((prefix, edges))
        wanted += [(prefix, i, e.id) for i, e in enumerate(edges)]
    if not wanted:
        return
    dependencies.check_total(parsed)  # before the look-up of their queues
    owners = dependencies.queues_of([uid for _, _, uid in wanted])
    allowed: dict[str, bool] = {queue: True}
    for prefix, i, uid in wanted:
        other = owners.get(uid)
        if other is None:
            continue  # the enqueue reports it missing
        if other not in allowed:
            allowed[other] = holds(request, view, PRODUCE, other)
        if not allowed[other]:
            field = f"{prefix}depends_on[{i}]"
            raise InvalidDependency(f"{field}: no job {uid} in this database", field=field)


def _rename_items(exc: FqError) -> None:
    """``items[i].x`` (the services' name for an envelope) → ``jobs[i].x`` (the body's)."""
    if exc.field and exc.field.startswith("items["):
        exc.field = "jobs" + exc.field[len("items") :]
        exc.message = exc.message.replace("items[", "jobs[")
        exc.args = (exc.message,)


class JobDetailView(FqAPIView):
    """One job with payload, result and error history (``manage``)."""

    capabilities = {"GET": (MANAGE,)}

    @_doc(
        operation_id="job_get",
        summary="A job: metadata, payload, result and error history (never its receipt)",
        parameters=[_QUEUE_PARAM, _JOB_PARAM],
        responses={200: s.JobSerializer, **_errors(*_COMMON, 404)},
        tags=["jobs"],
    )
    def get(self, request, queue, job_id):
        return Response(_job(services.get(queue, _job_id(queue, job_id)), request, self))


class JobRetryView(FqAPIView):
    """Retry a dead job (``manage``)."""

    capabilities = {"POST": (MANAGE,)}

    @_doc(
        operation_id="job_retry",
        summary="Make a dead job ready again with attempts reset to 0",
        parameters=[_QUEUE_PARAM, _JOB_PARAM],
        request=None,
        responses={200: s.JobSerializer, **_errors(*_COMMON, 404, 409, 415)},
        tags=["jobs"],
    )
    def post(self, request, queue, job_id):
        _body(request, set())  # no fields: an unknown one is refused, not ignored
        return Response(_job(services.retry(queue, _job_id(queue, job_id)), request, self))


class JobCancelView(FqAPIView):
    """Cancel a job (``manage``)."""

    capabilities = {"POST": (MANAGE,)}

    @_doc(
        operation_id="job_cancel",
        summary="Cancel a scheduled, ready, running or dead job (a running job's receipt stops working)",
        parameters=[_QUEUE_PARAM, _JOB_PARAM],
        request=None,
        responses={200: s.JobSerializer, **_errors(*_COMMON, 404, 409, 415)},
        tags=["jobs"],
    )
    def post(self, request, queue, job_id):
        _body(request, set())  # no fields: an unknown one is refused, not ignored
        return Response(_job(services.cancel(queue, _job_id(queue, job_id)), request, self))


class JobWorkflowView(FqAPIView):
    """The workflow of a job: the jobs connected to it by dependencies (``manage``)."""

    capabilities = {"GET": (MANAGE,)}

    @_doc(
        operation_id="job_workflow",
        summary="The jobs connected to a job by dependencies, each way, in dependency order (at most 10,000)",
        parameters=[_QUEUE_PARAM, _JOB_PARAM],
        responses={200: s.WorkflowSerializer, **_errors(*_COMMON, 404)},
        tags=["jobs"],
    )
    def get(self, request, queue, job_id):
        info = workflows.show(queue, _job_id(queue, job_id))
        # Only the jobs of queues this user may manage (a permission class may limit them).
        allowed = _managed(request, self, {step["queue"] for step in info.steps})
        shown = [step for step in info.steps if step["queue"] in allowed]
        ids = {step["id"] for step in shown}
        steps = [{**step, "depends_on": [u for u in step["depends_on"] if u in ids]} for step in shown]
        return Response({"id": info.id, "steps": steps, "truncated": info.truncated})


class JobWorkflowCancelView(FqAPIView):
    """Cancel every unfinished job of a job's workflow (``manage`` on each queue it touches)."""

    capabilities = {"POST": (MANAGE,)}

    @_doc(
        operation_id="job_workflow_cancel",
        summary="Cancel every job of a job's workflow that has not finished, in one transaction",
        parameters=[_QUEUE_PARAM, _JOB_PARAM],
        request=None,
        responses={200: s.WorkflowCancelledSerializer, **_errors(*_COMMON, 404, 415)},
        tags=["jobs"],
    )
    def post(self, request, queue, job_id):
        _body(request, set())
        job_id = _job_id(queue, job_id)
        # Judged on the steps the cancel reads in its own transaction: a job of a queue the user
        # may not manage that joined the workflow after an earlier look is refused too.
        done = workflows.cancel(queue, job_id, manageable=lambda queues: _managed(request, self, queues))
        return Response(asdict(done))


class JobUpstreamView(FqAPIView):
    """The results of a job's dependencies (``consume`` or ``manage``)."""

    capabilities = {"GET": (CONSUME, MANAGE)}

    @_doc(
        operation_id="job_upstream",
        summary="The results of the jobs a job depends on (at most 32 MiB together)",
        description=(
            "Only the dependencies in queues the user may consume or manage are listed (and counted). "
            "413 results_too_large when their results pass 32 MiB together (size and limit in bytes)."
        ),
        parameters=[_QUEUE_PARAM, _JOB_PARAM],
        responses={200: s.UpstreamSerializer, **_errors(*_COMMON, 404, 413)},
        tags=["jobs"],
    )
    def get(self, request, queue, job_id):
        job_id = _job_id(queue, job_id)
        wanted = upstream.upstream_queues(queue, job_id)
        allowed = {q for q in wanted if holds(request, self, CONSUME, q) or holds(request, self, MANAGE, q)}
        found = upstream.results(queue, job_id, queues=None if allowed == wanted else allowed)
        return Response({"id": job_id, "upstream": found.as_list()})


class WorkflowCreateView(FqAPIView):
    """Create a whole workflow: every step enqueued in one transaction, or none (``produce`` on each step's queue)."""

    capabilities = {"POST": (PRODUCE,)}
    #: The field a refusal for too many JSON values names.
    values_field = "steps"

    def max_body_bytes(self) -> int:
        return conf.max_bulk_body_bytes()

    @_doc(
        operation_id="workflow_create",
        summary="Enqueue a graph of steps (any queues) in one transaction, all or nothing; returns the ids",
        description=(
            "Each error names the step and field (steps[NAME].after[0], steps[NAME].options.priority, "
            "groups[G][1], chains[0][2]), and nothing is written. The user needs produce on every step's queue "
            "(403 naming the first step refused); a queue that does not exist is created only for users the "
            "enqueue would let create it (FQ_API_CREATE_QUEUES)."
        ),
        request=s.WorkflowCreateSerializer,
        responses={201: s.WorkflowCreatedSerializer, **_errors(*_COMMON, 404, 409, 413, 415, 429)},
        tags=["workflows"],
    )
    def post(self, request):
        body = _body(request, workflows.SPEC_KEYS, required=("steps",))
        wf = workflows.from_spec(body)  # every shape error first, naming the step
        queues = sorted({step.queue for step in wf.steps()})
        for step in wf.steps():
            if not holds(request, self, PRODUCE, step.queue):
                # DRF's PermissionDenied: its message (naming the step) reaches the body, as a 403.
                raise DrfPermissionDenied(f"step {step.name!r}: you may not enqueue into queue {step.queue}")
        _after_rule(request, self, wf)
        capability = conf.create_queues()
        creatable = [q for q in queues if holds(request, self, capability, q)]
        try:
            ids = wf.enqueue(create_queues=creatable)
        except QueueNotFound as exc:
            if exc.field and exc.field.endswith(".queue"):
                exc.message += (
                    f"; an enqueue creates a queue only for users with {PERMISSION_OF[capability]} (FQ_API_CREATE_QUEUES)"
                )
                exc.args = (exc.message,)
            raise
        return Response({"ids": ids}, status=status.HTTP_201_CREATED)


def _after_rule(request, view, wf: workflows.Workflow) -> None:
    """An ``after`` naming a job id of another queue needs ``produce`` there too (as ``depends_on`` does).

    Refused as a job that is not there (no oracle of other queues' ids),
    naming the step, before anything is written.
    """
    wanted = wf.external_dependencies()
    if not wanted:
        return
    owners = dependencies.queues_of([uid for _, uid in wanted])
    allowed: dict[str, bool] = {}
    for step, uid in wanted:
        other = owners.get(uid)
        if other is None:
            continue  # the enqueue reports it missing, naming the step
        if other not in allowed:
            allowed[other] = holds(request, view, PRODUCE, other)
        if not allowed[other]:
            raise InvalidDependency(f"step {step!r}: no job {uid} in this database", field=f"steps[{step}].after")


def _managed(request, view, queues: set[str]) -> set[str]:
    """Those of ``queues`` the user of ``request`` may manage."""
    return {q for q in queues if holds(request, view, MANAGE, q)}


class JobWaitView(FqAPIView):
    """Wait for a job to finish, up to 20 s (``produce`` or ``manage``).

    A user who may manage the queue gets the whole job; a producer gets its
    outcome only (id, queue, state, result): never the payload, the error
    texts or the workers, which are behind ``manage`` as on the job's page.
    """

    capabilities = {"GET": (PRODUCE, MANAGE), "POST": (PRODUCE, MANAGE)}

    @_doc(
        operation_id="job_wait_get",
        summary="Wait up to timeout_ms (at most 20000) for a job to succeed, die or be cancelled",
        description=_WAIT_TEXT,
        parameters=[
            _QUEUE_PARAM,
            _JOB_PARAM,
            OpenApiParameter(
                "timeout_ms", {"type": "integer", "minimum": 0, "maximum": 20000}, description="default 20000"
            ),
        ],
        responses={200: _WAIT_ANSWER, **_errors(*_COMMON, 404, 408)},
        tags=["jobs"],
    )
    def get(self, request, queue, job_id):
        timeout = _query_int(request, "timeout_ms", DEFAULT_WAIT_MS)
        return self._answer(request, queue, longpoll.wait(queue, _job_id(queue, job_id), timeout_ms=timeout))

    @_doc(
        operation_id="job_wait",
        summary="Wait up to timeout_ms (at most 20000) for a job to succeed, die or be cancelled",
        description=_WAIT_TEXT,
        parameters=[_QUEUE_PARAM, _JOB_PARAM],
        request=s.WaitSerializer,
        responses={200: _WAIT_ANSWER, **_errors(*_COMMON, 404, 408, 413, 415)},
        tags=["jobs"],
    )
    def post(self, request, queue, job_id):
        body = _body(request, {"timeout_ms"})
        timeout = _given(body, "timeout_ms", DEFAULT_WAIT_MS)
        return self._answer(request, queue, longpoll.wait(queue, _job_id(queue, job_id), timeout_ms=timeout))

    def _answer(self, request, queue: str, info) -> Response:
        if holds(request, self, MANAGE, queue):
            return Response(_job(info, request, self))
        return Response(_outcome(info))


# --- leases --------------------------------------------------------------------------------------------


class ClaimView(FqAPIView):
    """Claim jobs under leases, optionally long-polling up to 20 s (``consume``)."""

    capabilities = {"POST": (CONSUME,)}

    @_doc(
        operation_id="claim",
        summary="Take up to count eligible jobs under new leases; wait_ms (<= 20000) long-polls",
        parameters=[_QUEUE_PARAM],
        request=s.ClaimSerializer,
        responses={200: s.ClaimedJobSerializer(many=True), **_errors(*_COMMON, 404, 413, 415)},
        tags=["leases"],
    )
    @sensitive_variables()  # error reports must not show receipts (see the module docstring)
    def post(self, request, queue):
        body = _body(request, {"count", "visibility_ms", "wait_ms", "worker"})
        jobs = longpoll.claim(
            queue,
            count=_given(body, "count", 1),
            visibility_ms=body.get("visibility_ms"),
            wait_ms=_given(body, "wait_ms", 0),
            worker=_worker(request, body),
        )
        response = Response([_claimed(j) for j in jobs])
        if jobs.rate_wait_ms:  # the queue's rate limit stopped this claim short of count
            response["Fq-Rate-Wait-Ms"] = str(jobs.rate_wait_ms)
            response["Fq-Rate-Limited-Until"] = str(jobs.rate_limited_until)
        return response


class AckView(FqAPIView):
    """Settle a lease as succeeded (``consume``)."""

    capabilities = {"POST": (CONSUME,)}

    @_doc(
        operation_id="ack",
        summary="The job of a receipt succeeded; store its result",
        parameters=[_QUEUE_PARAM],
        request=s.AckSerializer,
        responses={200: s.SettleSerializer, **_errors(*_COMMON, 404, 409, 413, 415)},
        tags=["leases"],
    )
    @sensitive_variables()  # error reports must not show receipts (see the module docstring)
    def post(self, request, queue):
        body = _body(request, {"receipt", "result"}, required=("receipt",))
        return Response(_settled(services.ack(queue, body["receipt"], result=body.get("result"))))


class NackView(FqAPIView):
    """Settle a lease as failed (``consume``)."""

    capabilities = {"POST": (CONSUME,)}

    @_doc(
        operation_id="nack",
        summary="An attempt failed: retry after delay_ms or the backoff, or dead when out of attempts",
        parameters=[_QUEUE_PARAM],
        request=s.NackSerializer,
        responses={200: s.SettleSerializer, **_errors(*_COMMON, 404, 409, 413, 415)},
        tags=["leases"],
    )
    @sensitive_variables()  # error reports must not show receipts (see the module docstring)
    def post(self, request, queue):
        body = _body(request, {"receipt", "delay_ms", "error", "permanent"}, required=("receipt",))
        permanent = _given(body, "permanent", False)
        if not isinstance(permanent, bool):
            raise InvalidArgument("permanent must be true or false", field="permanent")
        result = services.nack(
            queue, body["receipt"], delay_ms=body.get("delay_ms"), error=body.get("error"), permanent=permanent
        )
        return Response(_settled(result))


class ReleaseView(FqAPIView):
    """Give a leased job back without counting the attempt (``consume``)."""

    capabilities = {"POST": (CONSUME,)}

    @_doc(
        operation_id="release",
        summary="Give a job back, the attempt not counted: ready again now, or after delay_ms (a snooze)",
        parameters=[_QUEUE_PARAM],
        request=s.ReleaseSerializer,
        responses={200: s.SettleSerializer, **_errors(*_COMMON, 404, 409, 413, 415)},
        tags=["leases"],
    )
    @sensitive_variables()  # error reports must not show receipts (see the module docstring)
    def post(self, request, queue):
        body = _body(request, {"receipt", "error", "delay_ms"}, required=("receipt",))
        result = services.release(queue, body["receipt"], error=body.get("error"), delay_ms=body.get("delay_ms"))
        return Response(_settled(result))


class ExtendView(FqAPIView):
    """Extend a lease (``consume``)."""

    capabilities = {"POST": (CONSUME,)}

    @_doc(
        operation_id="extend",
        summary="Move a lease's deadline to now + visibility_ms",
        parameters=[_QUEUE_PARAM],
        request=s.ExtendSerializer,
        responses={200: s.DeadlineSerializer, **_errors(*_COMMON, 404, 409, 413, 415)},
        tags=["leases"],
    )
    @sensitive_variables()  # error reports must not show receipts (see the module docstring)
    def post(self, request, queue):
        body = _body(request, {"receipt", "visibility_ms"}, required=("receipt", "visibility_ms"))
        deadline = services.extend(queue, body["receipt"], visibility_ms=body["visibility_ms"])
        return Response({"deadline": deadline})


# --- batches (django_fq.batches) -------------------------------------------------------------
# Every batch endpoint names the batch's queue in its path and looks the batch up in that queue
# only: a batch of another queue answers 404 batch_not_found, so the permissions on the path's
# queue (which a permission class may limit per queue) are the permissions on the batch.


def _batch_id(batch_id: str) -> str:
    if "\x00" in batch_id:  # as for job ids: no stored id holds NUL
        raise batches._not_found(batch_id, None)
    return batch_id


class BatchesView(FqAPIView):
    """A queue's batches: list them (``manage``) or create one (``produce``)."""

    capabilities = {"GET": (MANAGE,), "POST": (PRODUCE,)}

    @_doc(
        operation_id="batch_list",
        summary="A queue's batches, newest first",
        parameters=[
            _QUEUE_PARAM,
            OpenApiParameter("state", str, enum=list(batches.STATES), description="only batches in this state"),
            OpenApiParameter("count", {"type": "integer", "minimum": 1, "maximum": 1000}, description="default 20"),
            OpenApiParameter("after", str, description="the last batch id of the previous page"),
        ],
        responses={200: s.BatchSerializer(many=True), **_errors(*_COMMON, 404)},
        tags=["batches"],
    )
    def get(self, request, queue):
        params = request.query_params
        found = batches.list_batches(
            queue, state=params.get("state") or None, limit=_query_int(request, "count", 20), after=params.get("after") or None
        )
        return Response([b.as_dict() for b in found])

    @_doc(
        operation_id="batch_create",
        summary="Create an open batch, with the callback to enqueue once it is sealed and every member finished",
        parameters=[_QUEUE_PARAM],
        request=s.BatchCreateSerializer,
        responses={201: s.BatchSerializer, **_errors(*_COMMON, 404, 409, 413, 415)},
        tags=["batches"],
    )
    def post(self, request, queue):
        body = _body(request, {"callback"})
        callback = body.get("callback")
        if isinstance(callback, dict):
            other = callback.get("queue")
            # The callback is an enqueue into its queue: produce there too (refused as a 403 naming it).
            if isinstance(other, str) and other and other != queue and not holds(request, self, PRODUCE, other):
                raise DjangoPermissionDenied(f"the callback's queue {other} is not one you may enqueue into (callback.queue)")
        with _creation_rule(request, self, queue) as create:
            info = batches.create(queue, callback=callback, create_queue=create)
        return Response(info.as_dict(), status=status.HTTP_201_CREATED, headers={"Location": f"{request.path.rstrip('/')}/{info.id}/"})


class BatchDetailView(FqAPIView):
    """One batch: state, counts, progress, callback (``produce`` or ``manage``)."""

    capabilities = {"GET": (PRODUCE, MANAGE)}

    @_doc(
        operation_id="batch_get",
        summary="A batch's state, counts (succeeded, dead, cancelled, total), progress and callback job",
        parameters=[_QUEUE_PARAM, _BATCH_PARAM],
        responses={200: s.BatchSerializer, **_errors(*_COMMON, 404)},
        tags=["batches"],
    )
    def get(self, request, queue, batch_id):
        return Response(batches.get(_batch_id(batch_id), queue=queue).as_dict())


class BatchMembersView(FqAPIView):
    """A batch's members (``manage``) or more of them (``produce``)."""

    capabilities = {"GET": (MANAGE,), "POST": (PRODUCE,)}
    values_field = "jobs"

    def max_body_bytes(self) -> int:
        return conf.max_bulk_body_bytes()

    @_doc(
        operation_id="batch_members",
        summary="A batch's members in enqueue order, with their states",
        parameters=[
            _QUEUE_PARAM,
            _BATCH_PARAM,
            OpenApiParameter("state", str, enum=list(STATE_NAMES), description="only members in this state"),
            OpenApiParameter("count", {"type": "integer", "minimum": 1, "maximum": 1000}, description="default 100"),
            OpenApiParameter("after", str, description="the last member id of the previous page"),
        ],
        responses={200: s.BatchMemberSerializer(many=True), **_errors(*_COMMON, 404)},
        tags=["batches"],
    )
    def get(self, request, queue, batch_id):
        params = request.query_params
        rows = batches.members(
            _batch_id(batch_id), queue=queue, state=params.get("state") or None,
            limit=_query_int(request, "count", 100), after=params.get("after") or None,
        )  # fmt: skip
        return Response(rows)

    @_doc(
        operation_id="batch_add",
        summary="Enqueue jobs as members of an open batch, all or nothing (any number of calls until it is sealed)",
        parameters=[_QUEUE_PARAM, _BATCH_PARAM],
        request=s.BulkEnqueueSerializer,
        responses={
            201: s.EnqueuedSerializer(many=True),
            200: OpenApiResponse(s.EnqueuedSerializer(many=True), description="every envelope was a duplicate"),
            **_errors(*_COMMON, 404, 409, 413, 415, 429),
        },
        tags=["batches"],
    )
    def post(self, request, queue, batch_id):
        body = _body(request, {"jobs"}, required=("jobs",))
        raw = body["jobs"]
        if not isinstance(raw, list):
            raise InvalidArgument("jobs must be a list of envelopes", field="jobs")
        limit = conf.max_bulk_jobs()
        if len(raw) > limit:
            raise CountOutOfRange(f"at most {limit} jobs per bulk enqueue (FQ_API_MAX_BULK_JOBS)", field="jobs")
        items = []
        for i, env in enumerate(raw):
            if not isinstance(env, dict):
                raise InvalidArgument(f"jobs[{i}] must be a JSON object", field=f"jobs[{i}]")
            items.append(_envelope(env, f"jobs[{i}]."))
        _dependency_rule(request, self, queue, [(f"jobs[{i}].", env) for i, env in enumerate(items)])
        try:
            results = batches.add(_batch_id(batch_id), items, queue=queue)
        except FqError as exc:
            _rename_items(exc)
            raise
        code = status.HTTP_201_CREATED if any(r.created for r in results) else status.HTTP_200_OK
        return Response([_enqueued(r) for r in results], status=code)


class BatchSealView(FqAPIView):
    """Seal a batch: no more members; the callback fires once every member finished (``produce``)."""

    capabilities = {"POST": (PRODUCE,)}

    @_doc(
        operation_id="batch_seal",
        summary="Seal a batch (again: no change); the callback is enqueued now if every member has finished",
        parameters=[_QUEUE_PARAM, _BATCH_PARAM],
        request=None,
        responses={200: s.BatchSerializer, **_errors(*_COMMON, 404, 409, 415)},
        tags=["batches"],
    )
    def post(self, request, queue, batch_id):
        _body(request, set())
        return Response(batches.seal(_batch_id(batch_id), queue=queue).as_dict())


class BatchCancelView(FqAPIView):
    """Cancel a batch and its unfinished members; no callback (``manage``)."""

    capabilities = {"POST": (MANAGE,)}

    @_doc(
        operation_id="batch_cancel",
        summary="Cancel a batch (its callback is never enqueued) and every member that has not finished",
        parameters=[_QUEUE_PARAM, _BATCH_PARAM],
        request=None,
        responses={200: s.BatchSerializer, **_errors(*_COMMON, 404, 409, 415)},
        tags=["batches"],
    )
    def post(self, request, queue, batch_id):
        _body(request, set())
        return Response(batches.cancel(_batch_id(batch_id), queue=queue).as_dict())


# --- workers ------------------------------------------------------------------------------------


class WorkersView(FqAPIView):
    """The worker processes of the registry, live and gone (``manage``, as the queue list)."""

    capabilities = {"GET": (MANAGE,)}
    #: The query parameters this endpoint reads; any other is refused by name.
    params = ("state", "queue")

    @_doc(
        operation_id="workers_list",
        summary="The worker processes: host, pid, queues, concurrency, jobs running, heartbeat, version; gone ones marked",
        parameters=[
            OpenApiParameter("state", str, enum=["live", "gone"], description="only workers in this state"),
            OpenApiParameter("queue", str, description="only workers serving this queue"),
        ],
        responses={200: s.WorkerSerializer(many=True), **_errors(400, 401, 403, 503)},
        tags=["workers"],
    )
    def get(self, request):
        params = request.query_params
        unknown = sorted(set(params) - {*self.params, "format"})  # format: DRF's own (?format=json)
        if unknown:
            raise InvalidArgument(
                f"unknown query parameter {unknown[0][:50]!r}: use {' or '.join(self.params)}", field=unknown[0][:50]
            )
        state, queue = params.get("state"), params.get("queue")
        rows = services.workers(state=state or None, queue=queue or None)
        return Response([asdict(w) for w in rows])
