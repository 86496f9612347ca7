/**
 * idemgate's tools for LangChain and LangGraph JS (`@langchain/core`):
 *
 * ```ts
 * import { IdemTools } from "@idemgate/client/tools";
 * import { langchainTools } from "@idemgate/client/langchain";
 * const idem = new IdemTools({ url: "http://127.0.0.1:8081/mcp", token }); // once per process
 * const tools = await langchainTools(idem);           // ToolNode(tools), createReactAgent({ tools })
 * await graph.invoke(input, { configurable: { thread_id: "run-7" } });
 * ```
 *
 * The session is the run's `configurable.idemgate_session`, else its
 * `thread_id`. Each tool answers `content_and_artifact`: the content is
 * what the model reads ({@link modelText}: the outcome and the server's
 * text), the artifact the {@link Step} with its receipt. An operation's
 * outcome is never thrown, so ToolNode's error handling adds nothing to it.
 *
 * @packageDocumentation
 */

import { peer } from "./peer.js";
import { IdemTools, modelText, type Step } from "./tools.js";

/** The part of a LangChain RunnableConfig the tools read. */
export interface LangChainConfig {
  configurable?: Record<string, unknown>;
  signal?: AbortSignal;
}

export interface LangChainToolsOptions {
  /**
   * The session that scopes the run's keys: a string, or a function of the
   * run's config. Default: `configurable.idemgate_session`, else
   * `configurable.thread_id`, else the IdemTools' session.
   */
  session?: string | ((config: LangChainConfig | undefined) => string | undefined);
  /** Wait this long (ms) for an operation awaiting approval to be decided. Default: the IdemTools' (0). */
  waitForApprovalMs?: number;
  /** Called when a call awaits approval and the wait begins (with waitForApprovalMs). */
  onAwaitingApproval?: (step: Step) => void;
}

/** The catalogue's tools as LangChain structured tools. */
export async function langchainTools(idem: IdemTools, opts: LangChainToolsOptions = {}): Promise<unknown[]> {
  const lc = await peer("@langchain/core/tools", "langchain");
  const out: unknown[] = [];
  for (const spec of await idem.list()) {
    out.push(
      lc.tool(
        async (input: unknown, config?: LangChainConfig): Promise<[string, Step]> => {
          const step = await idem.call(spec.name, input, {
            session: sessionOf(opts.session, config),
            waitForApprovalMs: opts.waitForApprovalMs,
            onAwaitingApproval: opts.onAwaitingApproval,
            signal: config?.signal,
          });
          return [modelText(step), step];
        },
        { name: spec.name, description: spec.description, schema: spec.inputSchema, responseFormat: "content_and_artifact" },
      ),
    );
  }
  return out;
}

function sessionOf(session: LangChainToolsOptions["session"], config: LangChainConfig | undefined): string | undefined {
  if (typeof session === "function") return session(config);
  if (session !== undefined) return session;
  const c = config?.configurable;
  for (const k of ["idemgate_session", "thread_id"]) {
    const v = c?.[k];
    if (typeof v === "string" && v !== "") return v;
  }
  return undefined;
}
