"""The tests of this package need ``tests.settings_two_dbs`` (``FQ_DATABASE = "queue"``, two databases).

Under any other settings they are not collected: ``tests/test_separate_database.py``
runs them in a pytest child with those settings, on the same database engine.
"""

from django.conf import settings

collect_ignore_glob = [] if getattr(settings, "FQ_DATABASE", "default") == "queue" else ["test_*.py"]
