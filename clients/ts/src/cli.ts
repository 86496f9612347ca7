#!/usr/bin/env node
/**
 * A small command line over the client, mirroring the Go `submit` command:
 * the same subcommands (but watch; and key reads a spec from --spec, the
 * catalogue or --default-spec, not a tools file) and the same exit statuses.
 * `node dist/cli.js help` prints the usage.
 *
 * @module
 */

import { readFileSync, realpathSync } from "node:fs";
import { pathToFileURL } from "node:url";
import { parseArgs } from "node:util";

import { isFinal, type Result } from "./answer.js";
import { KeySet } from "./audit.js";
import { DEFAULT_WAIT_MS, IdemClient } from "./client.js";
import { encodeDecision, type Decision, type DecisionOp } from "./decide.js";
import { deriveKey, type KeySpec } from "./derive.js";
import { DEFAULT_MAX_DEPTH, parseEnvelope, validTool, type Envelope } from "./envelope.js";
import { IdemError, NoAnswerError, NotFoundError } from "./errors.js";
import { parseStrict } from "./json.js";

/** Exit statuses, as the Go submit command's. */
export const EXIT = {
  fired: 0,
  error: 1,
  timeout: 2,
  replayed: 3,
  conflict: 4,
  failed: 5,
  open: 6,
} as const;

/**
 * The exit status an answer gives.
 *
 * @param res - the answer
 * @returns the status per {@link EXIT}
 */
export function exitCode(res: Result): number {
  if (res.status === "conflict") return EXIT.conflict;
  if (res.status === "failed" || res.status === "rejected" || res.status === "denied") return EXIT.failed;
  if (!isFinal(res.status)) return EXIT.open;
  return res.replayed ? EXIT.replayed : EXIT.fired;
}

/**
 * The exit status of a decision's answer: 0 when the decision took effect
 * (an approval whose operation completed, a denial, a resolution), 5 when it
 * was rejected, else as {@link exitCode}.
 *
 * @param op - approve, deny or resolve
 * @param res - the worker's answer
 * @returns the status per {@link EXIT}
 */
export function decisionExitCode(op: DecisionOp, res: Result): number {
  if (res.status === "rejected") return EXIT.failed;
  if (
    (op === "deny" && res.status === "denied") ||
    (op === "resolve" && (res.status === "completed" || res.status === "failed")) ||
    (op === "approve" && res.status === "completed")
  ) {
    return EXIT.fired;
  }
  return exitCode(res);
}

const USAGE = `usage: cli.js COMMAND [flags] [ARGS]

Commands:
  submit --tool T --args JSON [--session S] [--key K] [--call-id C] [--created-at T] [--wait D] [--wait-final] [--receipt-keys FILE]
                                  publish one intent and print its answer (with --receipt-keys, a keys file:
                                  its receipt verified, exit 1 when it does not hold)
  key --tool T --args JSON [--spec JSON | --default-spec] [-q]
                                  the key and fingerprint an intent derives (spec from --spec, else the workers' catalogue)
  get KEY                         the ledger record of KEY
  watch KEY [--wait D]            wait for the final record of KEY (exit 0 completed, 5 failed or denied, 2 none in time)
  tools                           the tools the workers serve, and how each derives its keys
  approve KEY [--fingerprint F] [--by B] [--reason R]
                                  let an operation awaiting approval fire
  deny KEY [--by B] [--reason R]  refuse an operation awaiting approval
  resolve KEY --outcome succeeded|failed [--result JSON] [--by B] [--reason R]
                                  settle an uncertain operation
  dlq list [--limit N] | dlq replay SEQ
                                  the dead-letter stream
  help                            this text
Every command that talks to NATS takes --servers URL (default $NATS_URL, else nats://127.0.0.1:4222) and --prefix P.
--wait takes milliseconds or a number with ms, s or m. --wait-final waits past awaiting_approval/uncertain.

Exit status:
  0  fired by this call (a decision: it took effect); a list, key or record printed
  3  replayed: the answer reports an outcome an earlier call caused
  4  conflict   5  failed, rejected or denied   6  awaiting approval or uncertain
  2  no answer in time   1  any other error

Examples:
  cli.js submit --tool send_email --args '{"to":"ada@example.com","subject":"Hi"}' --session run-7
  K=$(cli.js key -q --tool send_email --args '{"to":"ada@example.com","subject":"Hi"}' --session run-7)`;

const OPTIONS = {
  servers: { type: "string" },
  prefix: { type: "string" },
  tool: { type: "string" },
  args: { type: "string", default: "{}" },
  session: { type: "string" },
  key: { type: "string" },
  "call-id": { type: "string" },
  "created-at": { type: "string" },
  wait: { type: "string" },
  "wait-final": { type: "boolean" },
  "receipt-keys": { type: "string" },
  spec: { type: "string" },
  fingerprint: { type: "string" },
  by: { type: "string" },
  reason: { type: "string" },
  outcome: { type: "string" },
  result: { type: "string" },
  limit: { type: "string" },
  "default-spec": { type: "boolean" },
  q: { type: "boolean", short: "q" },
  help: { type: "boolean", short: "h" },
} as const;

type Values = ReturnType<typeof parseArgs<{ options: typeof OPTIONS; allowPositionals: true }>>["values"];

/**
 * Runs the command line and returns its exit status.
 *
 * @param argv - the arguments after the script name
 * @returns the exit status
 */
export async function main(argv: string[]): Promise<number> {
  const [command, ...rest] = argv;
  let values: Values;
  let positionals: string[];
  try {
    ({ values, positionals } = parseArgs({ args: rest, options: OPTIONS, allowPositionals: true, strict: true }));
  } catch (err) {
    process.stderr.write(`cli: ${errorMessage(err)}\n${USAGE}\n`);
    return EXIT.error;
  }
  if (values.help === true || command === undefined || command === "help" || command === "--help" || command === "-h") {
    (command === undefined ? process.stderr : process.stdout).write(USAGE + "\n");
    return command === undefined ? EXIT.error : EXIT.fired;
  }
  try {
    switch (command) {
      case "submit":
        return await cmdSubmit(values, positionals);
      case "key":
        return await cmdKey(values, positionals);
      case "tools":
        return await cmdTools(values, positionals);
      case "dlq":
        return await cmdDLQ(values, positionals);
      case "get":
        return await cmdGet(values, positionals);
      case "watch":
        return await cmdWatch(values, positionals);
      case "approve":
      case "deny":
      case "resolve":
        return await cmdDecide(command, values, positionals);
      default:
        process.stderr.write(`cli: unknown command ${JSON.stringify(command)}\n${USAGE}\n`);
        return EXIT.error;
    }
  } catch (err) {
    process.stderr.write(`cli: ${errorMessage(err)}\n`);
    return err instanceof NoAnswerError ? EXIT.timeout : EXIT.error;
  }
}

/** Builds the envelope from flags, read with the workers' strict rules. */
function envelopeFrom(v: Values): Envelope {
  if (v.tool === undefined) {
    throw new IdemError("usage", "no intent: give --tool and --args");
  }
  // The args text is spliced in unparsed, so that parseEnvelope sees it as
  // sent: a repeated name or an integer beyond 2^53 is an error, not rounded.
  let text = `{"tool":${JSON.stringify(v.tool)},"args":${v.args}`;
  const optional: [string, string | undefined][] = [
    ["session", v.session],
    ["key", v.key],
    ["call_id", v["call-id"]],
    ["created_at", v["created-at"]],
  ];
  for (const [name, value] of optional) {
    if (value !== undefined && value !== "") {
      text += `,${JSON.stringify(name)}:${JSON.stringify(value)}`;
    }
  }
  return parseEnvelope(text + "}");
}

function noPositionals(positionals: string[]): void {
  if (positionals.length > 0) {
    throw new IdemError("usage", `unexpected argument ${JSON.stringify(positionals[0])}`);
  }
}

async function cmdSubmit(v: Values, positionals: string[]): Promise<number> {
  noPositionals(positionals);
  const env = envelopeFrom(v);
  const wait = v.wait === undefined ? DEFAULT_WAIT_MS : parseWait(v.wait);
  const client = await IdemClient.connect(servers(v), {
    ...(v.prefix !== undefined ? { prefix: v.prefix } : {}),
    ...(v["receipt-keys"] !== undefined ? { receiptKeys: KeySet.fromJSON(readFileSync(v["receipt-keys"], "utf8")) } : {}),
  });
  try {
    const s = await client.publish(env);
    if (wait <= 0) {
      print({ key: s.key, fingerprint: s.fingerprint, duplicate: s.duplicate, sequence: s.sequence });
      return EXIT.fired;
    }
    const res = v["wait-final"] === true ? await s.waitFinal(wait) : await s.wait(wait);
    print(res);
    return exitCode(res);
  } finally {
    await client.close();
  }
}

async function cmdKey(v: Values, positionals: string[]): Promise<number> {
  noPositionals(positionals);
  const env = envelopeFrom(v);
  let spec: KeySpec;
  if (v.spec !== undefined && v["default-spec"] === true) {
    throw new IdemError("usage", "give --spec or --default-spec, not both");
  } else if (v.spec !== undefined) {
    try {
      spec = JSON.parse(v.spec) as KeySpec;
    } catch (err) {
      throw new IdemError("usage", `--spec is not valid JSON: ${errorMessage(err)} (write e.g. {"key_args":["to"],"volatile_args":["body"]})`);
    }
  } else if (v["default-spec"] === true) {
    spec = {};
  } else {
    spec = await catalogSpec(v, env.tool);
  }
  const id = deriveKey(env, spec, new Date());
  if (v.q === true) {
    process.stdout.write(id.key + "\n");
  } else {
    print(id);
  }
  return EXIT.fired;
}

/** The tool's key spec from the workers' catalogue; without one, an error saying how to give it. */
async function catalogSpec(v: Values, tool: string): Promise<KeySpec> {
  let client: IdemClient;
  try {
    client = await IdemClient.connect(servers(v), v.prefix !== undefined ? { prefix: v.prefix } : {});
  } catch (err) {
    throw new IdemError(
      "no_spec",
      `${errorMessage(err)}: the key depends on the tool's key spec, which the workers' catalogue gives; give it with --spec JSON, or ask for the default derivation with --default-spec`,
    );
  }
  try {
    const cat = await client.tools().catch((err: unknown) => {
      throw new IdemError("no_spec", `tool catalogue: ${errorMessage(err)} (give the key spec with --spec JSON, or --default-spec)`);
    });
    const t = cat.tools.find((x) => x.name === tool);
    if (t === undefined) {
      throw new IdemError("no_spec", `the workers serve no tool ${JSON.stringify(tool)} (an intent for it is answered unknown_tool)`);
    }
    return { key_args: t.key_args ?? [], window_seconds: t.window_seconds ?? 0, volatile_args: t.volatile_args ?? [] };
  } finally {
    await client.close();
  }
}

async function cmdTools(v: Values, positionals: string[]): Promise<number> {
  noPositionals(positionals);
  const client = await IdemClient.connect(servers(v), v.prefix !== undefined ? { prefix: v.prefix } : {});
  try {
    print(await client.tools());
    return EXIT.fired;
  } finally {
    await client.close();
  }
}

async function cmdDLQ(v: Values, positionals: string[]): Promise<number> {
  const [sub, ...rest] = positionals;
  const usage = "usage: cli.js dlq list [--limit N] | cli.js dlq replay SEQ";
  if (sub !== "list" && sub !== "replay") {
    throw new IdemError("usage", usage);
  }
  const client = await IdemClient.connect(servers(v), v.prefix !== undefined ? { prefix: v.prefix } : {});
  try {
    if (sub === "list") {
      if (rest.length > 0) throw new IdemError("usage", usage);
      const limit = v.limit === undefined ? 0 : Number(v.limit);
      if (!Number.isSafeInteger(limit) || limit < 0) throw new IdemError("usage", `--limit ${v.limit}: give a whole number`);
      const letters = await client.deadLetters(limit);
      for (const d of letters) process.stdout.write(JSON.stringify(d) + "\n");
      process.stderr.write(`${letters.length} dead letters\n`);
      return EXIT.fired;
    }
    const seq = Number(rest[0]);
    if (rest.length !== 1 || !Number.isSafeInteger(seq) || seq <= 0) {
      throw new IdemError("usage", `SEQ ${JSON.stringify(rest[0] ?? "")}: give the dead letter's seq (dlq list shows it)`);
    }
    print({ replayed: seq, stream_seq: await client.replayDeadLetter(seq) });
    return EXIT.fired;
  } finally {
    await client.close();
  }
}

async function cmdGet(v: Values, positionals: string[]): Promise<number> {
  const [key, ...extra] = positionals;
  if (key === undefined || extra.length > 0) {
    throw new IdemError("usage", "usage: cli.js get --servers URL KEY");
  }
  const client = await IdemClient.connect(servers(v), v.prefix !== undefined ? { prefix: v.prefix } : {});
  try {
    print(await client.get(key));
    return EXIT.fired;
  } finally {
    await client.close();
  }
}

/** Reports whether `key` has the form `<tool>.<64 hex digits>`. */
function validKey(key: string): boolean {
  const i = key.length - 65;
  return i >= 1 && key[i] === "." && validTool(key.slice(0, i)) && /^[0-9a-f]{64}$/.test(key.slice(i + 1));
}

async function cmdWatch(v: Values, positionals: string[]): Promise<number> {
  const [key, ...extra] = positionals;
  if (key === undefined || extra.length > 0) {
    throw new IdemError("usage", "usage: cli.js watch --servers URL KEY [--wait D]");
  }
  if (!validKey(key)) {
    throw new IdemError("usage", `${JSON.stringify(key)} is not a key: a key is <tool>.<64 hex digits>, as submit prints it`);
  }
  const wait = v.wait === undefined ? DEFAULT_WAIT_MS : parseWait(v.wait);
  const client = await IdemClient.connect(servers(v), v.prefix !== undefined ? { prefix: v.prefix } : {});
  try {
    try {
      const rec = await client.get(key);
      if (!isFinal(rec.status)) {
        process.stderr.write(`${key} is ${rec.status}; waiting for its final answer\n`);
      }
    } catch (err) {
      if (!(err instanceof NotFoundError)) throw err;
      process.stderr.write(`${key} has no record yet; waiting for one\n`);
    }
    const rec = await client.watchFinal(key, wait);
    print(rec);
    return rec.status === "completed" ? EXIT.fired : EXIT.failed;
  } finally {
    await client.close();
  }
}

async function cmdDecide(op: DecisionOp, v: Values, positionals: string[]): Promise<number> {
  const [key, ...extra] = positionals;
  if (key === undefined || extra.length > 0) {
    throw new IdemError("usage", `usage: cli.js ${op} --servers URL KEY`);
  }
  const d: Decision = { key };
  if (v.fingerprint !== undefined) d.fingerprint = v.fingerprint;
  if (v.by !== undefined) d.by = v.by;
  if (v.reason !== undefined) d.reason = v.reason;
  if (v.outcome !== undefined) d.outcome = v.outcome as "succeeded" | "failed"; // checked by encodeDecision
  if (v.result !== undefined) d.result = parseStrict(v.result, DEFAULT_MAX_DEPTH);
  encodeDecision(op, d); // a malformed decision is a usage error, before connecting
  const wait = v.wait === undefined ? DEFAULT_WAIT_MS : parseWait(v.wait);
  const client = await IdemClient.connect(servers(v), v.prefix !== undefined ? { prefix: v.prefix } : {});
  try {
    const res = await client.decide(op, d, wait);
    print(res);
    return decisionExitCode(op, res);
  } finally {
    await client.close();
  }
}

function servers(v: Values): string {
  return v.servers ?? process.env["NATS_URL"] ?? "nats://127.0.0.1:4222";
}

/** Parses a wait: milliseconds, or a number with an `ms`, `s` or `m` suffix. */
function parseWait(s: string): number {
  const m = /^([0-9]+(?:\.[0-9]+)?)(ms|s|m)?$/.exec(s.trim());
  if (m === null) {
    throw new IdemError("usage", `--wait ${JSON.stringify(s)}: give milliseconds, or a number with ms, s or m`);
  }
  const n = Number(m[1]);
  const unit = m[2] === "s" ? 1_000 : m[2] === "m" ? 60_000 : 1;
  return Math.round(n * unit);
}

function print(v: unknown): void {
  process.stdout.write(JSON.stringify(v, null, 2) + "\n");
}

function errorMessage(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}

// Run when executed, not when imported (tests import main and exitCode).
const script = process.argv[1];
if (script !== undefined && import.meta.url === pathToFileURL(realpathSync(script)).href) {
  main(process.argv.slice(2)).then(
    (code) => {
      process.exitCode = code;
    },
    (err: unknown) => {
      process.stderr.write(`cli: ${errorMessage(err)}\n`);
      process.exitCode = EXIT.error;
    },
  );
}
