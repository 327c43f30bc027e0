"""Django Tasks of the demo, run by django-fq (``TASKS`` in ``example_project/settings.py``).

The same ``@task`` code runs on Django 6.x (``django.tasks``) and on Django
5.2 with the backport (``django_tasks``): ``django_fq.tasks.task`` is
whichever ``task`` decorator is installed. Try it::

    python manage.py shell -c "from example_project.demo.tasks import word_count; print(word_count.enqueue('to be or not to be').id)"
    python manage.py fq_worker --burst --queue tasks:default
    python manage.py shell -c "from example_project.demo.tasks import word_count; print(word_count.get_result('<id>').return_value)"

``tally_signups`` shows the options that come from the backend's
``OPTIONS["tasks"]`` (three attempts, one pending job per day) and a task
that reads its ``TaskContext``.
"""

from __future__ import annotations

from collections import Counter

from django.contrib.auth import get_user_model

from django_fq.tasks import task


@task
def word_count(text: str) -> dict:
    """Count the words of ``text``; the returned dict becomes the task's ``return_value``."""
    words = Counter(text.lower().split())
    return {"words": sum(words.values()), "most_common": words.most_common(3)}


@task(takes_context=True, priority=10)
def tally_signups(context, day: str) -> dict:
    """Count the users who joined on ``day`` (``YYYY-MM-DD``).

    Safe to run again (it only reads), which is what at-least-once delivery
    asks of every task. ``context.attempt`` is 1 on the first run and grows
    with each retry.
    """
    joined = get_user_model().objects.filter(date_joined__date=day).count()
    return {"day": day, "joined": joined, "attempt": context.attempt}
