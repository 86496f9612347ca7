// The AI SDK recipe (recipes/ai-sdk.mjs) driven by ai/test's MockLanguageModelV3.
import assert from "node:assert/strict";
import { after, test } from "node:test";
import { MockLanguageModelV3, simulateReadableStream } from "ai/test";
import { runAgent, streamAgent, toolSteps } from "../recipes/ai-sdk.mjs";
import { idem } from "../recipes/connect.mjs";
import * as h from "./harness.mjs";

after(() => idem.close());

const usage = {
  inputTokens: { total: 1, noCache: 1, cacheRead: 0, cacheWrite: 0 },
  outputTokens: { total: 1, text: 1, reasoning: 0 },
};

/** A mock model that plays turns, recording the text of every tool result it reads. */
function scripted(turns) {
  const seen = [];
  let turn = 0;
  const model = new MockLanguageModelV3({
    doGenerate: async (options) => {
      const results = options.prompt.filter((m) => m.role === "tool").flatMap((m) => m.content).filter((p) => p.type === "tool-result");
      if (results.length > seen.length) {
        const out = results.at(-1).output;
        seen.push(out.type === "text" || out.type === "error-text" ? out.value : JSON.stringify(out.value));
      }
      const next = turns[turn++]?.(seen.at(-1));
      if (!next) return { content: [{ type: "text", text: "done" }], finishReason: { unified: "stop", raw: "stop" }, usage, warnings: [] };
      return {
        content: [{ type: "tool-call", toolCallId: `call-${turn}`, toolName: next.tool, input: JSON.stringify(next.args) }],
        finishReason: { unified: "tool-calls", raw: "tool_calls" },
        usage,
        warnings: [],
      };
    },
  });
  return { model, seen };
}

test("ai-sdk: the same call twice fires once; the second step is marked replayed", async () => {
  const sc = h.scenario("replay");
  const { model, seen } = scripted(sc.turns);
  const steps = toolSteps(await runAgent(model, "ship it", h.uniq("run")));
  assert.equal(steps.length, 2);
  assert.equal(steps[0].status, "completed");
  assert.equal(steps[0].replayed, false);
  assert.equal(steps[1].status, "completed");
  assert.equal(steps[1].replayed, true, "the second step says it was replayed");
  assert.equal(steps[1].operation, steps[0].operation);
  assert.ok(steps[0].receipt, "a step carries its receipt");
  assert.match(seen[1], /"replayed":true/);
  h.assertNoAdvice(seen[1], steps[1]);
  assert.equal(h.firedFor(sc), 1, "the sink fired once");
});

test("ai-sdk: a conflict reads as idemgate wrote it and leads to no second firing", async () => {
  const sc = h.scenario("conflict");
  const { model, seen } = scripted(sc.turns);
  const steps = toolSteps(await runAgent(model, "tell them", h.uniq("run")));
  assert.equal(steps.length, 2, `the model stopped after the conflict: ${JSON.stringify(seen)}`);
  assert.equal(steps[1].status, "conflict");
  h.assertNoAdvice(seen[1], steps[1]);
  assert.equal(h.firedFor(sc), 1, "only the first call fired");
});

test("ai-sdk: an approval is waited for, and the operation fires once", async () => {
  const sc = h.scenario("approval");
  const { model } = scripted(sc.turns);
  const result = await runAgent(model, "refund it", h.uniq("run"), {
    waitForApprovalMs: 60_000,
    onAwaitingApproval: (step) => void h.approve(step),
  });
  const steps = toolSteps(result);
  assert.equal(steps.length, 1);
  assert.equal(steps[0].status, "completed", JSON.stringify(steps[0]));
  assert.equal(h.firedFor(sc), 1);
});

test("ai-sdk: one session per run: another run's same call fires, its own repeat replays", async () => {
  const sc = h.scenario("replay");
  const a = toolSteps(await runAgent(scripted(sc.turns).model, "ship it", h.uniq("run-a")));
  const b = toolSteps(await runAgent(scripted(sc.turns).model, "ship it", h.uniq("run-b")));
  assert.notEqual(a[0].operation, b[0].operation, "each run has its own keys");
  assert.deepEqual([a[0].replayed, a[1].replayed, b[0].replayed, b[1].replayed], [false, true, false, true]);
  assert.equal(h.firedFor(sc), 2, "one firing per run");
});

/** The scripted model, streaming its turns. */
function streamed(turns) {
  const seen = [];
  let turn = 0;
  const model = new MockLanguageModelV3({
    doStream: async (options) => {
      const results = options.prompt.filter((m) => m.role === "tool").flatMap((m) => m.content).filter((p) => p.type === "tool-result");
      if (results.length > seen.length) {
        const out = results.at(-1).output;
        seen.push(out.type === "text" ? out.value : JSON.stringify(out.value));
      }
      const next = turns[turn++]?.(seen.at(-1));
      const chunks = [{ type: "stream-start", warnings: [] }];
      if (next) {
        chunks.push({ type: "tool-call", toolCallId: `call-${turn}`, toolName: next.tool, input: JSON.stringify(next.args) });
        chunks.push({ type: "finish", finishReason: { unified: "tool-calls", raw: "tool_calls" }, usage });
      } else {
        chunks.push({ type: "text-start", id: "t" }, { type: "text-delta", id: "t", delta: "done" }, { type: "text-end", id: "t" });
        chunks.push({ type: "finish", finishReason: { unified: "stop", raw: "stop" }, usage });
      }
      return { stream: simulateReadableStream({ chunks }) };
    },
  });
  return { model, seen };
}

test("ai-sdk: streamText takes the same tools: the same call twice fires once, the replay marked", async () => {
  const sc = h.scenario("replay");
  const { model, seen } = streamed(sc.turns);
  const steps = toolSteps(await streamAgent(model, "ship it", h.uniq("run")));
  assert.equal(steps.length, 2, JSON.stringify(seen));
  assert.deepEqual([steps[0].replayed, steps[1].replayed], [false, true]);
  assert.ok(steps[1].receipt);
  h.assertNoAdvice(seen[1], steps[1]);
  assert.equal(h.firedFor(sc), 1);
});
