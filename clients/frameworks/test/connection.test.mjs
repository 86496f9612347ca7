// The recipes' one IdemTools (recipes/connect.mjs): one MCP session serves
// every call of every run, and when the server has ended it (an idle
// session evicted, a restart) the next call opens another and is answered.
import assert from "node:assert/strict";
import { after, test } from "node:test";
import { idem } from "../recipes/connect.mjs";
import * as h from "./harness.mjs";

after(() => idem.close());

test("connection: one MCP session for every call; a session the server ended is opened again", async () => {
  const to = `${h.uniq("conn")}@example.com`;
  const runA = h.uniq("run-a");
  const first = await idem.call("send_email", { to, subject: "Welcome" }, { session: runA });
  const sid = idem.mcpSessionId;
  assert.ok(sid, "an MCP session is open");
  await idem.call("send_email", { to, subject: "Welcome" }, { session: h.uniq("run-b") });
  await idem.call("send_email", { to, subject: "Welcome" }, { session: h.uniq("run-c") });
  assert.equal(idem.mcpSessionId, sid, "no MCP session opened per call or per run");
  assert.ok((await idem.list()).some((t) => t.name === "idemgate_status"), "the tools include idemgate_status, which the server's texts name");

  // The server ends the session, as its idle eviction or a restart does.
  const res = await fetch(process.env.IDEMGATE_MCP_URL, {
    method: "DELETE",
    headers: { "Mcp-Session-Id": sid, Authorization: `Bearer ${process.env.IDEMGATE_TOKEN}` },
  });
  assert.ok(res.ok, `DELETE the MCP session: ${res.status}`);

  const again = await idem.call("send_email", { to, subject: "Welcome" }, { session: runA });
  assert.equal(again.status, "completed", JSON.stringify(again));
  assert.equal(again.replayed, true, "run-a's call, repeated on the new MCP session, is replayed");
  assert.equal(again.operation, first.operation);
  assert.notEqual(idem.mcpSessionId, sid, "a new MCP session");
  assert.equal(h.firings((p) => p.to === to), 3, "three runs: three operations, each fired once");
});
