"""The Python wrapper (idemgate.tools) and its recipe, with plain Python,
against the stack integration/frameworks_test.go starts (the HTTP front
door, a worker with the demo tools, cmd/sink)."""

import concurrent.futures
import json
import os
import threading
import unittest
import uuid

import recipe
from idemgate import Client
from idemgate.tools import ConflictError, session, tool

FRAMEWORK_ADVICE = ("fix your mistakes", "try again", "error occurred while running the tool")


def need(name):
    v = os.environ.get(name)
    if not v:
        raise AssertionError(f"{name} is not set: this test runs from integration/frameworks_test.go")
    return v


def fired(match):
    """Requests the sink performed (answered 200) whose payload matches."""
    n = 0
    with open(need("IDEMGATE_SINK_LOG")) as f:
        for line in f:
            e = json.loads(line)
            if e.get("status") == 200 and match(e.get("payload") or {}):
                n += 1
    return n


def uniq(prefix):
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


class Wrapper(unittest.TestCase):
    def test_same_call_twice_fires_once_and_says_replayed(self):
        to = uniq("py") + "@example.com"
        answers = []
        send = tool(recipe.idem, "send_email", on_answer=answers.append)(recipe.send_email.__wrapped__)
        with session(uniq("run")):
            first = send(to=to, subject="Your order shipped", body="Hi")
            again = send(to, "Your order shipped", body="Hello again")  # positional, reworded volatile body
        self.assertEqual((first["status"], first["replayed"]), ("completed", False), first)
        self.assertEqual((again["status"], again["replayed"]), ("completed", True), again)
        self.assertEqual(first["operation"], again["operation"])
        self.assertTrue(answers[0].receipt, "the typed answer carries its receipt")
        self.assertEqual(fired(lambda p: p.get("to") == to), 1)

    def test_conflict_is_the_servers_text_and_fires_nothing(self):
        to = uniq("py") + "@example.com"
        with session(uniq("run")):
            recipe.send_email(to=to, subject="Refund issued", priority="high")
            clash = recipe.send_email(to=to, subject="Refund issued", priority="low")
            self.assertEqual(clash["status"], "conflict", clash)
            seen = json.dumps(clash).lower()
            for advice in FRAMEWORK_ADVICE:
                self.assertNotIn(advice, seen)
            strict = tool(recipe.idem, "send_email", raise_errors=True)(recipe.send_email.__wrapped__)
            with self.assertRaises(ConflictError) as ctx:
                strict(to=to, subject="Refund issued", priority="low")
            self.assertEqual(ctx.exception.answer.status, "conflict")
            self.assertEqual(str(ctx.exception), clash.get("note", str(ctx.exception)))
        self.assertEqual(fired(lambda p: p.get("to") == to), 1, "only the first call fired")

    def test_one_session_per_run_from_the_context(self):
        to = uniq("py") + "@example.com"
        ops = {}

        def run(name):
            with session(name):
                a = recipe.send_email(to=to, subject="Welcome")
                b = recipe.send_email(to=to, subject="Welcome")
            ops[name] = (a, b)

        threads = [threading.Thread(target=run, args=(uniq(r),)) for r in ("run-a", "run-b")]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        (a1, a2), (b1, b2) = ops.values()
        self.assertNotEqual(a1["operation"], b1["operation"], "each run has its own keys")
        self.assertEqual([a1["replayed"], a2["replayed"], b1["replayed"], b2["replayed"]], [False, True, False, True])
        self.assertEqual(fired(lambda p: p.get("to") == to), 2, "one firing per run")

    def test_session_given_to_the_tool_reaches_threads_without_the_context(self):
        to = uniq("py") + "@example.com"
        run = uniq("run")
        send = tool(recipe.idem, "send_email", session=lambda: run)(recipe.send_email.__wrapped__)
        with concurrent.futures.ThreadPoolExecutor(2) as pool:  # its threads do not copy the context
            a, b = pool.map(lambda _: send(to=to, subject="Welcome"), range(2))
        self.assertEqual(a["operation"], b["operation"])
        self.assertEqual(sorted([a["replayed"], b["replayed"]]), [False, True])
        with session(run):
            self.assertTrue(recipe.send_email(to=to, subject="Welcome")["replayed"], "the same session as the context's")
        self.assertEqual(fired(lambda p: p.get("to") == to), 1)

    def test_approval_is_waited_for(self):
        order = uniq("order")
        operator = Client(need("IDEMGATE_URL"), need("IDEMGATE_OPERATOR_TOKEN"))
        with session(uniq("run")):
            first = recipe.refund(order_id=order, amount=5)
            self.assertEqual(first["status"], "awaiting_approval", first)
            self.assertEqual(recipe.idemgate_status(first["operation"])["status"], "awaiting_approval")
            approvals = []

            def approve(ans):  # the wait has begun: now the operator approves
                approvals.append(threading.Thread(target=operator.approve, args=(ans.key,), kwargs={"fingerprint": ans.fingerprint}))
                approvals[-1].start()

            waiting = tool(recipe.idem, "refund", wait_for_approval=60, on_awaiting=approve)(recipe.refund.__wrapped__)
            waited = waiting(order_id=order, amount=5)
            for t in approvals:
                t.join()
        self.assertEqual(waited["status"], "completed", waited)
        self.assertEqual(recipe.idemgate_status(first["operation"])["status"], "completed")
        self.assertEqual(fired(lambda p: p.get("order_id") == order), 1)


if __name__ == "__main__":
    unittest.main()
