"""Key and fingerprint derivation, exactly as docs/protocol.md section 3 says.

    >>> derive("send_email", {"to": "ada@example.com", "subject": "Welcome"}, session="run-7").key
    'send_email.ea5b3b5ecc3fa233989582335bb7067cd6c904cb4d46baf4530950de5b22b7f6'
"""

from __future__ import annotations

import datetime
import hashlib
import re
from dataclasses import dataclass, field
from typing import Any, Mapping

from .canonical import InvalidJSON, canonicalize, loads

__all__ = ["KeySpec", "Identity", "derive", "parse_envelope", "derive_envelope", "MAX_KEY_BYTES"]

MAX_KEY_BYTES = 256
FIELDS = ("tool", "args", "session", "key", "call_id", "created_at")
TOOL = re.compile(r"[a-z0-9_-]{1,64}")
RFC3339 = re.compile(r"(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})(\.\d+)?(Z|[+-]\d{2}:\d{2})")
EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)


@dataclass(frozen=True)
class KeySpec:
    """How a tool derives keys: the catalogue's key_args, window_seconds and
    volatile_args (GET /v1/tools). The default derives from all args."""

    key_args: tuple[str, ...] = ()
    window_seconds: int = 0
    volatile_args: tuple[str, ...] = ()

    @classmethod
    def of(cls, tool_info: Mapping[str, Any] | None) -> "KeySpec":
        """The spec of a catalogue entry (or of a vector's "spec")."""
        t = tool_info or {}
        return cls(tuple(t.get("key_args") or ()), int(t.get("window_seconds") or 0), tuple(t.get("volatile_args") or ()))


@dataclass(frozen=True)
class Identity:
    """What derivation yields: the key, the fingerprint and the canonical
    key material whose SHA-256 is the key's hex part."""

    key: str
    fingerprint: str
    material: str = field(repr=False)


def _invalid(msg: str) -> InvalidJSON:
    return InvalidJSON(msg)


def unix_seconds(rfc3339: str) -> int:
    """Whole seconds since the epoch of an RFC 3339 time, floored."""
    m = RFC3339.fullmatch(rfc3339)
    if not m:
        raise _invalid(f"created_at {rfc3339!r} is not an RFC 3339 time such as 2025-01-02T15:04:05Z")
    frac = (m.group(7) or "")[:7]  # fromisoformat takes 6 fraction digits
    text = rfc3339[: m.start(7)] + frac[:7] if m.group(7) else rfc3339[: m.end(6)]
    zone = m.group(8)
    try:
        t = datetime.datetime.fromisoformat(text + ("+00:00" if zone == "Z" else zone))
    except ValueError as e:
        raise _invalid(f"created_at {rfc3339!r}: {e}") from e
    return (t - EPOCH) // datetime.timedelta(seconds=1)


def _check_args(args: Any) -> dict[str, Any]:
    if not isinstance(args, dict):
        raise _invalid(f"args must be an object, got {type(args).__name__}")
    # Canonicalizing checks every value is JSON the protocol accepts.
    canonicalize(args)
    return args


def derive(tool: str, args: Mapping[str, Any] | None = None, *, spec: KeySpec | None = None, session: str = "",
           key: str | None = None, created_at: str | None = None, msg_time: str | None = None) -> Identity:
    """The key and fingerprint of an intent (docs/protocol.md, 3 and 4).

    The material is {"v":1,"tool":T,"session":S,"args":A}: A is the args
    (only the spec's key_args when it has some) without its volatile_args;
    a window tool adds "window": floor(t / window) of created_at (else the
    message time); a key override replaces args and window by "key": K. The
    fingerprint is of {"tool","session","args"} with the args minus the
    volatile ones.
    """
    spec = spec or KeySpec()
    if not isinstance(tool, str) or not TOOL.fullmatch(tool):
        raise _invalid(f"tool {tool!r} must match [a-z0-9_-]{{1,64}}")
    args = _check_args(dict(args or {}))
    session = session or ""
    _check_header_text("session", session)
    material: dict[str, Any] = {"v": 1, "tool": tool, "session": session}
    if key is not None:
        if not 1 <= len(key.encode("utf-8")) <= MAX_KEY_BYTES:
            raise _invalid(f"a key override is 1 to {MAX_KEY_BYTES} bytes")
        material["key"] = key
    else:
        a = {n: v for n, v in args.items() if n in spec.key_args} if spec.key_args else dict(args)
        material["args"] = {n: v for n, v in a.items() if n not in spec.volatile_args}
        if spec.window_seconds:
            when = created_at or msg_time
            if not when:
                raise _invalid(f"tool {tool} is keyed by a {spec.window_seconds}s window and the intent has no created_at or message time")
            material["window"] = unix_seconds(when) // spec.window_seconds  # floors toward -inf
    if created_at is not None:
        unix_seconds(created_at)  # refused even when no window uses it
    fp = {"tool": tool, "session": session, "args": {n: v for n, v in args.items() if n not in spec.volatile_args}}
    canonical = canonicalize(material)
    return Identity(
        key=tool + "." + hashlib.sha256(canonical.encode("utf-8")).hexdigest(),
        fingerprint=hashlib.sha256(canonicalize(fp).encode("utf-8")).hexdigest(),
        material=canonical,
    )


def parse_envelope(text: str | bytes) -> dict[str, Any]:
    """Reads an intent envelope with the protocol's strict rules (section 1)."""
    env = loads(text)
    if not isinstance(env, dict):
        raise _invalid("the envelope must be a JSON object")
    for name in env:
        if name not in FIELDS:
            hint = next((f for f in FIELDS if f.lower() == name.lower()), None)
            raise _invalid(f"unknown field {name!r}" + (f" (field names are case-sensitive: use {hint!r})" if hint else ""))
    if "tool" not in env:
        raise _invalid('field "tool" is required')
    if not isinstance(env["tool"], str) or not TOOL.fullmatch(env["tool"]):
        raise _invalid("tool must match [a-z0-9_-]{1,64}")
    if "args" not in env:
        raise _invalid('field "args" is required (send {} for no arguments)')
    _check_args(env["args"])
    for name in ("session", "key", "call_id", "created_at"):
        if name in env and not isinstance(env[name], str):
            raise _invalid(f"field {name!r} must be a string (omit it instead of sending null)")
    for name in ("session", "call_id"):
        if name in env:
            _check_header_text(name, env[name])
    if "key" in env and not 1 <= len(env["key"].encode("utf-8")) <= MAX_KEY_BYTES:
        raise _invalid(f"field 'key' must be 1 to {MAX_KEY_BYTES} bytes")
    if "created_at" in env:
        unix_seconds(env["created_at"])
    return env


def _check_header_text(name: str, value: str) -> None:
    """Refuses a control character (Unicode Cc) in session or call_id: effects forward both as header values."""
    for i, ch in enumerate(value):
        c = ord(ch)
        if c <= 0x1F or 0x7F <= c <= 0x9F:
            at = len(value[:i].encode("utf-8", "surrogatepass"))
            raise _invalid(f"field {name!r} holds the control character U+{c:04X} at byte {at}: "
                           "it is sent as a header value, which holds none")


def derive_envelope(text: str | bytes, spec: KeySpec | None = None, msg_time: str | None = None) -> Identity:
    """parse_envelope, then derive."""
    env = parse_envelope(text)
    return derive(env["tool"], env["args"], spec=spec, session=env.get("session", ""), key=env.get("key"),
                  created_at=env.get("created_at"), msg_time=msg_time)
