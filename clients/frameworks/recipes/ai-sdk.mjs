// Vercel AI SDK 6: idemgate's tools in generateText (streamText alike).
import { generateText, stepCountIs, streamText } from "ai";
import { aiSdkTools } from "@idemgate/client/ai-sdk";
import { idem } from "./connect.mjs";

// One run of the agent: every tool call of the run is in session runId, so a
// call the model repeats — in this run, or when the run is resumed under the
// same id — is answered from the ledger instead of firing again.
export async function runAgent(model, prompt, runId, opts = {}) {
  return generateText({
    model,
    prompt,
    stopWhen: stepCountIs(10),
    tools: await aiSdkTools(idem, { session: runId, ...opts }),
  });
}

// The same run, streamed.
export async function streamAgent(model, prompt, runId, opts = {}) {
  const result = streamText({
    model,
    prompt,
    stopWhen: stepCountIs(10),
    tools: await aiSdkTools(idem, { session: runId, ...opts }),
  });
  await result.consumeStream();
  return { steps: await result.steps };
}

// Each step's tool results are idemgate's answers: status, replayed, result, receipt.
export function toolSteps(result) {
  return result.steps.flatMap((s) => s.toolResults.map((r) => r.output));
}
