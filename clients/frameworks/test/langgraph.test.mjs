// The LangGraph JS recipe (recipes/langgraph.mjs) driven by a fake chat
// model of @langchain/core's testing utilities that binds tools and calls
// them as scripted.
import assert from "node:assert/strict";
import { after, test } from "node:test";
import { AIMessage } from "@langchain/core/messages";
import { FakeStreamingChatModel } from "@langchain/core/utils/testing";
import { buildAgent, runAgent, toolSteps } from "../recipes/langgraph.mjs";
import { idem } from "../recipes/connect.mjs";
import * as h from "./harness.mjs";

after(() => idem.close());

/** FakeStreamingChatModel, playing turns and recording the content of every tool message it reads. */
class ScriptedModel extends FakeStreamingChatModel {
  constructor(turns) {
    super({});
    this.turns = turns;
    this.turn = 0;
    this.seen = [];
  }
  bindTools() {
    return this;
  }
  async _generate(messages) {
    const results = messages.filter((m) => m.getType() === "tool");
    if (results.length > this.seen.length) {
      const c = results.at(-1).content;
      this.seen.push(typeof c === "string" ? c : JSON.stringify(c));
    }
    const next = this.turns[this.turn++]?.(this.seen.at(-1));
    const message = next
      ? new AIMessage({ content: "", tool_calls: [{ id: `call-${this.turn}`, name: next.tool, args: next.args, type: "tool_call" }] })
      : new AIMessage("done");
    return { generations: [{ text: "", message }] };
  }
}

async function agentRun(turns, threadId, opts = {}) {
  const llm = new ScriptedModel(turns);
  const agent = await buildAgent(llm, opts);
  return { steps: toolSteps(await runAgent(agent, "go", threadId)), seen: llm.seen };
}

test("langgraph: the same call twice fires once; the second step is marked replayed", async () => {
  const sc = h.scenario("replay");
  const { steps, seen } = await agentRun(sc.turns, h.uniq("thread"));
  assert.equal(steps.length, 2);
  assert.deepEqual([steps[0].status, steps[0].replayed, steps[1].status, steps[1].replayed], ["completed", false, "completed", true]);
  assert.equal(steps[1].operation, steps[0].operation);
  assert.ok(steps[0].receipt, "a step carries its receipt");
  assert.match(seen[1], /"replayed":true/);
  h.assertNoAdvice(seen[1], steps[1]);
  assert.equal(h.firedFor(sc), 1, "the sink fired once");
});

test("langgraph: a conflict reads as idemgate wrote it (ToolNode adds nothing) and leads to no second firing", async () => {
  const sc = h.scenario("conflict");
  const { steps, seen } = await agentRun(sc.turns, h.uniq("thread"));
  assert.equal(seen.length, 2, `the model stopped after the conflict: ${JSON.stringify(seen)}`);
  assert.equal(steps[1]?.status, "conflict");
  h.assertNoAdvice(seen[1], steps[1]);
  assert.equal(h.firedFor(sc), 1, "only the first call fired");
});

test("langgraph: an approval is waited for, and the operation fires once", async () => {
  const sc = h.scenario("approval");
  const { steps } = await agentRun(sc.turns, h.uniq("thread"), { waitForApprovalMs: 60_000, onAwaitingApproval: (s) => void h.approve(s) });
  assert.equal(steps.length, 1);
  assert.equal(steps[0].status, "completed", JSON.stringify(steps[0]));
  assert.equal(h.firedFor(sc), 1);
});

test("langgraph: the session is the thread: another thread's same call fires, its own repeat replays", async () => {
  const sc = h.scenario("replay");
  const a = (await agentRun(sc.turns, h.uniq("thread-a"))).steps;
  const b = (await agentRun(sc.turns, h.uniq("thread-b"))).steps;
  assert.notEqual(a[0].operation, b[0].operation, "each thread has its own keys");
  assert.deepEqual([a[0].replayed, a[1].replayed, b[0].replayed, b[1].replayed], [false, true, false, true]);
  assert.equal(h.firedFor(sc), 2, "one firing per thread");
});
