"""Receipts as capabilities (docs/reference/semantics.md §5, §9): unguessable, stored hashed, compared in constant time, one per lease."""

from __future__ import annotations

import base64
import hashlib
import hmac
import re

import pytest
from django.db import connection

from django_fq import receipts
from django_fq import services as fq
from django_fq.exceptions import InvalidReceipt
from django_fq.models import Job, Lease

from .helpers import fq_table_text, secret_of, sha256_hex

pytestmark = pytest.mark.django_db

Q = "sec:receipts"
RECEIPT = re.compile(r"^fq1\.([0-9a-f]{32})\.([0-9]+)\.([A-Za-z0-9_-]{43})$")


def _claim_all(n: int, **kwargs) -> list:
    for i in range(n):
        fq.enqueue(Q, {"n": i})
    claimed = fq.claim(Q, count=n, **kwargs)
    assert len(claimed) == n
    return claimed


# --- unguessable ----------------------------------------------------------------------------------


def test_every_claim_path_draws_256_bits_from_secrets(monkeypatch):
    """The secret of each receipt is 32 bytes the CSPRNG returned, on both claim paths.

    A claim draws them one by one (``secrets.token_urlsafe(32)``) or, for a
    batch, all at once (``secrets.token_bytes(32 * n)``, cut in 32-byte pieces).
    """
    drawn: list[tuple[int, str]] = []
    real = receipts.secrets.token_urlsafe
    real_bytes = receipts.secrets.token_bytes

    def spy(nbytes=None):
        value = real(nbytes)
        drawn.append((nbytes, value))
        return value

    def spy_bytes(nbytes=None):
        value = real_bytes(nbytes)
        if nbytes % 32:  # not secrets (e.g. token_hex(16) for job ids)
            return value
        for i in range(0, nbytes, 32):
            drawn.append((32, base64.urlsafe_b64encode(value[i : i + 32]).rstrip(b"=").decode()))
        return value

    monkeypatch.setattr(receipts.secrets, "token_urlsafe", spy)
    monkeypatch.setattr(receipts.secrets, "token_bytes", spy_bytes)
    claimed = _claim_all(3)
    fq.configure(Q, concurrency=10)  # PostgreSQL takes another statement when the queue has a limit
    claimed += _claim_all(2)
    assert drawn and all(nbytes == 32 for nbytes, _ in drawn)
    values = {v for _, v in drawn}
    for job in claimed:
        m = RECEIPT.match(job.receipt)
        assert m, job.receipt
        secret = m.group(3)
        assert secret in values  # the secret is the CSPRNG's output, not derived from anything else
        assert len(base64.urlsafe_b64decode(secret + "=")) == 32  # 256 bits


def test_secrets_do_not_repeat_across_claims():
    claimed = _claim_all(200)
    secrets_ = [secret_of(j.receipt) for j in claimed]
    assert len(set(secrets_)) == len(secrets_)
    # No shared structure either: the secrets' first 8 characters are all different.
    assert len({s[:8] for s in secrets_}) == len(secrets_)


# --- stored hashed ----------------------------------------------------------------------------------


def test_only_the_hash_is_stored_never_the_secret():
    """After claims and every kind of settle, no django_fq row holds a receipt or its secret."""
    fq.configure(Q, backoff_ms=0)
    claimed = _claim_all(5)
    fq.ack(Q, claimed[0].receipt, result={"ok": 1})
    fq.nack(Q, claimed[1].receipt, error="failed")
    fq.release(Q, claimed[2].receipt)
    fq.extend(Q, claimed[3].receipt, visibility_ms=60_000)
    fq.cancel(Q, claimed[4].id)
    live = fq.claim(Q, count=2)  # the nacked and released jobs again: live leases
    everything = claimed + live
    text = fq_table_text()
    assert text  # the dump did read the rows
    for job in everything:
        assert job.receipt not in text
        assert secret_of(job.receipt) not in text
    # What is stored is the SHA-256 of the secret: on live leases and on settled jobs.
    stored = set(Lease.objects.values_list("receipt_hash", flat=True))
    stored |= set(Job.objects.exclude(settled_hash=None).values_list("settled_hash", flat=True))
    assert {sha256_hex(secret_of(j.receipt)) for j in live} <= stored
    assert {sha256_hex(secret_of(j.receipt)) for j in claimed[:3] + claimed[4:]} <= stored


# --- constant-time comparison ---------------------------------------------------------------------------


@pytest.fixture
def compare_spy(monkeypatch):
    """Every call of ``hmac.compare_digest`` made through ``django_fq.receipts``."""
    calls: list[tuple[bytes, bytes, bool]] = []
    real = hmac.compare_digest

    def spy(a, b):
        result = real(a, b)
        calls.append((a, b, result))
        return result

    monkeypatch.setattr(receipts.hmac, "compare_digest", spy)
    return calls


@pytest.fixture
def sql_params():
    """Every parameter sent to the database, flattened to strings (through Django's execute wrappers)."""
    sent: list[str] = []

    def flatten(value):
        if isinstance(value, dict):
            for v in value.values():
                flatten(v)
        elif isinstance(value, (list, tuple)):
            for v in value:
                flatten(v)
        else:
            sent.append(str(value))

    def wrapper(execute, sql, params, many, context):
        flatten(params or ())
        return execute(sql, params, many, context)

    with connection.execute_wrapper(wrapper):
        yield sent


@pytest.mark.parametrize("op", ["ack", "nack", "extend", "release"])
def test_every_settle_compares_digests_in_constant_time_never_secrets(compare_spy, sql_params, op):
    """A presented receipt is judged by the SHA-256 digest of its secret, never by the secret itself.

    In Python the digests are compared with ``hmac.compare_digest``. The
    PostgreSQL ack path compares them in its one SQL statement instead
    (``receipt_hash = digest``); what timing could reveal there is how much of
    a *digest* matched, which does not help to find a secret with that digest.
    """
    [job] = _claim_all(1)
    secret = secret_of(job.receipt)
    digest = sha256_hex(secret)
    verbs = {
        "ack": lambda r: fq.ack(Q, r),
        "nack": lambda r: fq.nack(Q, r),
        "extend": lambda r: fq.extend(Q, r, visibility_ms=1000),
        "release": lambda r: fq.release(Q, r),
    }
    wrong = job.receipt[:-1] + ("A" if job.receipt[-1] != "A" else "B")
    with pytest.raises(InvalidReceipt):
        verbs[op](wrong)
    assert compare_spy, "a wrong secret was judged without compare_digest"
    assert all(result is False for _, _, result in compare_spy)
    compare_spy.clear()
    verbs[op](job.receipt)
    in_python = (digest.encode(), digest.encode(), True) in compare_spy
    in_sql = connection.vendor == "postgresql" and op == "ack" and digest in sql_params
    assert in_python or in_sql
    for a, b, _ in compare_spy:
        assert len(a) == len(b) == 64  # digests, whatever was presented
    assert not any(secret in p or job.receipt in p for p in sql_params)


def test_the_comparison_sees_digests_so_a_matching_prefix_of_the_secret_changes_nothing(compare_spy):
    """A guess sharing 0 or 42 of the 43 secret characters makes the very same comparison.

    The presented secret is hashed before it is compared, so the bytes compared
    are two 64-character SHA-256 digests whatever the guess; how many leading
    characters of the secret are right does not carry over to the digests,
    and ``compare_digest`` itself takes time independent of where they differ.
    """
    [job] = _claim_all(1)
    secret = secret_of(job.receipt)
    stored = sha256_hex(secret).encode()
    head = job.receipt[: -len(secret)]
    far = "".join("A" if c != "A" else "B" for c in secret)  # no character right
    near = secret[:-1] + ("A" if secret[-1] != "A" else "B")  # all but the last right
    seen = []
    for guess in (far, near):
        compare_spy.clear()
        with pytest.raises(InvalidReceipt):
            fq.ack(Q, head + guess)
        [(a, b, result)] = [c for c in compare_spy if stored in c[:2]]
        other = b if a == stored else a
        assert other == sha256_hex(guess).encode() and len(other) == 64 and not result
        seen.append((len(a), len(b), sum(x == y for x, y in zip(a, b, strict=True)) < 64))
    assert seen[0] == seen[1]
    fq.ack(Q, job.receipt)


# --- bound to one job and one lease generation ---------------------------------------------------------


def test_a_receipt_is_bound_to_its_generation_even_with_the_number_rewritten():
    """Claim N's secret with claim N+1's generation number does not settle claim N+1, nor the reverse."""
    fq.configure(Q, backoff_ms=0)
    [first] = _claim_all(1)
    fq.release(Q, first.receipt)
    [second] = fq.claim(Q)
    job_id, gen1 = RECEIPT.match(first.receipt).group(1, 2)
    gen2 = RECEIPT.match(second.receipt).group(2)
    assert int(gen2) == int(gen1) + 1
    forged = [
        receipts.compose(job_id, int(gen2), secret_of(first.receipt)),
        receipts.compose(job_id, int(gen1), secret_of(second.receipt)),
    ]
    for receipt in forged:
        for call in (lambda r: fq.ack(Q, r), lambda r: fq.extend(Q, r, visibility_ms=5), lambda r: fq.nack(Q, r)):
            with pytest.raises(InvalidReceipt):
                call(receipt)
    assert fq.get(Q, second.id).state == "running"
    assert fq.ack(Q, second.receipt).state == "succeeded"


def test_a_receipt_is_bound_to_its_job():
    """The secret of one job's lease, presented with another job's id, settles neither."""
    a, b = _claim_all(2)
    job_b, gen_b = RECEIPT.match(b.receipt).group(1, 2)
    with pytest.raises(InvalidReceipt):
        fq.ack(Q, receipts.compose(job_b, int(gen_b), secret_of(a.receipt)))
    assert fq.get(Q, b.id).state == "running" and fq.get(Q, a.id).state == "running"


def test_the_parsed_form_never_shows_the_secret_or_its_hash():
    [job] = _claim_all(1)
    parsed = receipts.parse(job.receipt)
    assert parsed.secret_hash == hashlib.sha256(secret_of(job.receipt).encode()).hexdigest()
    assert secret_of(job.receipt) not in repr(parsed) and parsed.secret_hash not in repr(parsed)
    assert job.receipt not in repr(job) and job.receipt not in str(job)
