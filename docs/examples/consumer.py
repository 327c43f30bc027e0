#!/usr/bin/env python3
"""A django-fq consumer that speaks HTTP only: Python's standard library, nothing else.

It long-polls the REST API for jobs, runs :func:`handle` on each payload, and
settles each lease: ``ack`` with the handler's return value, or ``nack`` with
the error when it raises. Any language with an HTTP client can do the same;
this file is the whole protocol.

Usage::

    python consumer.py --url http://localhost:8000/api/fq --queue emails \\
        --user worker --password secret            # HTTP Basic authentication
    python consumer.py --url … --queue emails --token KEY   # "Authorization: Token KEY"

Options may also come from the environment: ``FQ_API_URL``, ``FQ_API_USER``,
``FQ_API_PASSWORD``, ``FQ_API_TOKEN``. The user needs the ``django_fq.consume``
permission. ``--burst`` exits once a claim comes back empty; without it the
consumer runs until interrupted (Ctrl-C), and a job it holds then is released
for another consumer. Each settled job is reported on stdout as one JSON line.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
import time
import urllib.error
import urllib.request


def handle(payload):
    """Do the work of one job; the return value is stored as the job's result.

    Replace this with real work. Raising an exception fails the attempt (the
    job is retried after the queue's backoff, or dies when out of attempts).
    Delivery is at-least-once: make the work idempotent.
    """
    if isinstance(payload, dict) and payload.get("fail"):
        raise RuntimeError(f"asked to fail: {payload['fail']}")
    return {"handled": payload}


class ApiError(Exception):
    """An error answer of the API: HTTP status plus its ``{"code", "message", "field"}``."""

    def __init__(self, status: int, body: dict):
        self.status, self.code = status, body.get("code", "error")
        super().__init__(f"HTTP {status} {self.code}: {body.get('message', '')}")


class Client:
    """The few calls a consumer needs, as JSON over HTTP."""

    def __init__(self, url: str, queue: str, headers: dict, timeout: float = 60.0):
        self.base = f"{url.rstrip('/')}/queues/{urllib.request.quote(queue, safe='')}/"
        self.headers = {"Content-Type": "application/json", "Accept": "application/json", **headers}
        self.timeout = timeout

    def post(self, path: str, body: dict):
        data = json.dumps(body).encode("utf-8")
        request = urllib.request.Request(self.base + path, data=data, headers=self.headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return json.loads(response.read().decode("utf-8"))
        except urllib.error.HTTPError as exc:
            try:
                body = json.loads(exc.read().decode("utf-8"))
            except ValueError:
                body = {"code": "http_error", "message": exc.reason}
            raise ApiError(exc.code, body) from None

    def claim(self, count: int, wait_ms: int, visibility_ms: int | None) -> list:
        body = {"count": count, "wait_ms": wait_ms}
        if visibility_ms:
            body["visibility_ms"] = visibility_ms
        return self.post("claim/", body)

    def ack(self, receipt: str, result) -> dict:
        return self.post("ack/", {"receipt": receipt, "result": result})

    def nack(self, receipt: str, error: str) -> dict:
        return self.post("nack/", {"receipt": receipt, "error": error})

    def release(self, receipt: str) -> dict:
        return self.post("release/", {"receipt": receipt, "error": "consumer stopped"})


def report(**fields) -> None:
    print(json.dumps(fields), flush=True)


def run(client: Client, *, count: int, wait_ms: int, visibility_ms: int | None, burst: bool) -> int:
    """Claim, handle and settle until interrupted (or, with ``burst``, until a claim is empty)."""
    pause = 1.0
    settled = 0
    while True:
        try:
            jobs = client.claim(count, wait_ms, visibility_ms)
        except (ApiError, OSError) as exc:
            if isinstance(exc, ApiError) and exc.status in (400, 401, 403, 404):
                raise  # a mistake in our request or credentials: retrying will not help
            print(f"claim failed ({exc}); retrying in {pause:.0f}s", file=sys.stderr)
            time.sleep(pause)
            pause = min(pause * 2, 30.0)
            continue
        pause = 1.0
        if not jobs:
            if burst:
                return settled
            continue
        for i, job in enumerate(jobs):
            try:
                try:
                    result = handle(job["payload"])
                except Exception as exc:  # noqa: BLE001 - any failure of the work fails the attempt
                    outcome = client.nack(job["receipt"], f"{type(exc).__name__}: {exc}")
                else:
                    outcome = client.ack(job["receipt"], result)
            except KeyboardInterrupt:
                for held in jobs[i:]:  # hand back what we hold, so others need not wait for the lease
                    try:
                        client.release(held["receipt"])
                    except (ApiError, OSError):
                        pass
                raise
            except ApiError as exc:
                # 409: the lease expired (or the job was cancelled) while we worked; someone
                # else may run it again. Nothing to do but carry on.
                report(id=job["id"], outcome="lost", code=exc.code)
                continue
            settled += 1
            report(id=job["id"], outcome=outcome["state"], attempts=job["attempts"])


def main(argv=None) -> int:
    env = os.environ.get
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=env("FQ_API_URL"), help="where the API is mounted, e.g. http://host/api/fq")
    parser.add_argument("--queue", required=True)
    parser.add_argument("--user", default=env("FQ_API_USER"))
    parser.add_argument("--password", default=env("FQ_API_PASSWORD"))
    parser.add_argument("--token", default=env("FQ_API_TOKEN"), help='sent as "Authorization: Token …"')
    parser.add_argument("--count", type=int, default=10, help="jobs per claim (1-1000)")
    parser.add_argument("--wait-ms", type=int, default=20_000, help="long-poll this long for work (0-20000)")
    parser.add_argument("--visibility-ms", type=int, help="lease length (default: the queue's policy)")
    parser.add_argument("--burst", action="store_true", help="exit when a claim comes back empty")
    args = parser.parse_args(argv)
    if not args.url:
        parser.error("--url (or FQ_API_URL) is required")
    if args.token:
        headers = {"Authorization": f"Token {args.token}"}
    elif args.user:
        pair = f"{args.user}:{args.password or ''}".encode()
        headers = {"Authorization": "Basic " + base64.b64encode(pair).decode("ascii")}
    else:
        parser.error("give --user/--password or --token")
    client = Client(args.url, args.queue, headers, timeout=args.wait_ms / 1000 + 30)
    try:
        run(client, count=args.count, wait_ms=args.wait_ms, visibility_ms=args.visibility_ms, burst=args.burst)
    except KeyboardInterrupt:
        return 130
    except ApiError as exc:
        print(f"consumer: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
