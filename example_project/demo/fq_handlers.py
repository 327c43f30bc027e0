"""Job handlers of the demo, found by django-fq's autodiscovery of ``fq_handlers`` modules.

``docs:native``
    ``print_payload`` prints the job's payload to the worker's stdout.
``emails:welcome``
    ``send_welcome_email`` sends one welcome email per user, exactly once per
    user even when the job runs again (see its docstring).
"""

from __future__ import annotations

import json

from django.core.mail import send_mail
from django.db import IntegrityError, transaction

from django_fq import PermanentFailure, handler

from .models import WelcomeEmail


@handler("docs:native")
def print_payload(job):
    """Print the payload as one line of JSON; the returned dict becomes the job's result."""
    print(f"[docs:native] job {job.id}: {json.dumps(job.payload, sort_keys=True)}", flush=True)
    return {"printed": True}


@handler("emails:welcome")
def send_welcome_email(job):
    """Send the welcome email for payload ``{"user_id": N, "email": "..."}`` at most once per user.

    Why this is needed: django-fq's claim is exclusive (no two workers hold a
    live lease on one job at the same time) but execution is at-least-once. A
    worker can be killed after sending and before its ack; the lease then
    expires and another worker runs the same job again. Someone may also
    enqueue a second job for the same user. A handler with a side effect must
    therefore make a repeat harmless.

    How: one transaction that

    1. checks whether a :class:`WelcomeEmail` row for the user exists, and if
       so returns without sending;
    2. inserts that row. ``user_id`` is UNIQUE, so of two concurrent runs only
       one can insert; the other waits for it and gets an ``IntegrityError``
       (or, on SQLite, waits for the write lock and then sees the row in
       step 1), and skips;
    3. sends the email. If sending raises, the transaction rolls back, the row
       disappears, and the job's retry sends again.

    The one window left is a crash after the mail server accepted the message
    and before the commit: the retry sends a second copy. No database can
    close that window for an external side effect; a provider-side
    idempotency key (e.g. ``welcome-<user_id>``) would.
    """
    payload = job.payload
    try:
        user_id = int(payload["user_id"])
        email = str(payload["email"])
    except (KeyError, TypeError, ValueError) as exc:
        # Retrying a malformed payload cannot help: fail the job at once.
        raise PermanentFailure(f"bad welcome payload {payload!r}: {exc}") from exc

    with transaction.atomic():
        if WelcomeEmail.objects.filter(user_id=user_id).exists():
            return {"sent": False, "reason": "already sent", "user_id": user_id}
        try:
            with transaction.atomic():
                WelcomeEmail.objects.create(user_id=user_id, email=email, job_id=str(job.id))
        except IntegrityError:
            return {"sent": False, "reason": "already sent", "user_id": user_id}
        send_mail(
            subject="Welcome!",
            message=f"Hello user {user_id}, welcome aboard.",
            from_email=None,
            recipient_list=[email],
        )
    return {"sent": True, "user_id": user_id}
