"""The fixtures of django-fq's pytest plugin, for these tests.

The shared venvs install django-fq from another checkout, so the plugin's
``pytest11`` entry point may not be active here: importing the fixtures
into this conftest makes them available whichever way pytest was started
(test_plugin.py loads the plugin itself, by ``-p``, in an inner pytest).
"""

from django_fq.testing.pytest_plugin import fq_assert_enqueued, fq_drain, fq_inline, fq_worker  # noqa: F401
