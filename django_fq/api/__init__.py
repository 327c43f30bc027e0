"""The REST API of django-fq (Django REST framework), mounted by the project::

    # urls.py
    from django.urls import include, path

    urlpatterns = [
        path("api/fq/", include("django_fq.api.urls")),
    ]

Every endpoint mirrors a verb of :mod:`django_fq.services` and the JSON of
``manage.py fq … --json`` (except that ``created`` is ``true``/``false``).
Times are epoch milliseconds, durations milliseconds. Errors are JSON objects
``{"code", "message", "field"}``. Every write sends ``Content-Type:
application/json``, even without a body (else 415). Access needs one of three Django
permissions on :class:`django_fq.models.Queue`: ``django_fq.produce``
(enqueue), ``django_fq.consume`` (claim and settle) and ``django_fq.manage``
(configure, inspect and repair). See ``docs/rest-api.md``.

Settings (all optional, read on every request):

==================================  ===========================================================
``FQ_API_AUTHENTICATION_CLASSES``   DRF authentication classes (dotted paths); default: DRF's
                                    ``DEFAULT_AUTHENTICATION_CLASSES``
``FQ_API_PERMISSION_CLASSES``       DRF permission classes (dotted paths); default:
                                    ``["django_fq.api.permissions.HasQueuePermission"]``
``FQ_API_MAX_BODY_BYTES``           largest request body (Content-Length) of every endpoint
                                    but bulk enqueue; default 3 × ``FQ_MAX_PAYLOAD_BYTES``
                                    + 64 KiB
``FQ_API_MAX_BULK_BODY_BYTES``      largest bulk enqueue body; default 32 MiB (at least the
                                    single-body limit)
``FQ_API_MAX_BULK_JOBS``            most envelopes in one bulk enqueue; default 1000
``FQ_API_LONG_POLL_RECHECK_MS``     PostgreSQL: how often a waiting claim looks again without
                                    a notification (delayed jobs coming due, leases freed by
                                    a concurrency limit); default 1000
``FQ_API_CREATE_QUEUES``            the capability (on that queue) an enqueue needs to create
                                    a queue that does not exist: ``"manage"`` (default) or
                                    ``"produce"``
==================================  ===========================================================
"""
