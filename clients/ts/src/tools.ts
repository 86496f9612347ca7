/**
 * The workers' tools as an agent framework calls them, through idemgate's
 * MCP server: one connection per {@link IdemTools}, the catalogue with each
 * tool's input schema, and every call scoped by a session and answered as a
 * {@link Step}. The framework adapters (`@idemgate/client/ai-sdk`,
 * `/openai-agents`, `/langchain`) build their tools on it.
 *
 * The text a model reads is the server's (`structuredContent.hint.text`, or
 * the answer's notes while a server sends no hint): an adapter passes it on
 * and adds no advice of its own.
 *
 * Needs the optional peer dependency `@modelcontextprotocol/sdk`.
 *
 * @packageDocumentation
 */

import type { Client } from "@modelcontextprotocol/sdk/client/index.js";

/** The `_meta` member that names a call's session (docs/mcp.md, "The key"). */
export const META_SESSION = "io.idemgate/session";
/** The `_meta` member of every answer that describes its operation. */
export const META_OPERATION = "io.idemgate/operation";
/** The read-only tool that answers an operation's current state. */
export const STATUS_TOOL = "idemgate_status";

/** Statuses after which an operation may still change: waiting for approval can wait past them. */
const OPEN = new Set(["awaiting_approval", "approved", "pending"]);

/** What the server tells the model about an answer: a code and the text. */
export interface Hint {
  code: string;
  text: string;
}

/** One tool call's answer, as every adapter hands it to its framework. */
export interface Step {
  /** The tool called. */
  tool: string;
  /** The operation's key (empty when the call was refused before it made one). */
  operation: string;
  /** completed, conflict, failed, rejected, denied, already_done, awaiting_approval, approved, uncertain, pending, or error (refused before any operation). */
  status: string;
  /** True when an earlier call caused this outcome: nothing ran for this call. */
  replayed: boolean;
  /** The effect's result, for a completed (or already_done) operation. */
  result?: unknown;
  /** The error of a final answer that is not a success. */
  error?: { code: string; message: string };
  /** The signed receipt of a final answer, when the server sends one (docs/audit.md). */
  receipt?: unknown;
  /** What the model should know beyond the result: the server's text, never the adapter's. */
  text: string;
  /** The server's hint, when it sends one. */
  hint?: Hint;
  /** The server marked the answer a tool error (a conflict, failure, denial, …). */
  isError: boolean;
  attempts?: number;
  fingerprint?: string;
  completed_at?: string;
}

/** What the model reads of a step: the outcome and the server's text, without the receipt. */
export interface ModelView {
  status: string;
  replayed: boolean;
  operation: string;
  result?: unknown;
  error?: { code: string; message: string };
  note?: string;
}

/** A tool of the catalogue, as the MCP server lists it. */
export interface ToolSpec {
  name: string;
  description: string;
  /** The tool's JSON Schema for its arguments (an object schema). */
  inputSchema: Record<string, unknown>;
  annotations?: Record<string, unknown>;
}

/** How {@link IdemTools} connects. */
export interface IdemToolsOptions {
  /** The MCP endpoint, e.g. http://127.0.0.1:8081/mcp (make run's). */
  url: string | URL;
  /** The bearer token (make run: data/agent.token). Default: none. */
  token?: string;
  /** Extra headers on every request. Default: none. */
  headers?: Record<string, string>;
  /** The session of calls that name none (see {@link CallOptions.session}). Default: none, the token's namespace alone. */
  session?: string;
  /** Only these tools of the catalogue (and idemgate_status, which the server's answers name). Default: every tool. */
  only?: string[];
  /** Wait for an approval: see {@link CallOptions.waitForApprovalMs}. Default 0: answer awaiting_approval at once. */
  waitForApprovalMs?: number;
  /** The client name the server sees. Default "idemgate-adapter". */
  clientName?: string;
}

/** Per call. */
export interface CallOptions {
  /** The session that scopes the key: a run, a conversation, a thread. A retry of the same intent must name the same one. */
  session?: string | undefined;
  /**
   * How long to wait, in milliseconds, for an operation awaiting approval
   * to be decided (approved and run, or denied) before answering; its
   * answer is then the decision's. 0 answers awaiting_approval at once.
   */
  waitForApprovalMs?: number | undefined;
  /** Cancels the wait (never the operation). */
  signal?: AbortSignal | undefined;
  /** Called once the call is answered awaiting_approval and the wait for its decision begins (to tell an approver which operation). */
  onAwaitingApproval?: ((step: Step) => void) | undefined;
}

interface Connection {
  client: Client;
  sessionId(): string | undefined;
  close(): Promise<void>;
}

/** Errors of the adapter itself (never an operation's outcome, which is a {@link Step}). */
export class IdemToolsError extends Error {
  override name = "IdemToolsError";
}

/**
 * The workers' tools over one MCP connection, opened on first use and
 * opened again when the server has ended it (an idle session, a restart).
 */
export class IdemTools {
  readonly options: IdemToolsOptions;
  private conn: Promise<Connection> | undefined;
  private catalogue: Promise<ToolSpec[]> | undefined;
  private open: Connection | undefined;

  constructor(options: IdemToolsOptions) {
    if (!options || !options.url) throw new IdemToolsError("IdemTools: give url, the MCP endpoint (make run: http://127.0.0.1:8081/mcp)");
    this.options = options;
  }

  /** The catalogue's tools (listed once; {@link refresh} lists again). */
  async list(): Promise<ToolSpec[]> {
    this.catalogue ??= this.withClient(async (c) => {
      const out: ToolSpec[] = [];
      let cursor: string | undefined;
      do {
        const page = await c.listTools(cursor === undefined ? {} : { cursor });
        for (const t of page.tools) {
          // idemgate_status stays: the server's text for an operation still open tells the model to check with it.
          if (t.name !== STATUS_TOOL && this.options.only && !this.options.only.includes(t.name)) continue;
          const spec: ToolSpec = { name: t.name, description: t.description ?? "", inputSchema: t.inputSchema as Record<string, unknown> };
          if (t.annotations) spec.annotations = t.annotations as Record<string, unknown>;
          out.push(spec);
        }
        cursor = page.nextCursor;
      } while (cursor);
      return out;
    });
    try {
      return await this.catalogue;
    } catch (err) {
      this.catalogue = undefined;
      throw err;
    }
  }

  /** Forgets the listed catalogue: the next {@link list} asks the server again. */
  refresh(): void {
    this.catalogue = undefined;
  }

  /**
   * Calls tool with args in opts.session (else the options' session) and
   * answers its step. An operation's outcome — a replay, a conflict, a
   * failure, a denial — is a step, never a thrown error; only a broken
   * connection or a bad call of the adapter throws.
   */
  async call(tool: string, args: unknown, opts: CallOptions = {}): Promise<Step> {
    const session = opts.session ?? this.options.session;
    const params: { name: string; arguments: Record<string, unknown>; _meta?: Record<string, unknown> } = {
      name: tool,
      arguments: (args ?? {}) as Record<string, unknown>,
    };
    if (session !== undefined && session !== "") params._meta = { [META_SESSION]: session };
    let step = toStep(tool, await this.withClient((c) => c.callTool(params, undefined, requestOptions(opts.signal))));
    const wait = opts.waitForApprovalMs ?? this.options.waitForApprovalMs ?? 0;
    if (wait > 0 && step.status === "awaiting_approval") {
      opts.onAwaitingApproval?.(step);
      step = await this.waitDecided(step, wait, opts.signal);
    }
    return step;
  }

  /** The operation's current state (idemgate_status), waiting up to waitSeconds (0-60) for it to move on. */
  async status(operation: string, waitSeconds = 0, signal?: AbortSignal): Promise<Step> {
    const res = await this.withClient((c) =>
      c.callTool({ name: STATUS_TOOL, arguments: { operation, wait_seconds: waitSeconds } }, undefined, requestOptions(signal, waitSeconds)),
    );
    return toStep("", res);
  }

  /** The MCP session of the open connection (one for every call until the server ends it), if any. */
  get mcpSessionId(): string | undefined {
    return this.open?.sessionId();
  }

  /** Closes the connection (a later call opens a new one). */
  async close(): Promise<void> {
    const conn = this.conn;
    this.conn = undefined;
    this.open = undefined;
    if (conn) await (await conn.catch(() => undefined))?.close();
  }

  private async waitDecided(step: Step, ms: number, signal?: AbortSignal): Promise<Step> {
    const deadline = Date.now() + ms;
    let last = step;
    while (OPEN.has(last.status)) {
      const left = deadline - Date.now();
      if (left <= 0 || signal?.aborted) break;
      const next = await this.status(step.operation, Math.max(1, Math.min(60, Math.floor(left / 1000))), signal);
      next.tool = step.tool;
      last = next;
    }
    return last;
  }

  private connect(): Promise<Connection> {
    this.conn ??= (async () => {
      const [{ Client }, { StreamableHTTPClientTransport }] = await Promise.all([
        import("@modelcontextprotocol/sdk/client/index.js"),
        import("@modelcontextprotocol/sdk/client/streamableHttp.js"),
      ]);
      const headers: Record<string, string> = { ...(this.options.headers ?? {}) };
      if (this.options.token) headers["Authorization"] = `Bearer ${this.options.token}`;
      const client = new Client({ name: this.options.clientName ?? "idemgate-adapter", version: "0.1.0" });
      const transport = new StreamableHTTPClientTransport(new URL(String(this.options.url)), { requestInit: { headers } });
      await client.connect(transport);
      return (this.open = {
        client,
        sessionId: () => transport.sessionId,
        close: async () => {
          await transport.terminateSession().catch(() => undefined);
          await client.close();
        },
      });
    })();
    const conn = this.conn;
    conn.catch(() => {
      if (this.conn === conn) this.conn = undefined;
    });
    return conn;
  }

  /** Runs f on the connection; when the server no longer knows the session (404), once more on a new one. A repeated call is safe: idemgate answers it from the ledger. */
  private async withClient<T>(f: (c: Client) => Promise<T>): Promise<T> {
    const p = this.connect();
    const conn = await p;
    try {
      return await f(conn.client);
    } catch (err) {
      if (!sessionGone(err)) throw err;
      if (this.conn === p) this.conn = undefined;
      await conn.client.close().catch(() => undefined);
      return f((await this.connect()).client);
    }
  }
}

/** A request's options: a signal, and a timeout past the server's own wait (3 min, or a status wait). */
function requestOptions(signal: AbortSignal | undefined, waitSeconds = 180) {
  const o: { timeout: number; signal?: AbortSignal } = { timeout: (waitSeconds + 30) * 1000 };
  if (signal) o.signal = signal;
  return o;
}

/** The server ended the MCP session: an HTTP 404 for it. */
function sessionGone(err: unknown): boolean {
  const e = err as { code?: unknown; message?: unknown } | undefined;
  return e?.code === 404 || /\b404\b|session not found/i.test(String(e?.message ?? ""));
}

interface CallResult {
  content?: unknown;
  structuredContent?: unknown;
  isError?: unknown;
  _meta?: Record<string, unknown>;
}

/**
 * The step of an MCP tool result of idemgate's server: the operation from
 * `_meta["io.idemgate/operation"]`, the result or error from the structured
 * content, and the model's text from `structuredContent.hint` (or, without
 * one, the text items after the first, which is the structured content's
 * JSON).
 */
export function toStep(tool: string, raw: unknown): Step {
  const res = (raw ?? {}) as CallResult;
  const isError = res.isError === true;
  const texts = Array.isArray(res.content)
    ? res.content.filter((c): c is { type: string; text: string } => c?.type === "text" && typeof c.text === "string").map((c) => c.text)
    : [];
  const sc = isObject(res.structuredContent) ? res.structuredContent : undefined;
  const op = isObject(res._meta?.[META_OPERATION]) ? (res._meta![META_OPERATION] as Record<string, unknown>) : undefined;
  if (!op) {
    // Refused before any operation: a bad call, an unknown tool.
    const text = texts.join("\n");
    return { tool, operation: "", status: "error", replayed: false, isError: true, text, error: { code: "invalid_call", message: text } };
  }
  const status = String(op.status ?? "");
  const step: Step = {
    tool: tool || String(op.tool ?? ""),
    operation: String(op.key ?? ""),
    status,
    replayed: op.replayed === true,
    isError,
    text: "",
  };
  if (typeof op.attempts === "number") step.attempts = op.attempts;
  if (typeof op.fingerprint === "string") step.fingerprint = op.fingerprint;
  if (typeof op.completed_at === "string") step.completed_at = op.completed_at;
  if (op.receipt !== undefined) step.receipt = op.receipt;
  let hint: Hint | undefined;
  if (sc && isObject(sc.hint) && typeof sc.hint.text === "string") hint = { code: String(sc.hint.code ?? ""), text: sc.hint.text };
  if (hint) step.hint = hint;
  // Without a hint the notes are the text items after the first (the structured content's JSON).
  const notes = sc && texts.length > 0 ? texts.slice(1) : texts;
  step.text = hint ? hint.text : notes.join("\n");
  if (status === "completed" || status === "already_done") {
    if (status === "already_done" && sc) step.result = sc.result;
    else if (sc) step.result = withoutHint(sc);
    else step.result = texts[0];
  }
  if (sc && isObject(sc.error)) step.error = { code: String(sc.error.code ?? ""), message: String(sc.error.message ?? "") };
  if (sc && sc.receipt !== undefined && step.receipt === undefined && status !== "completed") step.receipt = sc.receipt;
  return step;
}

/** The part of a step a model reads. */
export function modelView(step: Step): ModelView {
  const v: ModelView = { status: step.status, replayed: step.replayed, operation: step.operation };
  if (step.result !== undefined) v.result = step.result;
  if (step.error !== undefined) v.error = step.error;
  if (step.text) v.note = step.text;
  return v;
}

/** A step as the text of a tool message. */
export function modelText(step: Step): string {
  return JSON.stringify(modelView(step));
}

function withoutHint(sc: Record<string, unknown>): Record<string, unknown> {
  if (!("hint" in sc)) return sc;
  const { hint: _hint, ...rest } = sc;
  return rest;
}

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}
