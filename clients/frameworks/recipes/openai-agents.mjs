// OpenAI Agents JS: idemgate's tools as function tools of an Agent.
import { Agent, run } from "@openai/agents";
import { openAIAgentsTools } from "@idemgate/client/openai-agents";
import { idem } from "./connect.mjs";

// One run of the agent: every tool call of the run is in session runId (the
// run context's idemgateSession), so a call the model repeats is answered
// from the ledger instead of firing again. onStep sees every answer:
// status, replayed, result, receipt.
export async function runAgent(model, prompt, runId, opts = {}) {
  const agent = new Agent({ name: "ops", instructions: "Do what the user asks with the tools.", model, tools: await openAIAgentsTools(idem, opts) });
  return run(agent, prompt, { context: { idemgateSession: runId }, maxTurns: 10 });
}
