"""Strict JSON reading and RFC 8785 canonical JSON, as the protocol uses them.

Every JSON number is a double, as in JavaScript: ``1``, ``1.0`` and ``1e0`` are
one number, and magnitudes above 2^53 are rejected (big identifiers belong in
strings). ``canonicalize`` writes numbers as ECMAScript's
``Number.prototype.toString`` does, members sorted by their names as UTF-16
code units, strings with only the escapes RFC 8785 requires.
"""

from __future__ import annotations

import json
import math
from decimal import Decimal
from typing import Any

__all__ = ["InvalidJSON", "loads", "canonicalize", "es_number", "MAX_DEPTH"]

MAX_SAFE = 2**53
MAX_DEPTH = 32  # nesting of objects and arrays, the envelope counting as 1


class InvalidJSON(ValueError):
    """The text breaks the protocol's JSON rules (docs/protocol.md, section 1)."""


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj: dict[str, Any] = {}
    for name, value in pairs:
        if name in obj:
            raise InvalidJSON(f"member name {name!r} is repeated")
        obj[name] = value
    return obj


def _number(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise InvalidJSON(f"number {text} is beyond the range of a double")
    if abs(value) > MAX_SAFE or (abs(value) == MAX_SAFE and abs(Decimal(text)) > MAX_SAFE):
        raise InvalidJSON(f"number {text} is beyond ±2^53: send big identifiers as strings")
    return value


def _constant(name: str) -> Any:
    raise InvalidJSON(f"{name} is not JSON")


def _check(value: Any, depth: int, max_depth: int) -> None:
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as e:
            raise InvalidJSON("a string holds a lone surrogate escape, which RFC 8785 cannot encode") from e
    elif isinstance(value, (dict, list)):
        if depth > max_depth:
            raise InvalidJSON(f"objects and arrays nest deeper than {max_depth} levels")
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for name, item in items:
            if isinstance(name, str):
                _check(name, depth, max_depth)
            _check(item, depth + 1, max_depth)


def loads(text: str | bytes, max_depth: int = MAX_DEPTH) -> Any:
    """Reads one JSON value with the protocol's rules, numbers as floats.

    Refuses invalid UTF-8, repeated member names, lone surrogate escapes,
    NaN and Infinity, numbers beyond ±2^53 or beyond a double, nesting deeper
    than max_depth (the outermost value counting as 1) and trailing data.
    """
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as e:
            raise InvalidJSON(f"not valid UTF-8: {e}") from e
    try:
        value = json.loads(text, object_pairs_hook=_unique, parse_int=_number,
                           parse_float=_number, parse_constant=_constant)
    except InvalidJSON:
        raise
    except (ValueError, RecursionError) as e:
        raise InvalidJSON(str(e)) from e
    _check(value, 1, max_depth)
    return value


def es_number(x: float) -> str:
    """A double as ECMAScript Number::toString writes it (RFC 8785, 3.2.2.3)."""
    if math.isnan(x) or math.isinf(x):
        raise InvalidJSON(f"{x} is not a JSON number")
    if x == 0:
        return "0"  # -0 too
    if x < 0:
        return "-" + es_number(-x)
    # repr gives the shortest digits that read back to x, as ECMAScript does.
    mantissa, _, exp = repr(x).partition("e")
    whole, _, frac = mantissa.partition(".")
    digits = whole + frac
    n = len(whole) + (int(exp) if exp else 0)  # x = 0.digits × 10^n
    stripped = digits.lstrip("0")
    n -= len(digits) - len(stripped)
    digits = stripped.rstrip("0") or "0"
    k = len(digits)
    if k <= n <= 21:
        return digits + "0" * (n - k)
    if 0 < n <= 21:
        return digits[:n] + "." + digits[n:]
    if -6 < n <= 0:
        return "0." + "0" * -n + digits
    e = n - 1
    return digits[0] + ("." + digits[1:] if k > 1 else "") + "e" + ("+" if e > 0 else "-") + str(abs(e))


def _string(s: str) -> str:
    # json.dumps escapes exactly what RFC 8785 requires when ensure_ascii is
    # off: '"', '\\', \b \t \n \f \r, and other controls as \u00xx (lower case).
    return json.dumps(s, ensure_ascii=False)


def canonicalize(value: Any) -> str:
    """RFC 8785 canonical JSON of a value read by loads (dicts, lists, str,
    float or int, bool, None)."""
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, (int, float)):
        if isinstance(value, int) and abs(value) > MAX_SAFE:
            raise InvalidJSON(f"number {value} is beyond ±2^53: send big identifiers as strings")
        return es_number(float(value))
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(canonicalize(v) for v in value) + "]"
    if isinstance(value, dict):
        for name in value:
            if not isinstance(name, str):
                raise InvalidJSON(f"member name {name!r} is not a string")
        names = sorted(value, key=lambda name: name.encode("utf-16-be"))
        return "{" + ",".join(_string(n) + ":" + canonicalize(value[n]) for n in names) + "}"
    raise InvalidJSON(f"{type(value).__name__} is not a JSON value")
