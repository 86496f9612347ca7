"""The protocol's test vectors (pkg/intent/testdata), read at test time."""

import json
import os
import pathlib
import unittest

from idemgate import InvalidJSON, KeySpec, derive, derive_envelope, parse_envelope
from idemgate.canonical import canonicalize, es_number, loads

TESTDATA = pathlib.Path(os.environ.get("IDEMGATE_TESTDATA") or
                        pathlib.Path(__file__).resolve().parents[3] / "pkg" / "intent" / "testdata")


def load(name):
    with open(TESTDATA / name, encoding="utf-8") as f:
        return json.load(f)


class Vectors(unittest.TestCase):
    def test_vectors(self):
        vectors = load("vectors.json")
        self.assertGreater(len(vectors), 10)
        for v in vectors:
            with self.subTest(v["name"]):
                ident = derive_envelope(v["envelope"], KeySpec.of(v["spec"]), v["msg_time"] or None)
                self.assertEqual(ident.material, v["material"])
                self.assertEqual(ident.key, v["key"])
                self.assertEqual(ident.fingerprint, v["fingerprint"])

    def test_invalid(self):
        cases = load("invalid.json")
        self.assertGreater(len(cases), 10)
        for c in cases:
            with self.subTest(c["name"]):
                with self.assertRaises(InvalidJSON):
                    parse_envelope(c["envelope"])


class VolatileArgs(unittest.TestCase):
    def test_left_out_of_key_material_and_fingerprint(self):
        # DESIGN: a volatile arg is not part of the operation's identity.
        spec = KeySpec(volatile_args=("requested_at",))
        a = derive("create_ticket", {"title": "Disk full", "requested_at": "09:00"}, spec=spec)
        b = derive("create_ticket", {"title": "Disk full", "requested_at": "09:05"}, spec=spec)
        self.assertEqual(a, b)
        self.assertNotIn("requested_at", a.material)


class Canonical(unittest.TestCase):
    def test_numbers_as_ecmascript_writes_them(self):
        for text, want in [("1.0", "1"), ("-0", "0"), ("1e-7", "1e-7"), ("0.000001", "0.000001"), ("1e21", None),
                           ("123.4560", "123.456"), ("5e-324", "5e-324"),
                           ("0.1", "0.1"), ("1e-6", "0.000001"), ("-25e-11", "-2.5e-10")]:
            with self.subTest(text):
                if want is None:
                    with self.assertRaises(InvalidJSON):  # beyond 2^53
                        loads(text)
                else:
                    self.assertEqual(canonicalize(loads(text)), want)
        self.assertEqual(es_number(1e21), "1e+21")  # doubles beyond 2^53 still format as ECMAScript does
        self.assertEqual(es_number(1.5e20), "150000000000000000000")

    def test_members_sorted_by_utf16_code_units(self):
        self.assertEqual(canonicalize(loads('{"\\ufb33":1,"\\ud83d\\ude00":2,"a":3}')), '{"a":3,"\U0001F600":2,"\ufb33":1}')

    def test_rejects(self):
        for text in ['{"a":1,"a":2}', '"\\ud800"', "NaN", "[1] 2", "1e400", '{"n":9007199254740993}',
                     "[" * 40 + "]" * 40, b'"\xff"']:
            with self.subTest(text):
                with self.assertRaises(InvalidJSON):
                    loads(text)


if __name__ == "__main__":
    unittest.main()
