"""Receipts (docs/audit.md): the signed event every final answer carries.

    keys = KeySet.from_file("keys.json")          # the keys file operators publish
    event = verify_receipt(answer, keys)          # raises ReceiptError if it does not hold

A receipt is an audit event: its members' RFC 8785 form, without "sig" and
"proof", is a Merkle leaf, SHA-256(0x00 || JCS); the leaf, folded with each
proof step ("L<hex>": a left sibling, "R<hex>": a right one, each node
SHA-256(0x01 || left || right)), is the root its signer signed with Ed25519.
verify_receipt also checks that the receipt records the answer it came with:
the same key (or its compact ledger key), fingerprint, status (completed, for
an already_done answer), attempts, run (intent_seq, attempt, and its time as
completed_at), and the digests of its result and error.
"""

from __future__ import annotations

import base64
import calendar
import hashlib
import json
import re
from typing import Any, Mapping

from . import ed25519
from .canonical import InvalidJSON, canonicalize

__all__ = ["KeySet", "ReceiptError", "verify_event", "verify_receipt", "receipted", "compact_key", "result_digest",
           "error_digest", "loads_answer"]


class ReceiptError(ValueError):
    """A receipt that does not hold. kind is no_receipt, invalid, bad_signature,
    unknown_signer, key_not_valid or mismatch."""

    def __init__(self, kind: str, message: str):
        super().__init__(f"{kind}: {message}")
        self.kind = kind


_TIME = re.compile(r"^(\d{4})-(\d{2})-(\d{2})[Tt](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?([Zz]|[+-]\d{2}:\d{2})$")


def _nanos(text: str) -> int:
    """An RFC 3339 time as nanoseconds since the Unix epoch."""
    m = _TIME.match(text) if isinstance(text, str) else None
    if not m:
        raise ReceiptError("invalid", f"time {text!r} is not RFC 3339")
    y, mo, d, h, mi, s, frac, zone = m.groups()
    secs = calendar.timegm((int(y), int(mo), int(d), int(h), int(mi), int(s)))
    if zone not in ("Z", "z"):
        sign = 1 if zone[0] == "+" else -1
        secs -= sign * (int(zone[1:3]) * 3600 + int(zone[4:6]) * 60)
    return secs * 10**9 + int((frac or "").ljust(9, "0"))


def _b64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


_SIG = re.compile(r"[A-Za-z0-9_-]{86}")
_STEP = re.compile(r"[LR][0-9a-f]{64}")


def _sig(text: Any) -> bytes | None:
    """A signature's one text decoded: 86 base64url characters, the unused
    last bits zero; None for any other text."""
    if not isinstance(text, str) or not _SIG.fullmatch(text):
        return None
    raw = _b64(text)
    return raw if base64.urlsafe_b64encode(raw).decode().rstrip("=") == text else None


class _Members(dict):
    """A JSON object as loads_answer reads it: repeated names the member
    names it held more than once (a dict keeps the last)."""

    repeated: tuple = ()


def _pairs(pairs: list) -> _Members:
    members = _Members(pairs)
    if len(members) != len(pairs):
        seen: set = set()
        members.repeated = tuple(k for k, _ in pairs if k in seen or seen.add(k))
    return members


def loads_answer(text: str | bytes) -> Any:
    """Reads an answer's JSON text, keeping what verify_receipt refuses in
    sight: each object's repeated member names. Raises ValueError for text
    that is not JSON (or not UTF-8)."""
    if isinstance(text, bytes):
        text = text.decode("utf-8")
    return json.loads(text, object_pairs_hook=_pairs)


def _check_text(value: Any, path: str = "the answer") -> None:
    """Raises ReceiptError (invalid) for a repeated member name or a lone
    surrogate anywhere in value."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ReceiptError("invalid", f"{path} holds a lone surrogate") from e
    elif isinstance(value, Mapping):
        if getattr(value, "repeated", ()):
            raise ReceiptError("invalid", f"{path} repeats the member name {value.repeated[0]!r}")
        for k, v in value.items():
            _check_text(k, path)
            _check_text(v, path)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _check_text(v, path)


class KeySet:
    """The public keys a verifier trusts, each with its validity (a keys file:
    {"keys": [{"id", "public_key", "not_before", "not_after"}, ...]})."""

    def __init__(self, keys: list[Mapping[str, Any]]):
        self._keys: dict[str, tuple[bytes, int | None, int | None]] = {}
        for k in keys:
            kid, pub = k.get("id", ""), _b64(k.get("public_key", ""))
            if len(pub) != 32:
                raise ReceiptError("invalid", f"key {kid}: public_key is not 32 bytes of base64url")
            if hashlib.sha256(pub).hexdigest()[:16] != kid:
                raise ReceiptError("invalid", f"key {kid}: its public_key has id {hashlib.sha256(pub).hexdigest()[:16]}")
            nb, na = k.get("not_before"), k.get("not_after")
            self._keys[kid] = (pub, _nanos(nb) if nb else None, _nanos(na) if na else None)

    @classmethod
    def from_json(cls, doc: str | bytes | Mapping[str, Any]) -> "KeySet":
        """A key set from a keys file's text, or its parsed JSON."""
        if not isinstance(doc, Mapping):
            doc = json.loads(doc)
        return cls(list(doc.get("keys") or []))

    @classmethod
    def from_file(cls, path: str) -> "KeySet":
        with open(path, encoding="utf-8") as f:
            return cls.from_json(f.read())

    def __len__(self) -> int:
        return len(self._keys)

    def lookup(self, kid: str, at: str) -> bytes:
        """The public key kid, valid at the RFC 3339 time at."""
        if kid not in self._keys:
            raise ReceiptError("unknown_signer", f"{kid!r} is not among the {len(self._keys)} keys given")
        pub, not_before, not_after = self._keys[kid]
        t = _nanos(at)
        if (not_before is not None and t < not_before) or (not_after is not None and t >= not_after):
            raise ReceiptError("key_not_valid", f"key {kid} is not valid at {at}")
        return pub


def _node(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(b"\x01" + left + right).digest()


def verify_event(event: Mapping[str, Any], keys: KeySet) -> Mapping[str, Any]:
    """Checks a signed event's signature with the key its "signer" names,
    valid at its "at"; returns the event. Raises ReceiptError."""
    if not isinstance(event, Mapping) or not event.get("sig") or not event.get("signer"):
        raise ReceiptError("bad_signature", "the event is not signed")
    rest = {k: v for k, v in event.items() if k not in ("sig", "proof")}
    try:
        h = hashlib.sha256(b"\x00" + canonicalize(rest).encode("utf-8")).digest()
    except InvalidJSON as e:
        raise ReceiptError("invalid", f"the event has no canonical form: {e}") from e
    proof = event.get("proof") or []
    if not isinstance(proof, list):
        raise ReceiptError("invalid", "proof is not a list")
    for step in proof:
        if not isinstance(step, str) or not _STEP.fullmatch(step):
            raise ReceiptError("invalid", f"proof step {step!r}: want L or R and 64 lowercase hex digits")
        sibling = bytes.fromhex(step[1:])
        h = _node(sibling, h) if step[0] == "L" else _node(h, sibling)
    pub = keys.lookup(event["signer"], event.get("at", ""))
    sig = _sig(event["sig"])
    if sig is None or not ed25519.verify(pub, h, sig):
        raise ReceiptError("bad_signature", f"signer {event['signer']}")
    return event


def compact_key(key: str) -> str:
    """The compact ledger key of a derived key (<tool>.<64 hex digits>): the
    tool, a dot and the base64url of the digest's first 16 bytes; any other
    key as it is (docs/protocol.md, 6.2)."""
    tool, _, digest = key.rpartition(".")
    if tool and re.fullmatch(r"[0-9a-f]{64}", digest):
        return tool + "." + base64.urlsafe_b64encode(bytes.fromhex(digest[:32])).decode().rstrip("=")
    return key


def result_digest(result: Any) -> str:
    """hex(sha256(JCS(result))); "" for a result with no canonical form (a
    number beyond ±2^53), which a receipt does not bind. Raises ReceiptError
    (invalid) for a result that repeats a member name or holds a lone
    surrogate: refused, never unbound."""
    _check_text(result, "the answer's result")
    try:
        return hashlib.sha256(canonicalize(result).encode("utf-8")).hexdigest()
    except InvalidJSON:
        return ""


def error_digest(error: Mapping[str, Any]) -> str:
    """hex(sha256(JCS({"code", "message"}))) of an answer's error."""
    e = {"code": error.get("code", ""), "message": error.get("message", "")}
    return hashlib.sha256(canonicalize(e).encode("utf-8")).hexdigest()


def receipted(status: str) -> bool:
    """Whether an answer of status carries a receipt: already_done carries
    its completion's; a conflict does when a worker answered it."""
    return status in ("completed", "failed", "denied", "already_done", "conflict")


def verify_receipt(answer: Mapping[str, Any] | str | bytes, keys: KeySet) -> Mapping[str, Any]:
    """Checks an answer's receipt (the answer's JSON text as it came, or
    what loads_answer or json.loads made of it): its signature, and that it
    records this answer. Returns the receipt. Raises ReceiptError:
    no_receipt, invalid (the answer repeats a member name or holds a lone
    surrogate), bad_signature, unknown_signer, key_not_valid or mismatch (a
    receipt of another operation, run or outcome)."""
    if isinstance(answer, (str, bytes)):
        try:
            answer = loads_answer(answer)
        except ValueError as e:
            raise ReceiptError("invalid", f"the answer is not JSON: {e}") from e
    if not isinstance(answer, Mapping):
        raise ReceiptError("invalid", "the answer is not a JSON object")
    receipt = answer.get("receipt")
    if not receipt:
        raise ReceiptError("no_receipt", f"the {answer.get('status')} answer of {answer.get('key')} carries no receipt")
    _check_text(answer)
    ev = verify_event(receipt, keys)
    status, key = answer.get("status"), answer.get("key", "")
    conflict, done = status == "conflict", status == "already_done"  # already_done reports a completion
    want_kind = "conflict" if conflict else "outcome"
    want_result = result_digest(answer["result"]) if "result" in answer else ""
    want_error = error_digest(answer["error"]) if answer.get("error") and not done else ""

    def differs(what: str, got: Any, want: Any) -> None:
        if got != want:
            raise ReceiptError("mismatch", f"{key}: its {what} is {got!r}, the answer's {want!r}")

    differs("kind", ev.get("kind"), want_kind)
    if ev.get("key") not in (key, compact_key(key)):
        raise ReceiptError("mismatch", f"{key}: it is of key {ev.get('key')!r}")
    differs("fingerprint", ev.get("fingerprint", ""), answer.get("fingerprint", ""))
    differs("status", ev.get("status"), "completed" if done else status)
    if conflict:
        differs("record fingerprint", ev.get("record_fingerprint", ""), answer.get("record_fingerprint", ""))
    else:
        differs("attempts", ev.get("attempts", 0), answer.get("attempts", 0))
        differs("attempt", ev.get("attempt", 0), answer.get("attempt", 0))
    differs("intent sequence", ev.get("intent_seq", 0), answer.get("intent_seq", 0))
    try:
        completed = _nanos(answer.get("completed_at") or "")
    except ReceiptError:
        completed = None
    if completed is None or _nanos(ev.get("at", "")) != completed:
        raise ReceiptError("mismatch", f"{key}: it is of {ev.get('at')!r}, the answer was completed at {answer.get('completed_at')!r}")
    differs("result digest", ev.get("result_digest", ""), want_result)
    differs("error digest", ev.get("error_digest", ""), want_error)
    return ev
