/**
 * idemgate's tools for the Vercel AI SDK (`generateText`, `streamText`):
 *
 * ```ts
 * import { IdemTools } from "@idemgate/client/tools";
 * import { aiSdkTools } from "@idemgate/client/ai-sdk";
 * const idem = new IdemTools({ url: "http://127.0.0.1:8081/mcp", token }); // once per process
 * const { steps } = await generateText({ model, prompt, tools: await aiSdkTools(idem, { session: runId }) });
 * ```
 *
 * Each tool's `execute` answers the call's {@link Step} (status, replayed,
 * result, receipt), kept in the run's steps; the model reads only
 * {@link modelText}: the outcome and the server's text.
 *
 * @packageDocumentation
 */

import { peer } from "./peer.js";
import { IdemTools, modelText, type Step } from "./tools.js";

/** What an AI SDK tool's execute is given besides the input. */
export interface AiSdkCallOptions {
  toolCallId: string;
  abortSignal?: AbortSignal;
  experimental_context?: unknown;
}

export interface AiSdkToolsOptions {
  /**
   * The session that scopes the run's keys: a string (build the tools per
   * run), or a function of the call's options (e.g. of
   * `experimental_context`). Default: `experimental_context.idemgateSession`
   * when it is a string, else the IdemTools' session.
   */
  session?: string | ((options: AiSdkCallOptions) => string | undefined);
  /** Wait this long (ms) for an operation awaiting approval to be decided. Default: the IdemTools' (0). */
  waitForApprovalMs?: number;
  /** Called when a call awaits approval and the wait begins (with waitForApprovalMs). */
  onAwaitingApproval?: (step: Step) => void;
}

/** The catalogue's tools as an AI SDK ToolSet. */
export async function aiSdkTools(idem: IdemTools, opts: AiSdkToolsOptions = {}): Promise<Record<string, unknown>> {
  const ai = await peer("ai", "ai-sdk");
  const out: Record<string, unknown> = {};
  for (const spec of await idem.list()) {
    out[spec.name] = ai.tool({
      description: spec.description,
      inputSchema: ai.jsonSchema(spec.inputSchema),
      execute: (input: unknown, options: AiSdkCallOptions): Promise<Step> =>
        idem.call(spec.name, input, {
          session: sessionOf(opts.session, options),
          waitForApprovalMs: opts.waitForApprovalMs,
          onAwaitingApproval: opts.onAwaitingApproval,
          signal: options?.abortSignal,
        }),
      toModelOutput: ({ output }: { output: Step }) => ({ type: "text", value: modelText(output) }),
    });
  }
  return out;
}

function sessionOf(session: AiSdkToolsOptions["session"], options: AiSdkCallOptions): string | undefined {
  if (typeof session === "function") return session(options);
  if (session !== undefined) return session;
  const ctx = options?.experimental_context as { idemgateSession?: unknown } | undefined;
  return typeof ctx?.idemgateSession === "string" ? ctx.idemgateSession : undefined;
}
