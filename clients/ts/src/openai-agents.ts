/**
 * idemgate's tools for the OpenAI Agents SDK (`@openai/agents`):
 *
 * ```ts
 * import { IdemTools } from "@idemgate/client/tools";
 * import { openAIAgentsTools } from "@idemgate/client/openai-agents";
 * const idem = new IdemTools({ url: "http://127.0.0.1:8081/mcp", token }); // once per process
 * const agent = new Agent({ name: "ops", tools: await openAIAgentsTools(idem) });
 * await run(agent, "…", { context: { idemgateSession: runId } });
 * ```
 *
 * Each tool answers the model's text ({@link modelText}: the outcome and the
 * server's text) and never throws an operation's outcome, so the SDK's
 * error text ("Please try again") never reaches the model; the step, with
 * its receipt, goes to `onStep`.
 *
 * @packageDocumentation
 */

import { peer } from "./peer.js";
import { IdemTools, modelText, type Step } from "./tools.js";

/** The run context the SDK hands a tool (its `context` is the one given to run()). */
export interface AgentsRunContext {
  context?: unknown;
}

export interface OpenAIAgentsToolsOptions {
  /**
   * The session that scopes the run's keys: a string, or a function of the
   * run context. Default: the run context's `idemgateSession` when it is a
   * string, else the IdemTools' session.
   */
  session?: string | ((runContext: AgentsRunContext | undefined) => string | undefined);
  /** Wait this long (ms) for an operation awaiting approval to be decided. Default: the IdemTools' (0). */
  waitForApprovalMs?: number;
  /** Called when a call awaits approval and the wait begins (with waitForApprovalMs). */
  onAwaitingApproval?: (step: Step) => void;
  /** Called with every call's step (status, replayed, result, receipt). */
  onStep?: (step: Step) => void;
}

/** The catalogue's tools as Agents SDK function tools. */
export async function openAIAgentsTools(idem: IdemTools, opts: OpenAIAgentsToolsOptions = {}): Promise<unknown[]> {
  const agents = await peer("@openai/agents", "openai-agents");
  const out: unknown[] = [];
  for (const spec of await idem.list()) {
    const parameters = { properties: {}, required: [], ...spec.inputSchema, type: "object" };
    out.push(
      agents.tool({
        name: spec.name,
        description: spec.description,
        parameters,
        strict: false,
        execute: async (input: unknown, runContext?: AgentsRunContext, details?: { signal?: AbortSignal }) => {
          const step = await idem.call(spec.name, input, {
            session: sessionOf(opts.session, runContext),
            waitForApprovalMs: opts.waitForApprovalMs,
            onAwaitingApproval: opts.onAwaitingApproval,
            signal: details?.signal,
          });
          opts.onStep?.(step);
          return modelText(step);
        },
        // The adapter's own failures (the server unreachable): the error as it is, without advice.
        errorFunction: (_ctx: unknown, err: unknown) => `idemgate could not be reached: ${String((err as Error)?.message ?? err)}`,
      }),
    );
  }
  return out;
}

function sessionOf(session: OpenAIAgentsToolsOptions["session"], runContext: AgentsRunContext | undefined): string | undefined {
  if (typeof session === "function") return session(runContext);
  if (session !== undefined) return session;
  const ctx = runContext?.context as { idemgateSession?: unknown } | undefined;
  return typeof ctx?.idemgateSession === "string" ? ctx.idemgateSession : undefined;
}
