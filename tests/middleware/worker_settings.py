"""Worker child settings of the middleware tests: the test settings plus middleware and handlers."""

from tests.worker_settings import *  # noqa: F403

FQ_HANDLER_MIDDLEWARE = [
    "tests.middleware.mw.outer",
    "tests.middleware.mw.snooze_first",
    "tests.middleware.mw.retry_on_value_error",
]
FQ_HANDLERS = {
    "t.mw": {"handler": "tests.middleware.handlers.record", "middleware": ["tests.middleware.mw.per_handler"]},
    "t.mw.plain": "tests.middleware.handlers.record",
}
