"""Receipts: unforgeable capabilities bound to one lease of one job (docs/reference/semantics.md §5).

A receipt reads ``fq1.<job id>.<generation>.<secret>`` where ``secret`` is 256
random bits (``secrets.token_urlsafe(32)``). The database keeps only
``sha256(secret)``; presenting a receipt means re-hashing its secret and
comparing digests with :func:`hmac.compare_digest`. The generation grows with
every claim of the job, so no receipt is ever valid for two leases.
"""

from __future__ import annotations

import binascii
import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass

PREFIX = "fq1"
# Only the exact text claim() hands out: the generation without leading zeros (it
# starts at 1), and nothing after the secret (fullmatch: "$" would let "\n" through).
_SHAPE = re.compile(r"fq1\.([0-9a-f]{32})\.([1-9][0-9]{0,17})\.([A-Za-z0-9_-]{43})")


@dataclass(frozen=True)
class ParsedReceipt:
    """A receipt split into its parts. ``secret_hash`` is the hex SHA-256 of the secret."""

    job_id: str
    generation: int
    secret_hash: str

    def __repr__(self) -> str:
        return f"ParsedReceipt(job_id={self.job_id!r}, generation={self.generation})"


class Receipt(str):
    """A receipt minted in this process: its text, and its parts as :func:`parse` would find them.

    It compares, hashes, prints and serialises as the plain text. A settle parses every
    receipt it is given (a regular expression and a SHA-256 of the secret); for the
    receipts a worker got from its own claim, :func:`parse` returns :attr:`parsed`,
    made when the receipt was minted from the same secret and hash. A receipt that
    came from outside the process is a plain ``str`` and is parsed as before.
    """

    __slots__ = ("parsed",)

    parsed: ParsedReceipt


def new(job_id: str, generation: int) -> tuple[str, str]:
    """Mint a receipt for lease ``generation`` of ``job_id``.

    Returns ``(receipt, secret_hash)``; only the hash is to be stored.
    """
    secret = secrets.token_urlsafe(32)
    secret_hash = _hash(secret)
    return compose(job_id, generation, secret, secret_hash), secret_hash


def new_secret() -> tuple[str, str]:
    """A fresh ``(secret, secret_hash)`` pair, for a claim that learns the job only later."""
    secret = secrets.token_urlsafe(32)
    return secret, _hash(secret)


def new_secrets(n: int) -> list[tuple[str, str]]:
    """``n`` fresh ``(secret, secret_hash)`` pairs, as :func:`new_secret` makes them, drawn at once.

    One read of the operating system's CSPRNG (``secrets.token_bytes``) for
    all of them, 32 bytes (256 bits) each: a claim of up to 1,000 jobs
    prepares a pair per job it may get, and one system call instead of one
    per pair makes that about four times cheaper.
    """
    raw = secrets.token_bytes(_SECRET_BYTES * n)
    out = []
    encode, sha256 = binascii.b2a_base64, hashlib.sha256
    for i in range(0, _SECRET_BYTES * n, _SECRET_BYTES):
        # token_urlsafe's text (URL-safe base64 without its one "="), hashed as bytes: no round trip through str.
        text = encode(raw[i : i + _SECRET_BYTES], newline=False)[:_SECRET_CHARS].translate(_URLSAFE)
        out.append((text.decode("ascii"), sha256(text).hexdigest()))
    return out


_SECRET_BYTES = 32
#: Base64 characters of a 32-byte secret, without padding.
_SECRET_CHARS = 43
_URLSAFE = bytes.maketrans(b"+/", b"-_")


def compose(job_id: str, generation: int, secret: str, secret_hash: str | None = None) -> str:
    """The receipt text of lease ``generation`` of ``job_id`` holding ``secret``.

    With ``secret_hash`` (which must be the hash :func:`new_secrets` paired with
    ``secret``) a well-shaped receipt is returned as a :class:`Receipt` carrying its
    parts, so that settling it later does not hash the secret again.
    """
    text = f"{PREFIX}.{job_id}.{generation}.{secret}"
    if secret_hash is None or generation.__class__ is not int or _SHAPE.fullmatch(text) is None:
        return text
    receipt = Receipt(text)
    receipt.parsed = ParsedReceipt(job_id, generation, secret_hash)
    return receipt


def parse(receipt: object) -> ParsedReceipt | None:
    """Split a presented receipt; ``None`` when it is not shaped like one of ours."""
    if receipt.__class__ is Receipt:
        try:
            return receipt.parsed
        except AttributeError:  # made some other way than compose(): parsed below
            pass
    if not isinstance(receipt, str) or len(receipt) > 128:
        return None
    m = _SHAPE.fullmatch(receipt)
    if not m:
        return None
    return ParsedReceipt(m.group(1), int(m.group(2)), _hash(m.group(3)))


def matches(stored_hash: str | None, presented_hash: str) -> bool:
    """Constant-time comparison of a stored and a presented secret hash."""
    if not stored_hash:
        return False
    return hmac.compare_digest(stored_hash.encode(), presented_hash.encode())


def _hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()
