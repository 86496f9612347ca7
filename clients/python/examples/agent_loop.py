"""An agent loop whose tool calls go through idemgate's HTTP front door.

The "model" here is a script of tool calls with the repeats real agents make:
a call re-issued after a lost answer, a reworded duplicate, a refund that an
operator must approve. Each call fires at most once; the loop feeds every
answer back to the model as a tool result.

    make run                                   # in another terminal
    python3 clients/python/examples/agent_loop.py

IDEMGATE_URL (default http://127.0.0.1:8080, make run's GATEWAY_PORT) and
IDEMGATE_TOKEN (default: the file data/agent.token that make run writes) say
where and as whom: with make run on other ports, set IDEMGATE_URL, e.g.
IDEMGATE_URL=http://127.0.0.1:8090 for GATEWAY_PORT=8090.
"""

import json
import os
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from idemgate import (AwaitingApproval, Client, Completed, Conflict, Denied, Failed, IdemgateError,  # noqa: E402
                      InFlight, Rejected, Uncertain, Unavailable)

# What the model asks for, turn by turn (tool, args, the model's tool_call_id).
SCRIPT = [
    ("create_ticket", {"title": "Printer on fire", "requested_at": "2025-01-06T09:00:00Z"}, "call_1"),
    # The answer was lost; the model asks again, five minutes later.
    ("create_ticket", {"title": "Printer on fire", "requested_at": "2025-01-06T09:05:00Z"}, "call_2"),
    ("send_email", {"to": "ada@example.com", "subject": "Ticket opened", "body": "We are on it."}, "call_3"),
    # The same email, reworded: body is volatile, so it is the same operation.
    ("send_email", {"to": "ada@example.com", "subject": "Ticket opened", "body": "We're on it!"}, "call_4"),
    ("refund", {"order_id": "o-1001", "amount_cents": 1999}, "call_5"),
]


def tool_result(answer) -> str:
    """What the model is told: the result, or why there is none."""
    match answer:
        case Completed(replayed=False, result=r):
            return json.dumps({"ok": True, "result": r})
        case Completed(replayed=True, result=r):
            return json.dumps({"ok": True, "result": r, "note": "already done earlier; not repeated"})
        case AwaitingApproval(location=loc):
            return json.dumps({"ok": False, "pending": "an operator must approve this", "operation": loc})
        case Uncertain():
            return json.dumps({"ok": False, "pending": "the outcome is being checked by an operator"})
        case Conflict():
            return json.dumps({"ok": False, "error": "this operation was already done with other arguments"})
        case Denied(error=e) | Failed(error=e) | Rejected(error=e):
            return json.dumps({"ok": False, "error": e})
        case InFlight(location=loc):
            return json.dumps({"ok": False, "pending": "still running", "operation": loc})
    return json.dumps({"ok": False, "error": repr(answer)})


def main() -> int:
    url = os.environ.get("IDEMGATE_URL", "http://127.0.0.1:8080")
    token = os.environ.get("IDEMGATE_TOKEN")
    if not token:
        path = pathlib.Path(os.environ.get("IDEMGATE_TOKEN_FILE", "data/agent.token"))
        if not path.exists():
            print(f"no token: set IDEMGATE_TOKEN, or run make run (it writes {path})", file=sys.stderr)
            return 1
        token = path.read_text().strip()
    client = Client(url, token)
    session = os.environ.get("IDEMGATE_SESSION", "agent-loop")
    for tool, args, call_id in SCRIPT:
        try:
            answer = client.call(tool, args, session=session, call_id=call_id, wait=60)
        except IdemgateError as e:
            print(f"{call_id} {tool}: {e}", file=sys.stderr)
            if isinstance(e, Unavailable) and e.status == 0:
                print(f"no front door at {url}: started with other ports (GATEWAY_PORT=...)? "
                      "set IDEMGATE_URL, e.g. IDEMGATE_URL=http://127.0.0.1:8090", file=sys.stderr)
            return 1
        kind = type(answer).__name__ + (" (replayed)" if getattr(answer, "replayed", False) else "")
        print(f"{call_id} {tool}: {kind} -> {tool_result(answer)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
