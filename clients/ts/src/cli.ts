#!/usr/bin/env node
/**
 * A small command line over the client, with the exit statuses of the Go
 * `submit` command:
 *
 * ```
 * node dist/cli.js submit --servers nats://127.0.0.1:4222 --tool T --args JSON [--session S] [--key K] [--call-id C] [--created-at T] [--wait ms] [--wait-final] [--prefix P]
 * node dist/cli.js key    --tool T --args JSON [--session S] [--key K] [--created-at T] [--spec JSON]
 * node dist/cli.js get    --servers URL KEY
 * node dist/cli.js approve --servers URL KEY [--fingerprint F] [--by B] [--reason R]
 * node dist/cli.js deny    --servers URL KEY [--by B] [--reason R]
 * node dist/cli.js resolve --servers URL KEY --outcome succeeded|failed [--result JSON] [--by B] [--reason R]
 * ```
 *
 * Exit status of `submit`: 0 fired (completed by this call), 3 replayed
 * (completed earlier), 4 conflict, 5 failed, rejected or denied, 6 awaiting
 * approval or uncertain, 2 no answer in time, 1 any other error. With
 * `--wait-final`, `submit` waits past awaiting approval and uncertain for
 * the operator's decision and the operation's final answer.
 *
 * @module
 */

import { realpathSync } from "node:fs";
import { pathToFileURL } from "node:url";
import { parseArgs } from "node:util";

import { isFinal, type Result } from "./answer.js";
import { DEFAULT_WAIT_MS, IdemClient } from "./client.js";
import { encodeDecision, type Decision, type DecisionOp } from "./decide.js";
import { deriveKey, type KeySpec } from "./derive.js";
import { DEFAULT_MAX_DEPTH, parseEnvelope, type Envelope } from "./envelope.js";
import { IdemError, NoAnswerError } from "./errors.js";
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

const USAGE = `usage:
  cli.js submit --servers URL --tool T --args JSON [--session S] [--key K] [--call-id C] [--created-at T] [--wait ms] [--wait-final] [--prefix P]
  cli.js key    --tool T --args JSON [--session S] [--key K] [--created-at T] [--spec JSON]
  cli.js get    --servers URL [--prefix P] KEY
  cli.js approve --servers URL KEY [--fingerprint F] [--by B] [--reason R] [--wait ms]
  cli.js deny    --servers URL KEY [--by B] [--reason R] [--wait ms]
  cli.js resolve --servers URL KEY --outcome succeeded|failed [--result JSON] [--by B] [--reason R] [--wait ms]
exit status of submit and the decisions: 0 fired, 3 replayed, 4 conflict, 5 failed/rejected/denied,
6 awaiting_approval/uncertain, 2 no answer in time, 1 error
--wait-final: wait past awaiting_approval/uncertain for the final answer`;

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
  spec: { type: "string" },
  fingerprint: { type: "string" },
  by: { type: "string" },
  reason: { type: "string" },
  outcome: { type: "string" },
  result: { type: "string" },
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
  if (values.help === true || command === undefined || command === "help" || command === "--help") {
    process.stdout.write(USAGE + "\n");
    return command === undefined ? EXIT.error : EXIT.fired;
  }
  try {
    switch (command) {
      case "submit":
        return await cmdSubmit(values, positionals);
      case "key":
        return cmdKey(values, positionals);
      case "get":
        return await cmdGet(values, positionals);
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
  const client = await IdemClient.connect(servers(v), v.prefix !== undefined ? { prefix: v.prefix } : {});
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

function cmdKey(v: Values, positionals: string[]): number {
  noPositionals(positionals);
  const env = envelopeFrom(v);
  let spec: KeySpec = {};
  if (v.spec !== undefined) {
    spec = JSON.parse(v.spec) as KeySpec;
  }
  print(deriveKey(env, spec, new Date()));
  return EXIT.fired;
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
    return exitCode(res);
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
