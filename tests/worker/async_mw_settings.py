"""Worker child settings of the async middleware test: a middleware with a sync and an async form around every handler."""

from tests.worker_settings import *  # noqa: F403

FQ_HANDLER_MIDDLEWARE = ["tests.middleware.mw.both", "tests.worker.async_mw.retry_on_value_error_async"]
