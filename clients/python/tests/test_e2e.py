"""End to end against a real front door and worker: run by the Go test
integration/python_test.go, which starts them and sets the IDEMGATE_* variables.
Skipped without them."""

import base64
import concurrent.futures
import os
import time
import unittest

from idemgate import (AwaitingApproval, BadReceipt, Client, Completed, Conflict, Forbidden, IdemgateError, KeySet, NotFound,
                      ReceiptError, Rejected, verify_receipt)
from idemgate.tools import text_of

URL = os.environ.get("IDEMGATE_URL")


@unittest.skipUnless(URL, "IDEMGATE_URL is not set: no front door to test against")
class EndToEnd(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.agent = Client(URL, os.environ["IDEMGATE_TOKEN"], namespace=os.environ["IDEMGATE_NAMESPACE"])
        cls.other = Client(URL, os.environ["IDEMGATE_OTHER_TOKEN"])
        cls.operator = Client(URL, os.environ["IDEMGATE_OPERATOR_TOKEN"])

    def test_fire_replay_conflict(self):
        args = {"to": "ada@example.com", "subject": "Your order shipped", "body": "Hi Ada"}
        first = self.agent.call("send_email", args, session="run-7")
        self.assertIsInstance(first, Completed, first)
        self.assertFalse(first.replayed)
        self.assertEqual(first.http_status, 200)
        # body is volatile: a reworded repeat is the same operation, replayed.
        again = self.agent.call("send_email", dict(args, body="Hello Ada"), session="run-7")
        self.assertIsInstance(again, Completed)
        self.assertTrue(again.replayed)
        self.assertEqual((again.key, again.result), (first.key, first.result))
        # The key the client derives is the front door's.
        self.assertEqual(self.agent.derive("send_email", args, session="run-7").key, first.key)

        mine = self.agent.call("send_email", {"to": "bob@example.com", "subject": "Receipt"}, key="receipt-1")
        self.assertIsInstance(mine, Completed)
        clash = self.agent.call("send_email", {"to": "bob@example.com", "subject": "Receipt, again"}, key="receipt-1")
        self.assertIsInstance(clash, Conflict)
        self.assertEqual(clash.http_status, 422)
        self.assertEqual(clash.code, "conflict")

        bad = self.agent.call("no_such_tool", {})
        self.assertIsInstance(bad, Rejected)
        self.assertEqual(bad.code, "unknown_tool")
        self.assertIn("Nothing was done", text_of(bad), "the door's refusal carries the model's text")

    def test_fifty_concurrent_identical_calls_fire_once(self):
        args = {"title": "python-concurrent"}
        with concurrent.futures.ThreadPoolExecutor(50) as pool:
            answers = list(pool.map(lambda _: self.agent.call("create_ticket", args, session="load"), range(50)))
        self.assertTrue(all(isinstance(a, Completed) for a in answers), answers)
        self.assertEqual(sum(not a.replayed for a in answers), 1, "one call fired")
        self.assertEqual(sum(a.replayed for a in answers), 49, "49 replays")
        self.assertEqual(len({(a.key, str(a.result)) for a in answers}), 1, "one key, one result")
        print("concurrent key", answers[0].key)

    def test_approval_and_scoping(self):
        parked = self.agent.call("refund", {"order_id": "o-77", "amount": 7})
        self.assertIsInstance(parked, AwaitingApproval, parked)
        self.assertEqual(parked.http_status, 202)
        self.assertEqual(parked.location, "/v1/operations/" + parked.key)

        # Another agent neither sees nor lists it; only operators list.
        with self.assertRaises(NotFound):
            self.other.operation(parked.key)
        with self.assertRaises(Forbidden):
            self.other.records(status="open")
        with self.assertRaises(Forbidden):
            self.agent.approve(parked.key)

        # A listing shows each operation's ledger key (docs/protocol.md 6.2):
        # the tool and 22 base64url characters of the digest's first 16 bytes.
        tool, digest = parked.key.rsplit(".", 1)
        stored = tool + "." + base64.urlsafe_b64encode(bytes.fromhex(digest[:32])).decode().rstrip("=")
        waiting = [r["key"] for r in self.operator.iter_records(status="awaiting_approval", limit=1)]
        self.assertIn(stored, waiting)
        done = self.operator.approve(parked.key, fingerprint=parked.fingerprint, reason="checked")
        self.assertIsInstance(done, Completed, done)
        rec = self.agent.operation(parked.key, wait=10)
        self.assertEqual(rec["status"], "completed")
        self.assertEqual(rec["decision"]["by"], "ops")
        again = self.agent.call("refund", {"order_id": "o-77", "amount": 7})
        self.assertIsInstance(again, Completed)
        self.assertTrue(again.replayed)

    def test_forget(self):
        done = self.agent.call("echo", {"n": 1}, session="forget")
        self.assertIsInstance(done, Completed)
        out = self.operator.forget(done.key)
        self.assertEqual(out["forgotten"], done.key)
        tomb = self.agent.operation(done.key)  # the forgotten record says who forgot it
        self.assertEqual(tomb["status"], "forgotten")
        self.assertEqual(tomb["decision"]["op"], "forget")

        # An unresolved operation is refused unless forced.
        parked = self.agent.call("refund", {"order_id": "o-forget", "amount": 1})
        self.assertIsInstance(parked, AwaitingApproval, parked)
        with self.assertRaises(IdemgateError) as refused:
            self.operator.forget(parked.key)
        self.assertEqual((refused.exception.status, refused.exception.code), (409, "unresolved"))
        self.assertIn("force", refused.exception.detail)
        self.assertEqual(self.operator.forget(parked.key, force=True)["record"]["status"], "awaiting_approval")

    def test_derive_learns_the_namespace(self):
        # The other agent's client was given no namespace: it learns its
        # token's from the front door, and derives the front door's key.
        args = {"to": "cy@example.com", "subject": "Derived"}
        done = self.other.call("send_email", args, session="run-9")
        self.assertIsInstance(done, Completed, done)
        self.assertEqual(self.other.derive("send_email", args, session="run-9").key, done.key)
        self.assertIsNotNone(self.other.namespace)
        # A namespace that is not the token's is refused, not used.
        wrong = Client(URL, os.environ["IDEMGATE_TOKEN"], namespace=self.other.namespace)
        with self.assertRaises(ValueError):
            wrong.derive("send_email", args, session="run-9")

    def test_receipts_and_history(self):
        keys = self.agent.audit_keys()
        self.assertGreaterEqual(len(keys), 1)
        checked = Client(URL, os.environ["IDEMGATE_TOKEN"], namespace=os.environ["IDEMGATE_NAMESPACE"], receipt_keys=keys)
        first = checked.call("echo", {"n": "receipt"}, session="audit")
        self.assertIsInstance(first, Completed, first)
        self.assertEqual(first.receipt["kind"], "outcome")
        self.assertEqual(verify_receipt(first.raw, keys)["key"], first.key)
        again = checked.call("echo", {"n": "receipt"}, session="audit")
        self.assertTrue(again.replayed)
        self.assertEqual(again.receipt, first.receipt, "a replay carries the receipt of the outcome")

        # A receipt vouches for its own answer only.
        other = checked.call("echo", {"n": "other"}, session="audit")
        swapped = dict(first.raw, receipt=other.receipt)
        with self.assertRaises(ReceiptError) as cm:
            verify_receipt(swapped, keys)
        self.assertEqual(cm.exception.kind, "mismatch")
        # A client that trusts no key refuses the answer.
        with self.assertRaises(BadReceipt) as cm:
            Client(URL, os.environ["IDEMGATE_TOKEN"], receipt_keys=KeySet([])).call("echo", {"n": "receipt"}, session="audit")
        self.assertEqual(cm.exception.kind, "unknown_signer")

        # The operation's history; a forget joins it, with who and why.
        self.operator.forget(first.key, reason="python test")
        deadline = time.monotonic() + 120
        while True:
            kinds = [e["event"]["kind"] for e in self.operator.history(first.key)]
            if "forgotten" in kinds or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        # Claimed and fired at once: one fired event records both.
        self.assertEqual(kinds[:2], ["fired", "outcome"], kinds)
        fired = self.operator.history(first.key)[0]["event"]
        self.assertTrue(fired["args_digest"] and fired["fingerprint"] == first.fingerprint, fired)
        self.assertIn("forgotten", kinds)
        forgotten = [e["event"] for e in self.operator.history(first.key) if e["event"]["kind"] == "forgotten"][0]
        self.assertEqual((forgotten["by"], forgotten["reason"]), ("ops", "python test"))
        with self.assertRaises(Forbidden):
            self.agent.history(first.key)


if __name__ == "__main__":
    unittest.main()
