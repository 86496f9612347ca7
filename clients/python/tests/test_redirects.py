"""The client follows no redirect: a server that answers 3xx never gets the
bearer token (nor a call's arguments) to another host. Two real local HTTP
servers: the one the client is pointed at redirects every request to the
other, which records what reaches it."""

import http.server
import threading
import unittest

from idemgate import Client, Redirected

TOKEN = "idg_secret-token-of-the-test"


class _Recorder(http.server.BaseHTTPRequestHandler):
    """Records every request (method, path, Authorization) and answers 200."""

    def _handle(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        self.server.seen.append((self.command, self.path, self.headers.get("Authorization"), body))
        if self.server.redirect_to:
            self.send_response(self.server.status)
            self.send_header("Location", self.server.redirect_to + self.path)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        data = b'{"tools": [], "status": "completed", "key": "k", "tool": "t", "replayed": false}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_DELETE = do_PUT = _handle

    def log_message(self, *args):
        pass


def _serve(redirect_to=None, status=302):
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    srv.seen, srv.redirect_to, srv.status = [], redirect_to, status
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, f"http://127.0.0.1:{srv.server_address[1]}"


class NoRedirects(unittest.TestCase):
    def setUp(self):
        self.elsewhere, self.elsewhere_url = _serve()
        self.addCleanup(self.elsewhere.server_close)
        self.addCleanup(self.elsewhere.shutdown)

    def test_no_request_follows_a_redirect(self):
        for status in (301, 302, 303, 307, 308):
            door, url = _serve(self.elsewhere_url, status)
            self.addCleanup(door.server_close)
            self.addCleanup(door.shutdown)
            client = Client(url, TOKEN, namespace="team-a")
            for what, request in {
                "call (POST)": lambda: client.call("send_email", {"to": "ada@example.com"}, wait=2),
                "operation (GET)": lambda: client.operation("send_email.k"),
                "tools (GET)": client.tools,
                "forget (DELETE)": lambda: client.forget("send_email.k"),
                "approve (POST)": lambda: client.approve("send_email.k", wait=2),
            }.items():
                with self.subTest(status=status, request=what):
                    with self.assertRaises(Redirected) as caught:
                        request()
                    self.assertEqual(caught.exception.status, status)
                    self.assertTrue(caught.exception.location.startswith(self.elsewhere_url), caught.exception.location)
                    self.assertIn("does not follow", str(caught.exception))
            self.assertTrue(door.seen, "the front door itself was asked")
            self.assertTrue(all(auth == "Bearer " + TOKEN for _, _, auth, _ in door.seen))
        self.assertEqual(self.elsewhere.seen, [], "nothing reached the other host: no token, no arguments")

    def test_without_a_redirect_the_token_goes_to_the_front_door(self):
        client = Client(self.elsewhere_url, TOKEN, namespace="team-a")
        client.tools()
        self.assertEqual([(m, p, a) for m, p, a, _ in self.elsewhere.seen], [("GET", "/v1/tools", "Bearer " + TOKEN)])


if __name__ == "__main__":
    unittest.main()
