"""The tests of this package need ``tests.settings_multi_dbs`` (``FQ_QUEUE_DATABASES``, three databases).

Under any other settings they are not collected: ``tests/test_queues_over_databases.py``
runs them in a pytest child with those settings, on the same database engine.
"""

from django.conf import settings

collect_ignore_glob = [] if getattr(settings, "FQ_QUEUE_DATABASES", None) else ["test_*.py"]
