// What every framework test shares: the stack the Go test started (a real
// worker with the demo tools, cmd/sink, the MCP server, the HTTP front
// door), the sink's log to count firings, the operator's approval, and the
// model every framework drives: scripted, and naive about advice.
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { readFileSync } from "node:fs";

function need(name) {
  const v = process.env[name];
  assert.ok(v, `${name} is not set: these tests run from integration/frameworks_test.go, which starts idemgate`);
  return v;
}

export const env = {
  get sinkLog() { return need("IDEMGATE_SINK_LOG"); },
  get gateway() { return need("IDEMGATE_URL"); },
  get operatorToken() { return need("IDEMGATE_OPERATOR_TOKEN"); },
};

/** A value no other test uses. */
export function uniq(prefix) {
  return `${prefix}-${randomUUID().slice(0, 8)}`;
}

/** The requests the sink performed (answered 200) whose payload matches. */
export function firings(match) {
  let text = "";
  try {
    text = readFileSync(env.sinkLog, "utf8");
  } catch (err) {
    if (err.code !== "ENOENT") throw err;
  }
  return text.split("\n").filter(Boolean).map((l) => JSON.parse(l))
    .filter((e) => e.status === 200 && e.payload !== undefined && match(e.payload)).length;
}

/** Approves an operation as an operator, through the HTTP front door's operator API. */
export async function approve(step) {
  const res = await fetch(`${env.gateway}/v1/operations/${encodeURIComponent(step.operation)}/approve`, {
    method: "POST",
    headers: { Authorization: `Bearer ${env.operatorToken}`, "Content-Type": "application/json" },
    body: JSON.stringify({ fingerprint: step.fingerprint, reason: "framework test" }),
  });
  assert.equal(res.status, 200, `approve ${step.operation}: ${res.status} ${await res.text()}`);
}

/** Advice a framework adds to a tool's error that contradicts idemgate's: each would make a model change the call and fire again. */
export const FRAMEWORK_ADVICE = [/fix your mistakes/i, /try again/i, /error occurred while running the tool/i];

/** Asserts the text a model read carries the server's text and no framework advice. */
export function assertNoAdvice(seen, step) {
  for (const re of FRAMEWORK_ADVICE) assert.doesNotMatch(seen, re, `the model read advice idemgate did not give: ${seen}`);
  if (step?.text) assert.ok(seen.includes(JSON.stringify(step.text).slice(1, -1)) || seen.includes(step.text), `the model read the server's text: ${seen}`);
}

/**
 * The model's turn after a conflict, as a naive model takes it: when the
 * text it reads tells it to fix or retry the call, it calls again with
 * another key argument (which fires); otherwise it stops.
 */
export function naiveAfterConflict(seen, call) {
  if (FRAMEWORK_ADVICE.some((re) => re.test(seen))) {
    return { tool: call.tool, args: { ...call.args, subject: `${call.args.subject} (fixed)` } };
  }
  return null;
}

/**
 * The calls of the scenarios, as the mock models script them. Each entry is
 * a function of the text the model read last (undefined on the first
 * turn), answering the next call or null to stop.
 */
export function scenario(name) {
  const to = `${uniq(name)}@example.com`;
  switch (name) {
    case "replay": {
      const call = { tool: "send_email", args: { to, subject: "Your order shipped", body: "Hi" } };
      return { to, turns: [() => call, () => ({ ...call, args: { ...call.args, body: "Hello again" } })] };
    }
    case "conflict": {
      const first = { tool: "send_email", args: { to, subject: "Refund issued", priority: "high" } };
      const second = { tool: "send_email", args: { to, subject: "Refund issued", priority: "low" } };
      return { to, turns: [() => first, () => second, (seen) => naiveAfterConflict(seen, second)] };
    }
    case "approval": {
      const order = uniq("order");
      return { to: order, order, turns: [() => ({ tool: "refund", args: { order_id: order, amount: 5 } })] };
    }
    default:
      throw new Error(`no scenario ${name}`);
  }
}

/** Firings of the scenario's recipient (send_email) or order (refund). */
export function firedFor(sc) {
  return firings((p) => (sc.order === undefined ? p.to === sc.to : p.order_id === sc.order));
}
