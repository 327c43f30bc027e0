"""A middleware with a sync and an async form for the async middleware test (``tests.worker.async_mw_settings``)."""

from __future__ import annotations

from django_fq.exceptions import RetryAfter
from tests.middleware.mw import _note, retry_on_value_error


class _RetryOnValueError:
    """``retry_on_value_error`` with an async form too (for async handlers)."""

    def __call__(self, job, call_next):
        return retry_on_value_error(job, call_next)

    async def acall(self, job, call_next):
        try:
            return await call_next(job)
        except ValueError as exc:
            _note(job, "retry:async")
            raise RetryAfter(0, error=f"retrying: {exc}") from exc


retry_on_value_error_async = _RetryOnValueError()
