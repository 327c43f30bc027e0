"""What a new user read in the README and the docs must be what the product does.

* The README lists as many demo steps as ``scripts/demo.sh`` prints, and the
  demo runs what it shows (no ``--json`` piped into a reformatter behind a
  ``$ …`` line that does not mention it).
* ``fq requeue`` is documented in the CLI and Python references, including
  what it does to a ready job (left as it is) — checked against the code.
* The CLI reference tells the truth about the ``fq jobs`` table: bare epoch ms.
* The REST docs say that ``curl -u`` with bad credentials gets 403 under DRF's
  default authentication classes — checked against the API.
"""

from __future__ import annotations

import base64
import re
from pathlib import Path

import pytest

from django_fq import services as fq
from tests.test_cli import fq as run_fq

ROOT = Path(__file__).resolve().parent.parent


def _text(path: str) -> str:
    return (ROOT / path).read_text(encoding="utf-8")


def _prose(path: str) -> str:
    """The file's text with every run of white space made one space (lines wrap anywhere)."""
    return " ".join(_text(path).split())


def test_the_readme_lists_the_demos_steps():
    demo = _text("scripts/demo.sh")
    steps = re.findall(r"^step \"", demo, flags=re.M)
    assert not re.findall(r"^[ \t]+step \"", demo, flags=re.M), "a step inside a branch would count twice"
    readme = _text("README.md")
    section = readme[readme.index("**`make demo`**") : readme.index("**`make test`**")]
    numbered = re.findall(r"^(\d+)\. ", section, flags=re.M)

    assert numbered == [str(i) for i in range(1, len(steps) + 1)]
    assert f"in {len(steps)} numbered steps" in " ".join(section.split())


def test_the_demo_shows_the_commands_it_runs():
    demo = _text("scripts/demo.sh")
    # No manage.py output is piped into an inline reformatter: what is shown is what the command printed.
    assert not re.search(r'manage\.py fq [^\n]*\| *"\$PY" -c', demo)
    for shown in re.findall(r'^show "python manage\.py ([^"]*)"$', demo, flags=re.M):
        ran = shown.replace("python manage.py", '"$PY" manage.py')
        ran = re.sub(r"\$job_id", '"$job_id"', ran)
        assert f'"$PY" manage.py {ran}' in demo, shown


@pytest.mark.parametrize("doc", ["docs/reference/cli.md", "docs/reference/python-api.md"])
def test_requeue_is_documented_with_what_it_does_to_a_ready_job(doc):
    assert re.search(r"^### `(fq )?requeue", _text(doc), flags=re.M)
    text = _prose(doc)
    assert "already ready is left as it is" in text or "already `ready` is left as it is" in text


@pytest.mark.django_db
def test_requeue_leaves_a_ready_job_as_it_is():
    made = fq.enqueue("docs:requeue", {"n": 1})
    before = fq.get("docs:requeue", made.id)

    after = fq.requeue("docs:requeue", made.id)

    assert after == before


@pytest.mark.django_db
def test_the_cli_reference_describes_the_jobs_table_as_it_is():
    fq.enqueue("docs:table", {"n": 1})
    table = run_fq("jobs", "docs:table").out.splitlines()
    run_at = table[1].split()[4]

    assert table[0].split()[4] == "RUN_AT" and run_at.isdigit()  # bare epoch ms
    assert "the table of `fq jobs` shows bare epoch milliseconds" in _prose("docs/reference/cli.md")


@pytest.mark.django_db
def test_curl_u_with_a_wrong_password_gets_403_as_the_rest_docs_say(client, settings):
    from django.contrib.auth.models import User

    settings.ROOT_URLCONF = "tests.api.urls"
    User.objects.create_superuser("ada", "ada@example.com", "right")
    wrong = "Basic " + base64.b64encode(b"ada:wrong").decode()

    bad = client.get("/api/fq/queues/", HTTP_AUTHORIZATION=wrong)
    missing = client.get("/api/fq/queues/")

    assert (bad.status_code, bad.json()["code"]) == (403, "authentication_failed")
    assert (missing.status_code, missing.json()["code"]) == (403, "not_authenticated")
    text = _prose("docs/rest-api.md")
    auth = text[text.index("## Authentication and permissions") : text.index("## Endpoints")]
    assert "wrong password gets 403, not 401" in auth


@pytest.fixture
def team_queues_from_the_docs(settings):
    """The per-queue permission example of docs/rest-api.md, copied verbatim, importable by its dotted path."""
    import sys
    import types

    text = _text("docs/rest-api.md")
    [block] = [b for b in re.findall(r"```python\n(.*?)```", text, flags=re.S) if "class TeamQueues" in b]
    module = types.ModuleType("tests._docs_fq_permissions")
    exec(compile(block, "docs/rest-api.md", "exec"), module.__dict__)  # the doc's own code, verbatim
    sys.modules[module.__name__] = module
    settings.ROOT_URLCONF = "tests.api.urls"
    settings.FQ_API_PERMISSION_CLASSES = [f"{module.__name__}.TeamQueues"]
    assert module.FQ_API_PERMISSION_CLASSES == ["myproject.fq_permissions.TeamQueues"]  # the doc's settings line
    yield module
    del sys.modules[module.__name__]


@pytest.mark.django_db
def test_the_per_queue_permission_example_limits_a_user_to_its_teams_queues(team_queues_from_the_docs):
    from django.contrib.auth.models import Group

    from tests.api.conftest import Client, make_user, url

    for name in ("alpha:mail", "alpha:sms", "beta:mail"):
        fq.enqueue(name, {"for": name})
    user = make_user("produce", "manage")
    user.groups.add(Group.objects.create(name="alpha"))
    client = Client()
    client.force_authenticate(user)

    listed = client.get(url("queues"))
    assert listed.status_code == 200
    assert [q["name"] for q in listed.json()] == ["alpha:mail", "alpha:sms"]  # beta's queue and counts stay hidden
    assert client.get(url("stats", "alpha:mail")).status_code == 200
    for r in (client.get(url("stats", "beta:mail")), client.post(url("jobs", "beta:mail"), {"payload": 1})):
        assert (r.status_code, r.json()["code"]) == (403, "permission_denied")
        message = r.json()["message"]
        # The refusal says what is missing (this queue), not "requires django_fq.manage", which the user holds.
        assert "does not extend to the queue beta:mail" in message and "requires" not in message
    # A user without the Django permission is told which one it lacks.
    plain = Client()
    plain.force_authenticate(make_user())
    r = plain.get(url("stats", "alpha:mail"))
    assert "requires the permission django_fq.manage" in r.json()["message"]
