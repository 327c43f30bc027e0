"""``django_fq.routing``: the mapping of ``FQ_QUEUE_DATABASES`` and the current alias, without a database.

The verbs on three real databases are in ``tests/multi_dbs/`` (docs/how-to/queues-over-databases.md).
"""

from __future__ import annotations

import threading

import pytest
from django.test import override_settings

from django_fq import conf, routing
from django_fq.checks import check_settings


def test_without_the_setting_every_queue_is_on_fq_database_and_no_context_is_set():
    assert not routing.enabled()
    assert routing.alias_for("anything") == conf.database() == "default"
    assert routing.aliases() == ["default"]
    seen = []

    @routing.by_queue
    def verb(queue):
        seen.append(routing.current())
        return queue

    assert verb("q") == "q" and seen == [None]  # called as it is: single-database sites pay nothing more
    routing.check_transaction("q")  # a no-op


@override_settings(FQ_DATABASE="main", FQ_QUEUE_DATABASES={"emails": "mail", "eu:*": "eu", "*:big": "big"})
def test_exact_names_and_patterns_first_match_wins_else_fq_database():
    assert routing.alias_for("emails") == "mail"
    assert routing.alias_for("eu:invoices") == "eu"
    assert routing.alias_for("eu:big") == "eu"  # "eu:*" comes before "*:big"
    assert routing.alias_for("us:big") == "big"
    assert routing.alias_for("EU:x") == "main"  # case-sensitive, like queue names
    assert routing.alias_for("emails2") == "main"
    assert routing.alias_for(42) == "main"  # not a name: the verb's own validation refuses it
    assert routing.aliases() == ["main", "mail", "eu", "big"]
    assert routing.group_by_alias(["us:big", "x", "emails", "y"]) == {
        "main": ["x", "y"],
        "mail": ["emails"],
        "big": ["us:big"],
    }


def test_a_list_of_pairs_keeps_its_order_and_a_change_of_setting_is_seen_at_once():
    with override_settings(FQ_QUEUE_DATABASES=[("a:*", "one"), ("a:b", "two")]):
        assert routing.alias_for("a:b") == "one"
    with override_settings(FQ_QUEUE_DATABASES=[("a:b", "two"), ("a:*", "one")]):
        assert routing.alias_for("a:b") == "two"
    assert routing.alias_for("a:b") == "default"


@override_settings(FQ_QUEUE_DATABASES={"two:*": "second"})
def test_by_queue_sets_the_alias_for_the_call_only_and_using_overrides_it():
    @routing.by_queue
    def verb(queue, *, inner=None):
        return (conf.database(), inner() if inner else None)

    assert verb("two:x") == ("second", None)
    assert verb(queue="plain") == ("default", None)
    assert conf.database() == "default"  # reset after the call
    assert verb("two:x", inner=lambda: verb("plain")) == ("second", ("second", None))  # nested: stays
    with routing.using("default"):
        assert verb("two:x") == ("default", None)  # an enclosing using() chose the database
    with pytest.raises(ZeroDivisionError):
        routing.by_queue(lambda queue: 1 / 0)("two:x")
    assert routing.current() is None


@override_settings(FQ_QUEUE_DATABASES={"two:*": "second"})
def test_every_alias_runs_once_per_alias_and_combines():
    @routing.every_alias(lambda answers: answers)
    def visit(queue=None):
        return conf.database()

    assert visit() == [("default", "default"), ("second", "second")]
    assert visit("two:q") == "second"  # with a queue: that queue's alias only
    with routing.using("second"):
        assert visit() == "second"


@override_settings(FQ_QUEUE_DATABASES={"two:*": "second"})
def test_each_thread_has_its_own_alias():
    seen = {}
    inside, release = threading.Event(), threading.Event()

    def other():
        seen["other"] = conf.database()
        inside.set()
        release.wait(10)

    with routing.using("second"):
        t = threading.Thread(target=other)
        t.start()
        inside.wait(10)
        seen["here"] = conf.database()
        release.set()
        t.join(10)
    assert seen == {"other": "default", "here": "second"}


def test_checks_refuse_a_malformed_setting_and_an_unknown_alias(settings):
    settings.FQ_QUEUE_DATABASES = [("only-a-pattern",)]
    assert [e.id for e in check_settings()] == ["django_fq.E050"]
    settings.FQ_QUEUE_DATABASES = {"a:*": "nowhere"}
    (err,) = [e for e in check_settings() if e.id.startswith("django_fq.E05")]
    assert "'nowhere'" in err.msg and "not in DATABASES" in err.msg
    settings.FQ_QUEUE_DATABASES = {"*": "default", "a:*": "default", "with space": "default"}
    warned = [e.msg for e in check_settings() if e.id == "django_fq.W050"]
    assert len(warned) == 2 and any("'*'" in m for m in warned) and any("' '" in m for m in warned)
