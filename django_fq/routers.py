"""A database router that keeps django-fq's tables on the ``FQ_DATABASE`` alias.

Add it when the queue lives on another database than ``default``::

    DATABASES = {"default": {...}, "queue": {...}}
    FQ_DATABASE = "queue"
    DATABASE_ROUTERS = ["django_fq.routers.FqRouter"]

then ``manage.py migrate --database queue`` creates django-fq's tables there
(and ``migrate`` on ``default`` leaves them out). django-fq's own code
already names the alias on every query; the router is for what Django does
on its own with the models: migrations, the admin's related-field filters
and form validation, ``Job.objects`` in a shell or in your code.

With ``FQ_QUEUE_DATABASES`` (queues over several databases) every alias
that may hold queues gets the tables: ``migrate --database ALIAS`` for each
(docs/how-to/queues-over-databases.md).

It only speaks for the ``django_fq`` app and answers ``None`` ("no
opinion") for every other model, so it combines with your own routers in
any order. It reads ``FQ_DATABASE`` on every call, like the rest of
django-fq. See ``docs/how-to/separate-database.md``.
"""

from __future__ import annotations

from . import conf, routing

APP_LABEL = "django_fq"


def _ours(model) -> bool:
    return model._meta.app_label == APP_LABEL


class FqRouter:
    """Route reads, writes and migrations of django-fq's models to ``FQ_DATABASE``.

    With ``FQ_QUEUE_DATABASES``, reads and writes go to the alias of the
    django-fq operation running (``conf.database()``: the queue's, inside a
    verb), and migrations run on every alias that may hold queues.
    """

    def db_for_read(self, model, **hints):
        """``FQ_DATABASE`` for django-fq's models, ``None`` for any other."""
        return conf.database() if _ours(model) else None

    def db_for_write(self, model, **hints):
        """``FQ_DATABASE`` for django-fq's models, ``None`` for any other."""
        return conf.database() if _ours(model) else None

    def allow_relation(self, obj1, obj2, **hints):
        """True between two django-fq objects; ``None`` otherwise (Django's same-database rule applies)."""
        if _ours(obj1) and _ours(obj2):
            return True
        return None

    def allow_migrate(self, db, app_label, model_name=None, **hints):
        """django-fq's migrations run on ``FQ_DATABASE`` and every alias of ``FQ_QUEUE_DATABASES``; ``None`` for other apps."""
        if app_label == APP_LABEL:
            return db in routing.aliases()
        return None
