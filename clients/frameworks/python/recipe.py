"""Python agents (LangGraph, LangChain, the OpenAI Agents SDK, CrewAI):
idemgate's tools as plain functions, with the standard-library client.

Give the functions to the framework as it takes any function:
``ToolNode([send_email, refund])`` or ``@tool`` in LangChain/LangGraph,
``function_tool(send_email)`` in the OpenAI Agents SDK, ``@tool`` in CrewAI.
Run each agent run inside ``with session(run_id):`` (LangGraph: the
thread_id), so that every call of the run is in its session. Give the
model idemgate_status too: the text of an answer still open (awaiting
approval, running) tells it to check with it instead of calling again.
"""

import os

from idemgate import Client
from idemgate.tools import session, status_tool, tool  # noqa: F401  (session: for the caller)

idem = Client(os.environ.get("IDEMGATE_URL", "http://127.0.0.1:8080"),
              os.environ.get("IDEMGATE_TOKEN") or open("data/agent.token").read().strip())


@tool(idem)
def send_email(to: str, subject: str, body: str = "", **extra) -> dict:
    """Send an email to a customer."""


@tool(idem)
def refund(order_id: str, amount: float) -> dict:
    """Refund an order (an operator approves each refund)."""


idemgate_status = status_tool(idem)
