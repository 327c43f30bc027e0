"""Worker child settings whose handler middleware does not import: the worker must refuse to start."""

from tests.middleware.worker_settings import *  # noqa: F403

FQ_HANDLER_MIDDLEWARE = ["tests.middleware.mw.outer", "tests.middleware.mw.no_such_middleware"]
