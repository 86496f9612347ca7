"""idemgate: tool calls that fire at most once per operation, over HTTP.

A client of idemgate's HTTP front door (docs/http.md) with nothing but the
Python standard library, and the protocol's key derivation
(docs/protocol.md), proven against its test vectors.
"""

from .audit import KeySet, ReceiptError, verify_event, verify_receipt
from .canonical import InvalidJSON, canonicalize, loads
from .client import (AlreadyDone, Answer, AwaitingApproval, BadReceipt, BadRequest, Client, Completed, Conflict, Denied, Failed,
                     Forbidden, IdemgateError, InFlight, NotFound, Page, RateLimited, Redirected, Rejected, Unauthorized,
                     Unavailable, Uncertain)
from .derive import Identity, KeySpec, derive, derive_envelope, parse_envelope

__all__ = [
    "Client", "Answer", "Completed", "Failed", "Conflict", "Rejected", "Denied", "AwaitingApproval", "Uncertain",
    "AlreadyDone",
    "InFlight", "Page", "IdemgateError", "BadRequest", "Unauthorized", "Forbidden", "NotFound", "RateLimited",
    "Redirected", "Unavailable", "InvalidJSON", "canonicalize", "loads", "Identity", "KeySpec", "derive", "derive_envelope",
    "parse_envelope", "BadReceipt", "KeySet", "ReceiptError", "verify_event", "verify_receipt",
]
