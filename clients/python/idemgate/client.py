"""A client of idemgate's HTTP front door (docs/http.md), standard library only.

    client = Client("http://127.0.0.1:8080", token)
    match client.call("send_email", {"to": "ada@example.com", "subject": "Hi"}, session="run-7"):
        case Completed(replayed=False, result=r): ...   # fired by this call
        case Completed(replayed=True, result=r): ...    # fired earlier: the same result
        case Conflict(): ...                            # same key, other arguments: never fired
        case AwaitingApproval(location=loc): ...        # an operator decides

A call is safe to repeat: the same operation fires at most once, so ``call``
itself repeats a request whose answer did not come (a lost connection, a 409
while the operation is in flight, a 429 or 503) until its wait runs out.

The client follows no redirect: the front door never answers one, and
following it would hand the bearer token (and a tool call's arguments) to
whatever host the Location names. A 3xx raises ``Redirected``; point
``base_url`` at the front door itself (https:// if it serves TLS).
"""

from __future__ import annotations

import datetime
import email.utils
import json
import secrets
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping

from .audit import KeySet, ReceiptError, loads_answer, receipted, verify_receipt
from .derive import Identity, KeySpec, derive

__all__ = [
    "Client", "Answer", "Completed", "Failed", "Conflict", "Rejected", "Denied", "AwaitingApproval", "Uncertain",
    "InFlight", "Page", "IdemgateError", "Unauthorized", "Forbidden", "NotFound", "RateLimited", "Unavailable",
    "BadRequest", "Redirected", "BadReceipt",
]

DEFAULT_WAIT = 180.0  # seconds: longer than a crashed worker's recovery at the default lease


@dataclass(frozen=True)
class Answer:
    """An operation's answer (docs/protocol.md, Answers), with where it came from."""

    key: str
    tool: str
    status: str
    replayed: bool
    fingerprint: str = ""
    attempts: int = 0
    result: Any = None
    error: dict | None = None
    call_id: str | None = None
    completed_at: str | None = None
    http_status: int = 0
    location: str | None = None
    #: In a conflict, the fingerprint the key was first used with.
    record_fingerprint: str = ""
    #: The signed event that recorded the outcome (docs/audit.md): on
    #: completed, failed, denied and already_done answers, and on a conflict a
    #: worker answered.
    receipt: dict | None = None
    #: In a final answer, its run: the stream sequence of the intent whose
    #: claim recorded the outcome, and that claim's number. The receipt binds both.
    intent_seq: int = 0
    attempt: int = 0
    #: The answer's JSON as it came, which verify_receipt checks.
    raw: dict | None = field(default=None, repr=False, compare=False)

    @property
    def code(self) -> str | None:
        """The error code, for answers that are not a success."""
        return (self.error or {}).get("code")


class Completed(Answer):
    """The operation fired (replayed=False: by this call) and this is its result."""


class Failed(Answer):
    """The operation failed permanently; every later call gets the same answer."""


class Conflict(Answer):
    """The key names an operation recorded with other arguments: never fired."""


class Rejected(Answer):
    """Bad input (invalid_intent, unknown_tool, too_large...): nothing was run."""


class Denied(Answer):
    """An operator denied the operation."""


class AwaitingApproval(Answer):
    """The operation waits for an operator; watch it with Client.operation(key, wait=...)."""


class Uncertain(Answer):
    """A worker vanished mid-effect and the tool asks a human to settle the outcome."""


class AlreadyDone(Answer):
    """The operation ran before and its tool refuses a repeat (on_complete: reject):
    nothing ran now. result, completed_at and attempts are what ran (HTTP 409,
    code already_done)."""


_ANSWERS = {
    "completed": Completed, "failed": Failed, "conflict": Conflict, "rejected": Rejected,
    "denied": Denied, "awaiting_approval": AwaitingApproval, "uncertain": Uncertain,
    "already_done": AlreadyDone,
}


@dataclass(frozen=True)
class InFlight:
    """No answer within the wait: the operation is still running (or queued).
    Repeating the call is safe; so is watching ``location``."""

    key: str | None
    location: str | None
    retry_after: float
    detail: str = ""
    http_status: int = 409


@dataclass(frozen=True)
class Page:
    """One page of a listing; pass ``next`` as ``after`` while ``more``."""

    records: list[dict]
    next: int
    more: bool


class IdemgateError(Exception):
    """A request the front door refused or could not serve, with its problem details."""

    def __init__(self, status: int, problem: Mapping[str, Any] | None = None, message: str | None = None):
        self.status = status
        self.problem = dict(problem or {})
        self.code = self.problem.get("code")
        self.detail = self.problem.get("detail") or message or ""
        super().__init__(f"{status} {self.code or ''}: {self.detail}".strip())


class BadRequest(IdemgateError):
    """A malformed request (400, 408, 413 outside a tool call)."""


class Unauthorized(IdemgateError):
    """No valid bearer token (401)."""


class Forbidden(IdemgateError):
    """The token's role or namespace does not allow the request (403)."""


class NotFound(IdemgateError):
    """No such operation, dead letter or endpoint (404)."""


class RateLimited(IdemgateError):
    """Over a rate or in-flight limit (429); retry after ``retry_after`` seconds."""

    def __init__(self, status, problem=None, message=None, retry_after: float = 1.0):
        super().__init__(status, problem, message)
        self.retry_after = retry_after


class Unavailable(IdemgateError):
    """The front door, NATS or the workers cannot be reached (503, 504, a lost connection)."""


class Redirected(IdemgateError):
    """The server answered a redirect (3xx), which the client does not follow:
    the bearer token goes to base_url's origin only. ``location`` is where it
    pointed."""

    def __init__(self, status, location: str | None, message: str):
        super().__init__(status, message=message)
        self.location = location


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """Follows no redirect: the 3xx reaches the caller as an HTTPError."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None


class BadReceipt(IdemgateError):
    """A client given receipt_keys got an answer whose receipt is missing or does
    not hold (``answer`` is the answer, ``kind`` the ReceiptError's kind)."""

    def __init__(self, answer: Answer, err: ReceiptError):
        super().__init__(answer.http_status, message=f"bad receipt: {err}")
        self.answer = answer
        self.kind = err.kind


@dataclass
class _Response:
    status: int
    headers: Mapping[str, str]
    body: Any


def _retry_after(headers: Mapping[str, str], default: float = 1.0) -> float:
    v = headers.get("Retry-After")
    if not v:
        return default
    try:
        return max(float(v), 0.0)
    except ValueError:
        t = email.utils.parsedate_to_datetime(v)
        return max((t - datetime.datetime.now(datetime.timezone.utc)).total_seconds(), 0.0)


def _now_rfc3339() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class Client:
    """A client of one front door with one bearer token. Safe for use from
    several threads (each request is its own connection)."""

    def __init__(self, base_url: str, token: str, *, namespace: str | None = None, timeout: float = 30.0,
                 receipt_keys: KeySet | None = None):
        """base_url is e.g. http://127.0.0.1:8080; namespace is the token's
        namespace, which derive() needs to compute the keys the front door
        computes: learned from the front door when not given (and checked
        when given); timeout bounds requests that do not wait for an answer.
        With receipt_keys (the workers' public keys, KeySet.from_file), every
        answer that carries a receipt is verified, and one whose receipt is
        missing or does not hold raises BadReceipt."""
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.namespace = namespace
        self.timeout = timeout
        self.receipt_keys = receipt_keys
        self._specs: dict[str, KeySpec] = {}
        self._opener = urllib.request.build_opener(_NoRedirect)

    # -- transport --

    def _request(self, method: str, path: str, body: Any = None, headers: Mapping[str, str] | None = None,
                 timeout: float | None = None) -> _Response:
        data = None if body is None else json.dumps(body, ensure_ascii=False, allow_nan=False).encode("utf-8")
        req = urllib.request.Request(self.base_url + path, data=data, method=method)
        req.add_header("Authorization", "Bearer " + self.token)
        req.add_header("Accept", "application/json, application/problem+json")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        for k, v in (headers or {}).items():
            req.add_header(k, v)
        try:
            with self._opener.open(req, timeout=timeout or self.timeout) as resp:
                return _Response(resp.status, resp.headers, self._decode(resp.read()))
        except urllib.error.HTTPError as e:
            with e:
                if 300 <= e.code < 400:
                    location = e.headers.get("Location")
                    raise Redirected(e.code, location, f"{method} {path}: answered {e.code} to {location!r}, which the client "
                                     "does not follow (it would take the token there): set base_url to the front door "
                                     "itself") from None
                return _Response(e.code, e.headers, self._decode(e.read()))
        except (urllib.error.URLError, ConnectionError, TimeoutError) as e:
            raise Unavailable(0, message=f"{method} {path}: {getattr(e, 'reason', e)}") from e

    @staticmethod
    def _decode(raw: bytes) -> Any:
        if not raw:
            return None
        try:
            return loads_answer(raw)  # a repeated member name stays in sight for the receipt check
        except ValueError:
            return {"detail": raw.decode("utf-8", "replace")}

    @staticmethod
    def _raise(resp: _Response) -> None:
        """Raises the exception of a response that is not an answer."""
        problem = resp.body if isinstance(resp.body, dict) else {}
        cls = {400: BadRequest, 401: Unauthorized, 403: Forbidden, 404: NotFound, 408: BadRequest,
               413: BadRequest, 503: Unavailable, 504: Unavailable}.get(resp.status, IdemgateError)
        if resp.status == 429:
            raise RateLimited(resp.status, problem, retry_after=_retry_after(resp.headers))
        raise cls(resp.status, problem)

    @staticmethod
    def _answer(resp: _Response) -> Answer | None:
        """The typed answer a response carries, if it carries one."""
        body = resp.body if isinstance(resp.body, dict) else {}
        ans = body.get("answer") if "answer" in body else (body if "status" in body and isinstance(body.get("status"), str) else None)
        if ans is None:
            code = body.get("code")
            # A rejection by the front door itself (before any worker saw it).
            if code in ("invalid_intent", "unknown_tool", "too_large"):
                ans = {"key": body.get("key", ""), "tool": "", "status": "rejected", "replayed": False,
                       "error": {"code": code, "message": body.get("detail", "")}}
                if isinstance(body.get("hint"), dict):
                    ans["hint"] = body["hint"]
            else:
                return None
        cls = _ANSWERS.get(ans.get("status"), Answer)
        return cls(key=ans.get("key", ""), tool=ans.get("tool", ""), status=ans.get("status", ""),
                   replayed=bool(ans.get("replayed")), fingerprint=ans.get("fingerprint", ""),
                   attempts=int(ans.get("attempts") or 0), result=ans.get("result"), error=ans.get("error"),
                   call_id=ans.get("call_id"), completed_at=ans.get("completed_at"), http_status=resp.status,
                   location=resp.headers.get("Location"), record_fingerprint=ans.get("record_fingerprint", ""),
                   receipt=ans.get("receipt"), intent_seq=int(ans.get("intent_seq") or 0),
                   attempt=int(ans.get("attempt") or 0), raw=ans)

    def _checked(self, ans: Answer) -> Answer:
        """ans, its receipt verified when the client has keys (a conflict the
        front door found itself carries none)."""
        if self.receipt_keys is None or not receipted(ans.status) or ans.raw is None:
            return ans
        if ans.status == "conflict" and not ans.receipt:
            return ans
        try:
            verify_receipt(ans.raw, self.receipt_keys)
        except ReceiptError as e:
            raise BadReceipt(ans, e) from e
        return ans

    # -- agents --

    def call(self, tool: str, args: Mapping[str, Any] | None = None, *, session: str | None = None,
             key: str | None = None, call_id: str | None = None, created_at: str | None = None,
             wait: float = DEFAULT_WAIT, retry: bool = True, traceparent: str | None = None) -> Answer | InFlight:
        """Calls tool with args and returns its answer, typed (Completed, Conflict,
        AwaitingApproval, ...), or InFlight when none came within wait seconds.

        key is the caller's own name for the operation (the Idempotency-Key
        header); without it the front door derives the key from the args.
        created_at is fixed once per call (now, unless given), so a window
        tool keeps its key across the call's retries. With retry, a lost
        connection, a 409 in flight, a 429 or a 503 is repeated after its
        Retry-After until wait runs out: the operation still fires at most
        once. Raises Unauthorized, Forbidden, BadRequest, RateLimited or
        Unavailable for requests that get no answer.
        """
        # One name for the call across its repeats: a repeat is a copy of the
        # call, never a new one (a failed operation runs again only for a
        # new call).
        headers = {"Idem-Created-At": created_at or _now_rfc3339(), "Idem-Submission": secrets.token_hex(16)}
        if session:
            headers["Idem-Session"] = session
        if key is not None:
            if not (key.isascii() and key.isprintable()):
                raise ValueError("over HTTP a key override is printable ASCII (an Idempotency-Key header)")
            headers["Idempotency-Key"] = '"' + key.replace("\\", "\\\\").replace('"', '\\"') + '"'  # an RFC 8941 string
        if call_id:
            headers["Idem-Call-Id"] = call_id
        if traceparent:
            headers["traceparent"] = traceparent
        deadline = time.monotonic() + wait
        pause = 0.2
        while True:
            left = max(deadline - time.monotonic(), 1.0)
            headers["Prefer"] = f"wait={int(left + 0.999)}"
            try:
                resp = self._request("POST", "/v1/tools/" + urllib.parse.quote(tool, safe=""), args or {}, headers,
                                     timeout=left + 30)
            except Unavailable:
                if not retry or time.monotonic() + pause >= deadline:
                    raise
                time.sleep(pause)
                pause = min(pause * 2, 5.0)
                continue
            ans = self._answer(resp)
            if ans is not None and resp.status != 429:
                return self._checked(ans)
            if resp.status in (409, 504):
                body = resp.body if isinstance(resp.body, dict) else {}
                inflight = InFlight(key=body.get("key"), location=resp.headers.get("Location"),
                                    retry_after=_retry_after(resp.headers), detail=body.get("detail", ""),
                                    http_status=resp.status)
                if not retry or time.monotonic() + inflight.retry_after >= deadline:
                    return inflight
                time.sleep(inflight.retry_after)
                continue
            if retry and resp.status in (429, 503):
                d = _retry_after(resp.headers)
                if time.monotonic() + d < deadline:
                    time.sleep(d)
                    continue
            self._raise(resp)

    def operation(self, key: str, *, wait: float | None = None) -> dict:
        """An operation's ledger record; with wait, once final (or as it is when
        wait seconds run out). Raises NotFound."""
        path = "/v1/operations/" + urllib.parse.quote(key, safe="")
        timeout = None
        if wait:
            path += f"?wait={wait:g}"
            timeout = wait + 30
        resp = self._request("GET", path, timeout=timeout)
        if resp.status != 200:
            self._raise(resp)
        return resp.body

    def tools(self) -> list[dict]:
        """The workers' tool catalogue. The answer also tells the token's
        namespace (Idem-Namespace), which derive() needs: it is remembered,
        and a namespace given to the constructor that is not the token's
        raises ValueError."""
        resp = self._request("GET", "/v1/tools")
        if resp.status != 200:
            self._raise(resp)
        ns = resp.headers.get("Idem-Namespace")
        if ns is not None:
            if self.namespace is not None and self.namespace != ns:
                raise ValueError(f"namespace={self.namespace!r} was given, but the token's namespace is {ns!r}: "
                                 "derived keys would not be the front door's")
            self.namespace = ns
        tools = resp.body["tools"]
        for t in tools:
            self._specs[t["name"]] = KeySpec.of(t)
        return tools

    def derive(self, tool: str, args: Mapping[str, Any] | None = None, *, session: str | None = None,
               key: str | None = None, created_at: str | None = None) -> Identity:
        """The key and fingerprint the front door derives for a call: the tool's
        key spec from the catalogue, the session within the token's namespace
        (learned from the catalogue's answer). Raises ValueError when the
        namespace is unknown (a front door that does not tell it: give the
        constructor namespace=)."""
        if tool not in self._specs or self.namespace is None:
            self.tools()
        if self.namespace is None:
            raise ValueError("the token's namespace is unknown, and every session is scoped by it: "
                             "give Client(..., namespace=...) to derive the front door's keys")
        scoped = session or ""
        if self.namespace != "*":
            scoped = self.namespace + ("/" + session if session else "")
        return derive(tool, args, spec=self._specs.get(tool), session=scoped, key=key, created_at=created_at)

    # -- operators --

    def records(self, *, status: str | None = None, tool: str | None = None, session: str | None = None,
                older_than: float | str | None = None, past_lease: bool | None = None, limit: int | None = None,
                after: int | None = None) -> Page:
        """One page of ledger records (status: names, comma separated, or "open")."""
        params = {k: v for k, v in {"status": status, "tool": tool, "session": session, "older_than": older_than,
                                    "limit": limit, "after": after}.items() if v is not None}
        if past_lease is not None:
            params["past_lease"] = "true" if past_lease else "false"
        resp = self._request("GET", "/v1/operations" + ("?" + urllib.parse.urlencode(params) if params else ""))
        if resp.status != 200:
            self._raise(resp)
        return Page(resp.body["records"], resp.body["next"], resp.body["more"])

    def iter_records(self, **filters: Any) -> Iterator[dict]:
        """Every record the filters select, page after page."""
        after = filters.pop("after", None)
        while True:
            page = self.records(after=after, **filters)
            yield from page.records
            if not page.more:
                return
            after = page.next

    def _decide(self, op: str, key: str, body: dict, wait: float) -> Answer:
        resp = self._request("POST", f"/v1/operations/{urllib.parse.quote(key, safe='')}/{op}", body,
                             {"Prefer": f"wait={int(wait)}"}, timeout=wait + 30)
        if resp.status == 200 or (resp.status in (400, 404, 409, 422) and "answer" in (resp.body or {})):
            ans = self._answer(resp)
            if ans is not None:
                return self._checked(ans)
        self._raise(resp)

    def approve(self, key: str, *, fingerprint: str | None = None, reason: str | None = None,
                wait: float = DEFAULT_WAIT) -> Answer:
        """Approves an operation awaiting approval: it fires, once; the answer is
        its result. fingerprint binds the approval to the arguments seen."""
        return self._decide("approve", key, _drop_none({"fingerprint": fingerprint, "reason": reason}), wait)

    def deny(self, key: str, *, reason: str | None = None, wait: float = 60.0) -> Answer:
        """Denies an operation awaiting approval: it never fires."""
        return self._decide("deny", key, _drop_none({"reason": reason}), wait)

    def resolve(self, key: str, outcome: str, *, result: Any = None, reason: str | None = None,
                wait: float = 60.0) -> Answer:
        """Settles an uncertain operation: outcome "succeeded" (with result) or "failed"."""
        return self._decide("resolve", key, _drop_none({"outcome": outcome, "result": result, "reason": reason}), wait)

    def forget(self, key: str, *, force: bool = False, reason: str | None = None, timeout: float | None = None) -> dict:
        """Deletes a settled operation's record so that it may run again; reason
        is recorded in the audit trail (with the token's name). An unresolved
        one (pending, awaiting approval, uncertain) raises IdemgateError with
        code "unresolved", whose detail says what forcing risks, unless force;
        one that may be firing now raises code "in_flight", forced or not. A
        forced forget of an operation pending past its lease answers after one
        more lease (timeout defaults to the client's plus 5 minutes)."""
        query = {}
        if force:
            query["force"] = "true"
            timeout = timeout or self.timeout + 300
        if reason:
            query["reason"] = reason
        path = "/v1/operations/" + urllib.parse.quote(key, safe="")
        if query:
            path += "?" + urllib.parse.urlencode(query)
        resp = self._request("DELETE", path, timeout=timeout)
        if resp.status != 200:
            self._raise(resp)
        return resp.body

    def history(self, key: str, *, since: str | None = None) -> list[dict]:
        """An operation's history from the audit trail, oldest first: entries
        {partition, pos, prev, event, seal?} (docs/audit.md). since is an RFC 3339
        time or a duration back from now (24h)."""
        path = "/v1/operations/" + urllib.parse.quote(key, safe="") + "/history"
        if since:
            path += "?" + urllib.parse.urlencode({"since": since})
        resp = self._request("GET", path)
        if resp.status != 200:
            self._raise(resp)
        return resp.body["entries"]

    def audit_keys(self) -> KeySet:
        """The public keys the workers published: as trustworthy as the front
        door; an auditor pins a keys file of its own (KeySet.from_file)."""
        resp = self._request("GET", "/v1/audit/keys")
        if resp.status != 200:
            self._raise(resp)
        return KeySet.from_json(resp.body)

    def dead_letters(self, limit: int | None = None) -> list[dict]:
        """Intents that could not be handled, oldest first."""
        resp = self._request("GET", "/v1/dead-letters" + (f"?limit={limit}" if limit else ""))
        if resp.status != 200:
            self._raise(resp)
        return resp.body["dead_letters"]

    def replay_dead_letter(self, seq: int) -> dict:
        """Publishes a dead letter again; the ledger decides whether it fires."""
        resp = self._request("POST", f"/v1/dead-letters/{int(seq)}/replay")
        if resp.status != 200:
            self._raise(resp)
        return resp.body


def _drop_none(d: dict) -> dict:
    return {k: v for k, v in d.items() if v is not None}
