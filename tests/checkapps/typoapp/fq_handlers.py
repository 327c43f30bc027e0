"""A handler module with a plain bug at import (a NameError), not an ImportError."""

from django_fq import handler

TIMEOUT = settings.FQ_SOMETHING  # noqa: F821  - NameError


@handler("chk.typo")
def run(job):
    return None
