"""A receipt minted by this process carries its parts (docs/reference/semantics.md §5): settling it skips the re-hash, nothing else.

``receipts.compose`` with the secret's hash returns a :class:`~django_fq.receipts.Receipt`
(a ``str``) whose ``parse`` is the one made at minting. These tests hold it to the plain
text's behaviour: same parts, same outcomes, and the database still judges the secret.
"""

from __future__ import annotations

import json
import pickle

import pytest

from django_fq import receipts
from django_fq import services as fq
from django_fq.exceptions import InvalidReceipt

pytestmark = pytest.mark.django_db


def test_a_minted_receipt_is_its_text_and_parses_as_it():
    secret, digest = receipts.new_secrets(1)[0]
    minted = receipts.compose("ab" * 16, 7, secret, digest)
    plain = receipts.compose("ab" * 16, 7, secret)
    assert type(minted) is receipts.Receipt and type(plain) is str
    assert minted == plain and hash(minted) == hash(plain) and str(minted) == plain
    assert json.dumps({"r": minted}) == json.dumps({"r": plain})
    assert receipts.parse(minted) == receipts.parse(plain) == receipts.ParsedReceipt("ab" * 16, 7, digest)
    assert pickle.loads(pickle.dumps(minted)) == plain
    # new() mints one too, with the hash it returns.
    made, made_hash = receipts.new("cd" * 16, 2)
    assert type(made) is receipts.Receipt and receipts.parse(made) == receipts.parse(str(made))
    assert receipts.parse(made).secret_hash == made_hash


def test_a_text_not_shaped_like_a_receipt_stays_a_plain_str():
    secret, digest = receipts.new_secrets(1)[0]
    for job_id, generation in (("not-hex", 1), ("ab" * 16, 0), ("ab" * 16, True)):
        text = receipts.compose(job_id, generation, secret, digest)
        assert type(text) is str
        assert receipts.parse(text) == receipts.parse(str(text))


def test_a_receipt_made_without_compose_is_parsed_from_its_text():
    secret, _digest = receipts.new_secrets(1)[0]
    text = receipts.compose("ab" * 16, 3, secret)
    assert receipts.parse(receipts.Receipt(text)) == receipts.parse(text)
    assert receipts.parse(receipts.Receipt("fq1.nope")) is None


def test_claimed_receipts_settle_as_their_text_does(q):
    fq.enqueue_many(q, [{"payload": {"n": n}} for n in range(4)])
    jobs = fq.claim(q, count=4)
    assert all(type(j.receipt) is receipts.Receipt for j in jobs)
    assert [receipts.parse(j.receipt) for j in jobs] == [receipts.parse(str(j.receipt)) for j in jobs]
    first = fq.ack_many(q, [(jobs[0].receipt, None), (str(jobs[1].receipt), None)])
    assert [r.state for r in first] == ["succeeded", "succeeded"]
    # A repeat is a replay whichever form it comes in.
    again = fq.ack_many(q, [(str(jobs[0].receipt), None), (jobs[1].receipt, None)])
    assert [r.replay for r in again] == [True, True]
    assert fq.ack(q, jobs[2].receipt).state == "succeeded"
    assert fq.nack(q, str(jobs[3].receipt), error="boom").state == "scheduled"  # retried after its backoff


def test_the_database_still_judges_the_secret_of_a_minted_receipt(q):
    # Parts that do not belong to the text are not trusted into a settle: the hash is
    # the database's check, and a wrong one is refused like a forged receipt.
    fq.enqueue(q, {"n": 1})
    (job,) = fq.claim(q, count=1)
    forged = receipts.Receipt(job.receipt)
    _other_secret, other_hash = receipts.new_secrets(1)[0]
    parsed = receipts.parse(job.receipt)
    forged.parsed = receipts.ParsedReceipt(parsed.job_id, parsed.generation, other_hash)
    (refused,) = fq.ack_many(q, [(forged, None)])
    assert isinstance(refused, InvalidReceipt)
    with pytest.raises(InvalidReceipt):
        fq.ack(q, forged)
    assert fq.ack(q, job.receipt).state == "succeeded"


def test_new_secrets_are_what_token_urlsafe_and_the_hash_make(monkeypatch):
    # The same bytes give the text secrets.token_urlsafe(32) gives, and its SHA-256.
    import base64
    import hashlib
    import os

    raw = os.urandom(32 * 5)
    monkeypatch.setattr(receipts.secrets, "token_bytes", lambda n: raw[:n])
    pairs = receipts.new_secrets(5)
    for k, (secret, digest) in enumerate(pairs):
        expected = base64.urlsafe_b64encode(raw[32 * k : 32 * (k + 1)]).rstrip(b"=").decode("ascii")
        assert secret == expected and len(secret) == 43
        assert digest == hashlib.sha256(expected.encode()).hexdigest()
