"""idemgate's tools as plain Python callables, for any agent framework.

LangChain's ``@tool``, the OpenAI Agents SDK's ``@function_tool`` and
CrewAI's ``@tool`` all take a plain function, reading its name, signature
and docstring. :func:`tool` makes such a function call idemgate's tool of
the same name through the HTTP front door, keyed on its named arguments
and scoped by the session of the current context::

    from idemgate import Client
    from idemgate.tools import tool, session

    idem = Client("http://127.0.0.1:8080", open("data/agent.token").read().strip())

    @tool(idem)
    def send_email(to: str, subject: str, body: str = "") -> dict:
        \"\"\"Send an email to a customer.\"\"\"

    with session("run-7"):           # every call in this block (thread, task) is in run-7
        send_email(to="ada@example.com", subject="Your order shipped")

The body of the decorated function never runs: the workers fire the tool.
The function answers a dict for the model (``status``, ``replayed``,
``operation``, ``result`` or ``error``, and ``note``: the server's text,
never this module's), for every outcome, so that no framework wraps an
exception in advice of its own; with ``raise_errors=True`` an outcome that
is not a success raises a typed :class:`ToolError` instead, whose message is
the same text. ``on_answer`` sees every typed answer, with its receipt.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import inspect
import time
from typing import Any, Callable, Iterator, Mapping

from .client import (DEFAULT_WAIT, AlreadyDone, Answer, AwaitingApproval, Client, Completed, Conflict, Denied, Failed,
                     InFlight, Rejected, Uncertain)

#: The session of calls made in the current context (a run, a thread, a conversation).
current: contextvars.ContextVar[str | None] = contextvars.ContextVar("idemgate_session", default=None)

_OPEN = ("awaiting_approval", "approved", "pending")


@contextlib.contextmanager
def session(name: str) -> Iterator[str]:
    """Runs the block's calls in session name (restored on exit). A retry of
    the same intent, after any restart, must name the same session."""
    if not isinstance(name, str) or not name:
        raise ValueError("session: give a non-empty string naming the run")
    token = current.set(name)
    try:
        yield name
    finally:
        current.reset(token)


class ToolError(Exception):
    """An operation's outcome that is not a success (raise_errors=True). The
    message is the server's text for the model; answer is the typed answer."""

    def __init__(self, answer: Answer | InFlight, text: str):
        super().__init__(text)
        self.answer = answer
        self.text = text


class ConflictError(ToolError):
    """The operation was first called with other arguments: nothing ran."""


class FailedError(ToolError):
    """The operation failed; its failure is recorded."""


class DeniedError(ToolError):
    """The operation was denied by its approver and will not run."""


class RejectedError(ToolError):
    """The call was refused before anything ran (bad arguments, unknown tool, budget)."""


class AlreadyDoneError(ToolError):
    """The operation ran before and its tool refuses a repeat: nothing ran now."""


class AwaitingApprovalError(ToolError):
    """The operation waits for an approver: nothing has run yet."""


class UncertainError(ToolError):
    """The operation was interrupted mid-effect; an operator settles it."""


class InFlightError(ToolError):
    """No answer within the wait: the operation goes on."""


_ERRORS: dict[type, type[ToolError]] = {
    Conflict: ConflictError, Failed: FailedError, Denied: DeniedError, Rejected: RejectedError,
    AlreadyDone: AlreadyDoneError, AwaitingApproval: AwaitingApprovalError, Uncertain: UncertainError,
}


def text_of(answer: Answer | InFlight) -> str:
    """What the model should know beyond the result: the answer's hint text
    as the server wrote it; without a hint, the server's error message."""
    if isinstance(answer, InFlight):
        return answer.detail
    hint = (answer.raw or {}).get("hint")
    if isinstance(hint, dict) and isinstance(hint.get("text"), str):
        return hint["text"]
    return (answer.error or {}).get("message", "") if answer.error else ""


def model_view(answer: Answer | InFlight) -> dict:
    """The dict a model reads of an answer."""
    if isinstance(answer, InFlight):
        return {"status": "pending", "replayed": False, "operation": answer.key or "", "note": text_of(answer)}
    view: dict[str, Any] = {"status": answer.status, "replayed": answer.replayed, "operation": answer.key}
    if answer.status in ("completed", "already_done"):
        view["result"] = answer.result
    if answer.error:
        view["error"] = answer.error
    note = text_of(answer)
    if note:
        view["note"] = note
    return view


def call(client: Client, name: str, args: Mapping[str, Any], *, session: str | None = None, wait: float = DEFAULT_WAIT,
         wait_for_approval: float = 0.0, on_awaiting: Callable[[Answer], None] | None = None) -> Answer | InFlight:
    """Calls tool name with args in session (default: the context's), and,
    with wait_for_approval seconds, waits for an operation awaiting approval
    to be decided; its answer is then the decision's (approved and run, or
    denied), the recorded one. on_awaiting is called when that wait begins
    (to tell an approver which operation)."""
    s = session if session is not None else current.get()
    ans = client.call(name, dict(args), session=s, wait=wait)
    if wait_for_approval > 0 and isinstance(ans, AwaitingApproval):
        if on_awaiting is not None:
            on_awaiting(ans)
        deadline = time.monotonic() + wait_for_approval
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            record = client.operation(ans.key, wait=min(60.0, max(1.0, left)))
            if record.get("status") not in _OPEN:
                ans = client.call(name, dict(args), session=s, wait=wait)
                break
    return ans


def status_tool(client: Client) -> Callable[..., dict]:
    """The function idemgate_status, for the model to check an operation that
    is still open (awaiting approval, running, uncertain) instead of calling
    its tool again, as the server's text for such an answer says."""

    def idemgate_status(operation: str, wait_seconds: int = 0) -> dict:
        """The current state of an idemgate operation, waiting up to wait_seconds (0-60) for it to move on. Read-only."""
        wait = min(max(int(wait_seconds), 0), 60)
        record = client.operation(operation, wait=wait or None)
        view = {"status": record.get("status"), "operation": operation}
        for k in ("result", "error", "completed_at"):
            if record.get(k) is not None:
                view[k] = record[k]
        return view

    return idemgate_status


def tool(client: Client, name: str | None = None, *, session: str | Callable[[], str | None] | None = None,
         wait: float = DEFAULT_WAIT, wait_for_approval: float = 0.0,
         raise_errors: bool = False, on_answer: Callable[[Answer | InFlight], None] | None = None,
         on_awaiting: Callable[[Answer], None] | None = None):
    """Decorates a function whose name (or name) is a tool of the workers'
    catalogue and whose named parameters are its arguments: calling it calls
    the tool once per operation. See the module's documentation.

    session, a string or a function answering one, overrides the context's
    session: for a framework that runs tools in threads of its own without
    copying the context."""

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        sig = inspect.signature(fn)
        if any(p.kind == p.VAR_POSITIONAL for p in sig.parameters.values()):
            raise TypeError(f"{fn.__name__}: a tool's arguments are named; *args cannot be")
        tool_name = name or fn.__name__

        @functools.wraps(fn)
        def wrapper(*a: Any, **kw: Any) -> Any:
            bound = sig.bind(*a, **kw)
            args: dict[str, Any] = {}
            for k, v in bound.arguments.items():
                if sig.parameters[k].kind == inspect.Parameter.VAR_KEYWORD:
                    args.update(v)
                else:
                    args[k] = v
            s = session() if callable(session) else session
            ans = call(client, tool_name, args, session=s, wait=wait, wait_for_approval=wait_for_approval,
                       on_awaiting=on_awaiting)
            if on_answer is not None:
                on_answer(ans)
            if raise_errors and not isinstance(ans, Completed):
                err = InFlightError if isinstance(ans, InFlight) else _ERRORS.get(type(ans), ToolError)
                raise err(ans, text_of(ans) or f"{tool_name}: {getattr(ans, 'status', 'pending')}")
            return model_view(ans)

        return wrapper

    return decorate
