/**
 * The step of an MCP answer of idemgate's server (toStep) and what a model
 * reads of it (modelText): the server's hint text when it sends one, the
 * answer's notes otherwise, never text of the adapter's own.
 */

import assert from "node:assert/strict";
import { test } from "node:test";
import { IdemTools, modelText, modelView, toStep } from "../tools.js";

const op = (o: Record<string, unknown>) => ({ "io.idemgate/operation": { key: "send_email.k", tool: "send_email", attempts: 1, fingerprint: "f", ...o } });
const text = (t: string) => ({ type: "text", text: t });

test("a first run: the result, no note, the receipt from _meta", () => {
  const sc = { accepted: true };
  const s = toStep("send_email", { structuredContent: sc, content: [text(JSON.stringify(sc))], _meta: op({ status: "completed", replayed: false, receipt: { sig: "x" } }) });
  assert.deepEqual([s.status, s.replayed, s.operation, s.text, s.isError], ["completed", false, "send_email.k", "", false]);
  assert.deepEqual(s.result, { accepted: true });
  assert.deepEqual(s.receipt, { sig: "x" });
  assert.deepEqual(JSON.parse(modelText(s)), { status: "completed", replayed: false, operation: "send_email.k", result: { accepted: true } });
});

test("without a hint, the note is the text items after the structured content's JSON", () => {
  const sc = { accepted: true };
  const s = toStep("send_email", { structuredContent: sc, content: [text(JSON.stringify(sc)), text("Already done, not repeated.")], _meta: op({ status: "completed", replayed: true }) });
  assert.equal(s.replayed, true);
  assert.equal(s.text, "Already done, not repeated.");
  assert.equal(modelView(s).note, "Already done, not repeated.");
});

test("with a hint, its text alone is the note, and the hint is not part of the result", () => {
  // An upstream MCP tool's own content items come before the note: the hint is the note alone.
  const sc = { accepted: true, hint: { code: "replayed", text: "Server text." } };
  const content = [text(JSON.stringify(sc)), text("the upstream's own item"), text("Server text.")];
  const s = toStep("send_email", { structuredContent: sc, content, _meta: op({ status: "completed", replayed: true }) });
  assert.deepEqual(s.hint, { code: "replayed", text: "Server text." });
  assert.equal(s.text, "Server text.");
  assert.deepEqual(s.result, { accepted: true });
});

test("a conflict: its error and the server's text, as an answer", () => {
  const sc = { status: "conflict", operation: "send_email.k", error: { code: "conflict", message: "first used with other arguments" }, hint: { code: "conflict", text: "Conflict: nothing was done." } };
  const s = toStep("send_email", { isError: true, structuredContent: sc, content: [text(JSON.stringify(sc)), text("Conflict: nothing was done.")], _meta: op({ status: "conflict", replayed: false }) });
  assert.deepEqual([s.status, s.isError, s.text, s.result], ["conflict", true, "Conflict: nothing was done.", undefined]);
  assert.deepEqual(s.error, { code: "conflict", message: "first used with other arguments" });
  assert.equal(JSON.parse(modelText(s)).note, "Conflict: nothing was done.");
});

test("a call refused before any operation is an error step with the server's text", () => {
  const s = toStep("nope", { isError: true, content: [text("unknown tool nope")] });
  assert.deepEqual([s.status, s.operation, s.text, s.error?.code], ["error", "", "unknown tool nope", "invalid_call"]);
});

test("IdemTools needs its endpoint", () => {
  assert.throws(() => new IdemTools({} as never), /give url/);
});
