// LangGraph JS: idemgate's tools in a graph's ToolNode (here through
// createReactAgent; a StateGraph of your own takes new ToolNode(tools)).
import { MemorySaver } from "@langchain/langgraph";
import { createReactAgent } from "@langchain/langgraph/prebuilt";
import { langchainTools } from "@idemgate/client/langchain";
import { idem } from "./connect.mjs";

// The graph, built once. Every tool call of a run is in the session of its
// thread (configurable.thread_id), so a call the model repeats — in this
// run, or when the thread is resumed from its checkpoint — is answered from
// the ledger instead of firing again. Each ToolMessage's artifact is the
// answer: status, replayed, result, receipt.
export async function buildAgent(llm, opts = {}) {
  return createReactAgent({ llm, tools: await langchainTools(idem, opts), checkpointer: new MemorySaver() });
}

export async function runAgent(agent, prompt, threadId) {
  return agent.invoke({ messages: [{ role: "user", content: prompt }] }, { configurable: { thread_id: threadId } });
}

// The answers of a run's tool calls.
export function toolSteps(state) {
  return state.messages.filter((m) => m.getType() === "tool").map((m) => m.artifact);
}
