// The OpenAI Agents JS recipe (recipes/openai-agents.mjs) driven by a model
// of the SDK's own Model interface, scripted to call tools.
import assert from "node:assert/strict";
import { after, test } from "node:test";
import { Usage } from "@openai/agents";
import { runAgent } from "../recipes/openai-agents.mjs";
import { idem } from "../recipes/connect.mjs";
import * as h from "./harness.mjs";

after(() => idem.close());

/** A Model that plays turns, recording the output of every tool result it reads. */
function scripted(turns) {
  const seen = [];
  let turn = 0;
  const model = {
    async getResponse(request) {
      const items = Array.isArray(request.input) ? request.input : [];
      const results = items.filter((i) => i.type === "function_call_result");
      if (results.length > seen.length) {
        const out = results.at(-1).output;
        seen.push(typeof out === "string" ? out : out?.type === "text" ? out.text : JSON.stringify(out));
      }
      const next = turns[turn++]?.(seen.at(-1));
      const output = next
        ? [{ type: "function_call", callId: `call-${turn}`, name: next.tool, arguments: JSON.stringify(next.args), status: "completed" }]
        : [{ type: "message", role: "assistant", status: "completed", content: [{ type: "output_text", text: "done" }] }];
      return { usage: new Usage(), output, responseId: `resp-${turn}` };
    },
    // eslint-disable-next-line require-yield
    async *getStreamedResponse() {
      throw new Error("not streamed");
    },
  };
  return { model, seen };
}

async function agentRun(turns, runId, opts = {}) {
  const { model, seen } = scripted(turns);
  const steps = [];
  await runAgent(model, "go", runId, { ...opts, onStep: (s) => steps.push(s) });
  return { steps, seen };
}

test("openai-agents: the same call twice fires once; the second step is marked replayed", async () => {
  const sc = h.scenario("replay");
  const { steps, seen } = await agentRun(sc.turns, h.uniq("run"));
  assert.equal(steps.length, 2);
  assert.deepEqual([steps[0].status, steps[0].replayed, steps[1].status, steps[1].replayed], ["completed", false, "completed", true]);
  assert.equal(steps[1].operation, steps[0].operation);
  assert.ok(steps[0].receipt, "a step carries its receipt");
  assert.match(seen[1], /"replayed":true/);
  h.assertNoAdvice(seen[1], steps[1]);
  assert.equal(h.firedFor(sc), 1, "the sink fired once");
});

test("openai-agents: a conflict reads as idemgate wrote it and leads to no second firing", async () => {
  const sc = h.scenario("conflict");
  const { steps, seen } = await agentRun(sc.turns, h.uniq("run"));
  assert.equal(steps.length, 2, `the model stopped after the conflict: ${JSON.stringify(seen)}`);
  assert.equal(steps[1].status, "conflict");
  h.assertNoAdvice(seen[1], steps[1]);
  assert.equal(h.firedFor(sc), 1, "only the first call fired");
});

test("openai-agents: an approval is waited for, and the operation fires once", async () => {
  const sc = h.scenario("approval");
  const { steps } = await agentRun(sc.turns, h.uniq("run"), { waitForApprovalMs: 60_000, onAwaitingApproval: (s) => void h.approve(s) });
  assert.equal(steps.length, 1);
  assert.equal(steps[0].status, "completed", JSON.stringify(steps[0]));
  assert.equal(h.firedFor(sc), 1);
});

test("openai-agents: one session per run: another run's same call fires, its own repeat replays", async () => {
  const sc = h.scenario("replay");
  const a = (await agentRun(sc.turns, h.uniq("run-a"))).steps;
  const b = (await agentRun(sc.turns, h.uniq("run-b"))).steps;
  assert.notEqual(a[0].operation, b[0].operation, "each run has its own keys");
  assert.deepEqual([a[0].replayed, a[1].replayed, b[0].replayed, b[1].replayed], [false, true, false, true]);
  assert.equal(h.firedFor(sc), 2, "one firing per run");
});
