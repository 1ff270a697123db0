"""`HttpValidator`: the verdict of a downstream HTTP service (`--validator-url`).

Knows: how one envelope is POSTed (JSON body, `Idempotency-Key` header), the time limit of
one validation (all attempts together), which failures are retried (connection errors and
502/503/504 only: validation is read-only, so a repeat is safe, and the idempotency key
lets the service see that it is one), and that every other failure — timeout, any other
status, a body that is not JSON or not a verdict — fails closed with
ValidatorUnavailableError (503): a candidate without a verdict is never passed on.
Does not know: the chat flow, the built-in check, or what the service does with the call.
"""

from __future__ import annotations

import asyncio
import json
import urllib.parse
from collections.abc import Mapping
from typing import Any

import anyio
import httpx

from callgate.errors import ValidatorUnavailableError
from callgate.serving.handoff.envelope import Envelope, Verdict, envelope_dict, parse_verdict

RETRY_STATUSES = frozenset({502, 503, 504})
# Failures after which the service cannot have answered, or answered "try again".
_RETRY_ERRORS = (httpx.ConnectError, httpx.ConnectTimeout, httpx.RemoteProtocolError, httpx.ReadError)


class HttpValidator:
    """POST each envelope to `url`; the JSON answer is the verdict.

    `timeout_s` bounds one `validate` call, retries and back-off included; `retries` more
    attempts (after `backoff_s`, doubling) follow a connection error or a 502/503/504.
    `transport` replaces httpx's network transport (tests). Each call uses its own client,
    so nothing outlives it; they share one TLS context, built here, because building one
    per client costs ~75 ms (a call on loopback measured ~5 ms, against ~3 ms on a
    kept-alive connection).
    """

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float = 5.0,
        retries: int = 2,
        backoff_s: float = 0.05,
        headers: Mapping[str, str] | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        if urllib.parse.urlsplit(url).scheme not in ("http", "https"):
            raise ValueError(f"validator url must be http(s)://..., got {redact_url(url)!r}")
        self.url = url
        self.name = "http:" + redact_url(url)
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        self._headers = dict(headers or {})
        self._transport = transport
        self._tls = httpx.create_ssl_context()

    async def validate(self, req: Envelope) -> Verdict:
        body = json.dumps(envelope_dict(req), ensure_ascii=False, separators=(",", ":")).encode()
        headers = {**self._headers, "content-type": "application/json", "idempotency-key": req.idempotency_key}
        try:
            with anyio.fail_after(self.timeout_s):
                async with httpx.AsyncClient(
                    transport=self._transport, timeout=self.timeout_s, verify=self._tls
                ) as client:
                    response = await self._post(client, body, headers)
        except (TimeoutError, httpx.TimeoutException) as exc:
            raise self._unavailable(f"no verdict within {self.timeout_s:g} s") from exc
        return self._verdict(response)

    async def _post(self, client: httpx.AsyncClient, body: bytes, headers: Mapping[str, str]) -> httpx.Response:
        """The first answer that is not worth retrying; raises after the last attempt."""
        for attempt in range(self.retries + 1):
            last = attempt == self.retries
            try:
                response = await client.post(self.url, content=body, headers=headers)
            except _RETRY_ERRORS as exc:
                if last:
                    raise self._unavailable(f"cannot reach the validator ({_describe(exc)})") from exc
            except httpx.TimeoutException:
                raise  # the time limit: reported by `validate`
            except httpx.HTTPError as exc:
                raise self._unavailable(f"request to the validator failed ({_describe(exc)})") from exc
            else:
                if response.status_code not in RETRY_STATUSES or last:
                    return response
            await asyncio.sleep(self.backoff_s * 2**attempt)
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _verdict(self, response: httpx.Response) -> Verdict:
        if response.status_code != 200:
            raise self._unavailable(f"the validator answered HTTP {response.status_code}")
        try:
            doc: Any = json.loads(response.content)
        except (ValueError, UnicodeDecodeError) as exc:
            raise self._unavailable("the validator's answer is not JSON") from exc
        try:
            return parse_verdict(doc, self.name)
        except ValueError as exc:
            raise self._unavailable(f"the validator's answer is {exc}") from exc

    def _unavailable(self, why: str) -> ValidatorUnavailableError:
        return ValidatorUnavailableError(f"validator {self.name}: {why}", code="validator_unavailable")


def redact_url(url: str) -> str:
    """`url` without user info or query (either may hold a secret): what logs and audit show."""
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = host + (f":{parts.port}" if parts.port else "")
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
