"""Ed25519 against RFC 8032's test vectors, and receipts against the Go
implementation's (pkg/audit/testdata/receipts.json)."""

import hashlib
import json
import os
import pathlib
import unittest

from idemgate import Answer, BadReceipt, Client, KeySet, ReceiptError, verify_receipt
from idemgate import ed25519
from idemgate.audit import compact_key

TESTDATA = pathlib.Path(os.environ.get("IDEMGATE_AUDIT_TESTDATA") or
                        pathlib.Path(__file__).resolve().parents[3] / "pkg" / "audit" / "testdata")

# RFC 8032, section 7.1: TEST 1, 2, 3 and SHA(abc) (secret key, public key,
# message, signature).
RFC8032 = [
    ("9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60",
     "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a", "",
     "e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e06522490155"
     "5fb8821590a33bacc61e39701cf9b46bd25bf5f0595bbe24655141438e7a100b"),
    ("4ccd089b28ff96da9db6c346ec114e0f5b8a319f35aba624da8cf6ed4fb8a6fb",
     "3d4017c3e843895a92b70aa74d1b7ebc9c982ccf2ec4968cc0cd55f12af4660c", "72",
     "92a009a9f0d4cab8720e820b5f642540a2b27b5416503f8fb3762223ebdb69da"
     "085ac1e43e15996e458f3613d0f11d8c387b2eaeb4302aeeb00d291612bb0c00"),
    ("c5aa8df43f9f837bedb7442f31dcb7b166d38535076f094b85ce3a2e0b4458f7",
     "fc51cd8e6218a1a38da47ed00230f0580816ed13ba3303ac5deb911548908025", "af82",
     "6291d657deec24024827e69c3abe01a30ce548a284743a445e3680d7db5ac3ac"
     "18ff9b538d16f290ae67f760984dc6594a7c15e9716ed28dc027beceea1ec40a"),
    ("833fe62409237b9d62ec77587520911e9a759cec1d19755b7da901b96dca3d42",
     "ec172b93ad5e563bf4932c70e1245034c35467ef2efd4d64ebf819683467e2bf",
     hashlib.sha512(b"abc").hexdigest(),
     "dc2a4459e7369633a52b1bf277839a00201009a3efbf3ecb69bea2186c26b589"
     "09351fc9ac90b3ecfdfbc7c66431e0303dca179c138ac17ad9bef1177331a704"),
]


class Ed25519(unittest.TestCase):
    def test_rfc8032(self):
        for i, (secret, public, msg, sig) in enumerate(RFC8032):
            with self.subTest(i):
                secret, public, msg, sig = (bytes.fromhex(x) for x in (secret, public, msg, sig))
                self.assertEqual(ed25519.public_key(secret), public)
                self.assertEqual(ed25519.sign(secret, msg), sig)
                self.assertTrue(ed25519.verify(public, msg, sig))

    def test_rejects(self):
        _, public, msg, sig = (bytes.fromhex(x) for x in RFC8032[2])
        self.assertFalse(ed25519.verify(public, msg + b"\x00", sig), "another message")
        self.assertFalse(ed25519.verify(public, msg, sig[:-1] + bytes([sig[-1] ^ 1])), "a bit of S")
        self.assertFalse(ed25519.verify(public, msg, bytes([sig[0] ^ 1]) + sig[1:]), "a bit of R")
        other = bytes.fromhex(RFC8032[1][1])
        self.assertFalse(ed25519.verify(other, msg, sig), "another key")
        self.assertFalse(ed25519.verify(public, msg, sig[:63]), "short")
        # S >= the group order is refused, not reduced.
        q = 2**252 + 27742317777372353535851937790883648493
        s = int.from_bytes(sig[32:], "little") + q
        self.assertFalse(ed25519.verify(public, msg, sig[:32] + s.to_bytes(32, "little")))


class Receipts(unittest.TestCase):
    def test_vectors(self):
        with open(TESTDATA / "receipts.json", encoding="utf-8") as f:
            vectors = json.load(f)
        keys = KeySet.from_json(vectors["keys"])
        self.assertGreaterEqual(len(vectors["cases"]), 15)
        for case in vectors["cases"]:
            # A case a parser must see as written comes as text too.
            answer = case.get("answer_text") or case["answer"]
            with self.subTest(case["name"]):
                if not case["error"]:
                    verify_receipt(answer, keys)
                    continue
                with self.assertRaises(ReceiptError) as cm:
                    verify_receipt(answer, keys)
                self.assertEqual(cm.exception.kind, case["error"], str(cm.exception))

    def test_compact_key(self):
        key = "charge." + "0123456789abcdef" * 4
        self.assertEqual(compact_key(key), "charge.ASNFZ4mrze8BI0VniavN7w")
        self.assertEqual(compact_key("my-own-key"), "my-own-key")


if __name__ == "__main__":
    unittest.main()


class ClientChecks(unittest.TestCase):
    """The client checks the receipt of every answer that carries a result,
    already_done included, and reads an answer's text strictly."""

    def setUp(self):
        with open(TESTDATA / "receipts.json", encoding="utf-8") as f:
            self.vectors = json.load(f)
        self.client = Client("http://127.0.0.1:1", "token", receipt_keys=KeySet.from_json(self.vectors["keys"]))

    def answer(self, name, text=False):
        case = next(c for c in self.vectors["cases"] if c["name"] == name)
        raw = Client._decode(case["answer_text"].encode()) if text else case["answer"]
        return Answer(key=raw["key"], tool=raw["tool"], status=raw["status"], replayed=raw["replayed"],
                      receipt=raw.get("receipt"), raw=raw)

    def test_already_done(self):
        done = self.answer("already_done, with its completion's receipt")
        self.assertIs(self.client._checked(done), done)
        for name in ("already_done, another result", "already_done, a receipt with a junk signature",
                     "already_done without a receipt"):
            with self.subTest(name), self.assertRaises(BadReceipt):
                self.client._checked(self.answer(name))

    def test_repeated_member_name(self):
        with self.assertRaises(BadReceipt) as cm:
            self.client._checked(self.answer("a result repeating a member name, its receipt leaving the result unbound", text=True))
        self.assertIn("invalid", str(cm.exception))
