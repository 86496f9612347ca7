/**
 * The client: publishes intents and waits for their answers, following
 * docs/protocol.md section 7 (a publish duplicate and a missing reply are
 * both answered from the ledger).
 *
 * @module
 */

import { Kvm, type KV, type KvEntry } from "@nats-io/kv";
import { jetstream, jetstreamManager, type JetStreamClient, type PubAck, type StoredMsg } from "@nats-io/jetstream";
import {
  connect,
  createInbox,
  headers,
  type NatsConnection,
  type NodeConnectionOptions,
  type Subscription,
} from "@nats-io/transport-node";

import { randomBytes } from "node:crypto";

import { decodeRecord, isAnswered, isFinal, type LedgerRecord, type Result } from "./answer.js";
import { BadReceiptError, ReceiptError, receipted, recordReceipt, strictAnswer, verifyReceipt, type KeySet } from "./audit.js";
import { encodeDecision, type Decision, type DecisionOp } from "./decide.js";
import { deriveKey, type KeySpec } from "./derive.js";
import { checkEnvelope, encodeEnvelope, type Envelope } from "./envelope.js";
import { IdemError, NoAnswerError, NotFoundError } from "./errors.js";
import { LAYOUT_FULL, LAYOUT_METADATA, ledgerKey, validLayout } from "./layout.js";
import { partition, partitionBucket, PARTITIONS_METADATA, validPartitions } from "./partition.js";
import type { JsonValue } from "./json.js";

/** The default installation prefix: subjects `idem.…`, bucket `IDEM_LEDGER`. */
export const DEFAULT_PREFIX = "IDEM";

/** How long a submission waits for its pushed reply before it also watches the ledger (3 s). */
export const DEFAULT_REPLY_GRACE_MS = 3_000;

/** How long a request to the tool catalogue may take (2 s). */
export const DEFAULT_CATALOG_TIMEOUT_MS = 2_000;

/**
 * The default wait of {@link IdemClient.submit} (3 min): above two default
 * leases (30 s each: the lease, then a takeover's confirmation) plus the
 * consumer's ack wait (30 s) plus an effect's retries, so a caller whose
 * worker died still gets its answer from the next one.
 */
export const DEFAULT_WAIT_MS = 180_000;

/** A tool's lease when the catalogue does not say (the workers' default, 30 s). */
const DEFAULT_LEASE_MS = 30_000;

/** The text each answer parsed from a message came as, for its receipt's strict check. */
const answerTexts = new WeakMap<object, Uint8Array>();

/** The header naming the subject an answer is pushed to. */
export const HEADER_REPLY_TO = "Idem-Reply-To";

/** The header carrying the key the client derived; a worker that derives another rejects the intent (`key_mismatch`). */
export const HEADER_KEY = "Idem-Key";

/** The header carrying the fingerprint the client derived; checked as {@link HEADER_KEY} is. */
export const HEADER_FINGERPRINT = "Idem-Fingerprint";

/**
 * The header naming the call: one random value on every publish of one
 * submission (the first and each republish), a new one per submission, so
 * that a worker never takes a copy of a call for a new call (a failed
 * operation runs again only for a new call; docs/protocol.md 7.5).
 */
export const HEADER_SUBMISSION = "Idem-Submission";

/**
 * The header a worker sets on every answer it pushes: the stream sequence of
 * the message (intent or decision) whose `Idem-Reply-To` it answers. A client
 * takes a pushed answer only when it is the sequence of one of its own stored
 * publishes (docs/protocol.md 7.1).
 */
export const HEADER_INTENT_SEQ = "Idem-Intent-Seq";

/** How often the client looks at the ledger's recorded shape (partition count, key layout) while it uses the ledger: a migration changes it under a running client (5 s). */
const SHAPE_RECHECK_MS = 5_000;

// How a watch of a ledger key reads the leader: again after a signal whose
// write it did not show yet, after 5 ms, doubling up to 640 ms; and without
// a signal after 1 s, doubling up to 16 s (a signal is missed at a
// reconnect, or by a subscription the writer's server does not know of yet).
const WAIT_SETTLE_FIRST_MS = 5;
const WAIT_SETTLE_LAST_MS = 640;
const WAIT_RECHECK_FIRST_MS = 1_000;
const WAIT_RECHECK_LAST_MS = 16_000;


/** The ledger as the client opened it: its partitions' buckets, in partition order, and its key layout. */
interface LedgerShape {
  kvs: KV[];
  layout: number;
}

/** One tool as the workers' catalogue reports it. */
export interface ToolInfo {
  /** The tool name. */
  name: string;
  /** The effect kind (webhook, noop, …). */
  effect: string;
  /** The tool's key args; absent means all args. */
  key_args?: string[];
  /** The tool's window in seconds; absent or 0 means none. */
  window_seconds?: number;
  /** Args left out of the fingerprint. */
  volatile_args?: string[];
  /** The holder's lease, in seconds. */
  lease_seconds: number;
  /** read, idempotent or unsafe. */
  class?: string;
  /** True for reads and idempotent writes: a caller may repeat them without a key. */
  safe_to_retry?: boolean;
  /** Whether the tool's intents go through the ledger. A tool without it fires every intent: the client then sets no Nats-Msg-Id and watches no ledger key. */
  ledger?: boolean;
  /** "required" when an operator must approve each operation. */
  approval?: string;
  /** retry or hold. */
  on_abandoned?: string;
  /** replay or retry: what a later call of a failed operation does (retry: it runs again). */
  on_failure?: string;
  /** replay or reject: what a later call of a completed operation does (reject: answered `already_done`). */
  on_complete?: string;
}

/** The tool catalogue's answer (a request to `idem.tools`). */
export interface Catalog {
  /** The configured tools. */
  tools: ToolInfo[];
}

/** The NATS names of one installation, all derived from one prefix. */
export interface Names {
  /** The prefix as given, e.g. `IDEM`. */
  prefix: string;
  /** Intent subjects are this plus the tool: `idem.intents.`. */
  intentPrefix: string;
  /** The tool catalogue subject: `idem.tools`. */
  toolsSubject: string;
  /** Operator decisions are published on this plus the decision: `idem.control.`. */
  controlPrefix: string;
  /** The ledger bucket: `IDEM_LEDGER`. */
  bucket: string;
  /** The dead-letter stream: `IDEM_DLQ`. */
  dlqStream: string;
}

const PREFIX_PATTERN = /^[A-Za-z0-9_-]{1,32}$/;

/**
 * Derives the names of the installation with `prefix`.
 *
 * @param prefix - 1 to 32 letters, digits, `_` or `-` (default `IDEM`)
 * @returns the names
 * @throws {@link IdemError} (`invalid_prefix`) for a bad prefix
 */
export function names(prefix: string = DEFAULT_PREFIX): Names {
  if (!PREFIX_PATTERN.test(prefix)) {
    throw new IdemError("invalid_prefix", `prefix ${JSON.stringify(prefix)}: use 1-32 letters, digits, '_' or '-'`);
  }
  const low = prefix.toLowerCase();
  return {
    prefix,
    intentPrefix: `${low}.intents.`,
    toolsSubject: `${low}.tools`,
    controlPrefix: `${low}.control.`,
    bucket: `${prefix.toUpperCase()}_LEDGER`,
    dlqStream: `${prefix.toUpperCase()}_DLQ`,
  };
}

/** Options of an {@link IdemClient}. */
export interface ClientOptions {
  /** The installation prefix. Default: {@link DEFAULT_PREFIX} (`IDEM`). */
  prefix?: string;
  /**
   * Key specs by tool name. A tool not listed is looked up in the workers'
   * catalogue (once); a tool the catalogue lacks, or every tool when no
   * worker answers, uses the default derivation (all args, no window).
   * Default: none.
   */
  keySpecs?: Record<string, KeySpec>;
  /** How long to wait for the pushed reply before also watching the ledger. Default: {@link DEFAULT_REPLY_GRACE_MS} (3 s). */
  replyGraceMs?: number;
  /** How long a catalogue request may take. Default: {@link DEFAULT_CATALOG_TIMEOUT_MS} (2 s). */
  catalogTimeoutMs?: number;
  /**
   * The workers' public keys (a keys file: {@link KeySet.fromJSON}). With
   * them, every answer that carries a receipt is verified, and one whose
   * receipt is missing or does not hold is thrown as a
   * {@link BadReceiptError} (which holds the answer). Default: none, receipts
   * are passed on unchecked.
   */
  receiptKeys?: KeySet;
}

/** Options of {@link IdemClient.connect}: the client's, plus the NATS connection's. */
export interface ConnectOptions extends ClientOptions {
  /** Passed to `connect` of `@nats-io/transport-node` (credentials, TLS, name, …); `servers` is set from the first argument. */
  nats?: Partial<NodeConnectionOptions>;
}

/**
 * Publishes intents and waits for their answers. Safe to share: every
 * submission has its own inbox.
 *
 * @example
 * ```ts
 * const client = await IdemClient.connect("nats://127.0.0.1:4222");
 * const res = await client.submit({ tool: "send_email", args: { to: "ada@example.com" }, session: "run-7" });
 * console.log(res.status, res.replayed, res.result);
 * await client.close();
 * ```
 */
export class IdemClient {
  /** The NATS connection the client uses. */
  readonly nc: NatsConnection;
  /** The names of the installation. */
  readonly names: Names;
  /** The keys answers' receipts are verified with; undefined: none. */
  readonly receiptKeys: KeySet | undefined;
  readonly #js: JetStreamClient;
  readonly #specs = new Map<string, KeySpec>();
  readonly #grace: number;
  readonly #catalogTimeout: number;
  /** The prefix of the client's reply inboxes; undefined: NATS's default. */
  readonly #inboxPrefix: string | undefined;
  #ownsConnection = false;
  #catalog: Promise<void> | undefined;
  /** Tools the catalogue reports without a ledger. */
  readonly #noLedger = new Set<string>();
  /** Tools whose failures a later call runs again (`on_failure: retry`). */
  readonly #retryFailed = new Set<string>();
  /** Tools that answer a repeat of a completion `already_done` (`on_complete: reject`). */
  readonly #rejectRepeat = new Set<string>();
  /** Each tool's lease from the catalogue, in ms. */
  readonly #leases = new Map<string, number>();
  /** The ledger, opened on first use and again after a migration changed its shape. */
  #kv: Promise<LedgerShape> | undefined;
  /** When the latest look that found the ledger in the shape #kv was opened in began (ms since the epoch). */
  #shapeAt = 0;
  /** A look at the ledger's shape under way, and when it began. */
  #look: { began: number; shape: Promise<LedgerShape> } | undefined;

  /**
   * Returns a client on an open connection, which the caller keeps and closes.
   *
   * @param nc - the NATS connection
   * @param opts - client options
   * @throws {@link IdemError} for a bad prefix
   */
  constructor(nc: NatsConnection, opts: ClientOptions = {}) {
    this.nc = nc;
    this.names = names(opts.prefix);
    this.#js = jetstream(nc);
    this.#grace = opts.replyGraceMs ?? DEFAULT_REPLY_GRACE_MS;
    this.#catalogTimeout = opts.catalogTimeoutMs ?? DEFAULT_CATALOG_TIMEOUT_MS;
    this.receiptKeys = opts.receiptKeys;
    // The connection's inbox prefix (its inboxPrefix option): a user whose
    // permissions allow only its own inbox subjects receives answers there.
    this.#inboxPrefix = (nc as { options?: { inboxPrefix?: string } }).options?.inboxPrefix;
    for (const [tool, spec] of Object.entries(opts.keySpecs ?? {})) {
      this.#specs.set(tool, spec);
    }
  }

  /**
   * Connects to NATS and returns a client that owns the connection
   * ({@link IdemClient.close} closes it).
   *
   * @param servers - one server URL, a comma-separated list, or an array
   * @param opts - client and connection options
   * @returns the client
   * @throws the connection's error when no server is reachable
   */
  static async connect(servers: string | string[], opts: ConnectOptions = {}): Promise<IdemClient> {
    const list = Array.isArray(servers) ? servers : servers.split(",").map((s) => s.trim());
    const nc = await connect({ name: "idemgate-ts", ...opts.nats, servers: list });
    try {
      const c = new IdemClient(nc, opts);
      c.#ownsConnection = true;
      return c;
    } catch (err) {
      await nc.close();
      throw err;
    }
  }

  /** Closes the connection when the client opened it ({@link IdemClient.connect}); otherwise does nothing. */
  async close(): Promise<void> {
    if (this.#ownsConnection) {
      await this.nc.close();
    }
  }

  /**
   * Asks the workers' tool catalogue which tools exist and how each derives
   * its keys.
   *
   * @returns the catalogue
   * @throws the request's error (no responders, timeout) or {@link IdemError} (`bad_catalog`)
   */
  async tools(): Promise<Catalog> {
    const m = await this.nc.request(this.names.toolsSubject, undefined, { timeout: this.#catalogTimeout });
    let cat: unknown;
    try {
      cat = JSON.parse(m.string());
    } catch (err) {
      throw new IdemError("bad_catalog", `tool catalogue: ${String(err)}`);
    }
    if (typeof cat !== "object" || cat === null || !Array.isArray((cat as { tools?: unknown }).tools)) {
      throw new IdemError("bad_catalog", "tool catalogue: no tools list");
    }
    return cat as Catalog;
  }

  /**
   * Returns the key spec of `tool`: from the options, else from the
   * catalogue (asked once), else the default derivation.
   *
   * @param tool - the tool name
   * @returns its key spec
   */
  async spec(tool: string): Promise<KeySpec> {
    const known = this.#specs.get(tool);
    if (known !== undefined) {
      return known;
    }
    this.#catalog ??= this.tools().then(
      (cat) => {
        for (const t of cat.tools) {
          if (t.ledger === false) {
            this.#noLedger.add(t.name);
          }
          if (t.on_failure === "retry") {
            this.#retryFailed.add(t.name);
          }
          if (t.on_complete === "reject") {
            this.#rejectRepeat.add(t.name);
          }
          if (t.lease_seconds > 0) {
            this.#leases.set(t.name, t.lease_seconds * 1000);
          }
          if (!this.#specs.has(t.name)) {
            this.#specs.set(t.name, {
              key_args: t.key_args ?? [],
              window_seconds: t.window_seconds ?? 0,
              volatile_args: t.volatile_args ?? [],
            });
          }
        }
      },
      () => undefined, // no catalogue: the default derivation
    );
    await this.#catalog;
    const spec = this.#specs.get(tool) ?? {};
    this.#specs.set(tool, spec); // remembered, so later calls don't ask again
    return spec;
  }

  /**
   * Derives the envelope's key, publishes it on `idem.intents.<tool>` with
   * `Nats-Msg-Id` set to the key and `Idem-Reply-To` set to a private inbox,
   * and returns the submission to wait on. For a window tool a missing
   * `created_at` is set to now **on `env` itself**, so that the client and
   * the workers derive the same key and a retry of the same object keeps it.
   *
   * @param env - the intent
   * @returns the submission
   * @throws {@link InvalidIntentError} for an intent a worker would reject; {@link IdemError} (`publish_failed`, the cause attached) when the publish fails (no stream, payload over the server's max_payload)
   */
  async publish(env: Envelope): Promise<Submission> {
    checkEnvelope(env);
    const spec = await this.spec(env.tool);
    if ((spec.window_seconds ?? 0) > 0 && env.created_at === undefined) {
      env.created_at = new Date().toISOString();
    }
    const id = deriveKey(env, spec);
    // Publish dedup answers a repeat from the ledger; a tool without the
    // ledger fires every intent, and one that retries failures runs a failed
    // operation again, so their repeats must reach a worker.
    const noLedger = this.#noLedger.has(env.tool);
    const retryFailed = this.#retryFailed.has(env.tool);
    const rejectRepeat = this.#rejectRepeat.has(env.tool);
    const inbox = createInbox(this.#inboxPrefix);
    // Not max: 1 — an answer for another operation is dropped, not taken.
    const sub = this.nc.subscribe(inbox);
    const subject = this.names.intentPrefix + env.tool;
    const payload = encodeEnvelope(env);
    const call = randomBytes(16).toString("hex");
    const send = (msgID: string | undefined): Promise<PubAck> => {
      const h = headers();
      h.set(HEADER_REPLY_TO, inbox);
      h.set(HEADER_KEY, id.key);
      h.set(HEADER_FINGERPRINT, id.fingerprint);
      h.set(HEADER_SUBMISSION, call);
      return publishRetryingInProcess(() =>
        this.#js.publish(subject, payload, { ...(msgID !== undefined ? { msgID } : {}), headers: h }),
      );
    };
    try {
      const ack = await send(noLedger || retryFailed ? undefined : id.key);
      const republish = async (): Promise<PubAck> => send(`${id.key}:${randomBytes(8).toString("hex")}`);
      const leaseMs = this.#leases.get(env.tool) ?? DEFAULT_LEASE_MS;
      return new Submission(this, sub, env, id, ack, { grace: this.#grace, noLedger, leaseMs, republish, retryFailed, rejectRepeat });
    } catch (err) {
      sub.unsubscribe();
      throw new IdemError("publish_failed", `publish ${subject}: ${String(err)}`, { cause: err });
    }
  }

  /**
   * Publishes `env` and waits for its answer. A duplicate is an answer
   * (`replayed: true`), not an error; so is a conflict.
   *
   * @param env - the intent
   * @param timeoutMs - how long to wait. Default: {@link DEFAULT_WAIT_MS} (3 min)
   * @returns the answer
   * @throws {@link NoAnswerError} when no answer came in time; see {@link IdemClient.publish}
   */
  async submit(env: Envelope, timeoutMs: number = DEFAULT_WAIT_MS): Promise<Result> {
    const s = await this.publish(env);
    return s.wait(timeoutMs);
  }

  /**
   * Publishes an operator decision and waits for the worker's answer: for an
   * approval, the result of the firing it let happen; for a denial or a
   * resolution, the operation's new state. A decision that does not apply
   * (no such key, wrong state, other arguments) is answered `rejected` with
   * an error code, not thrown.
   *
   * @param op - approve, deny or resolve
   * @param decision - the decision
   * @param timeoutMs - how long to wait. Default: {@link DEFAULT_WAIT_MS}
   * @returns the answer
   * @throws {@link IdemError} (`invalid_decision`) for a malformed decision; {@link NoAnswerError} when none came in time
   */
  async decide(op: DecisionOp, decision: Decision, timeoutMs: number = DEFAULT_WAIT_MS): Promise<Result> {
    const payload = encodeDecision(op, decision);
    const inbox = createInbox(this.#inboxPrefix);
    const sub = this.nc.subscribe(inbox, { timeout: timeoutMs });
    const h = headers();
    h.set(HEADER_REPLY_TO, inbox);
    let ack: PubAck;
    try {
      ack = await this.#js.publish(this.names.controlPrefix + op, payload, { headers: h });
    } catch (err) {
      sub.unsubscribe();
      throw new IdemError("publish_failed", `publish ${this.names.controlPrefix}${op}: ${String(err)}`, { cause: err });
    }
    try {
      for await (const m of sub) {
        // Only the answer bound to this decision's own message counts: anyone
        // who learns the inbox can name it as another message's reply subject.
        if (m.headers?.get(HEADER_INTENT_SEQ) !== String(ack.seq)) {
          continue;
        }
        let res: unknown;
        try {
          res = JSON.parse(m.string());
        } catch {
          continue; // not an answer: dropped
        }
        if (typeof res === "object" && res !== null) {
          answerTexts.set(res, m.data);
          return this.checkReceipt(res as Result);
        }
      }
    } catch (err) {
      if (err instanceof IdemError) {
        throw err;
      }
      // the subscription's timeout: no answer, as when it ends without one
    } finally {
      sub.unsubscribe();
    }
    throw new NoAnswerError(decision.key, `no answer to ${op} of ${decision.key} within ${timeoutMs} ms`);
  }

  /**
   * Returns `res` once its receipt verified with the client's receipt keys
   * (unchanged without keys, or for an answer that carries none: one not
   * final, a rejection, a conflict the client found in the ledger itself).
   *
   * @param res - an answer
   * @returns the answer
   * @throws {@link BadReceiptError}
   */
  checkReceipt(res: Result): Result {
    if (this.receiptKeys === undefined || !receipted(res.status) || (res.status === "conflict" && res.receipt === undefined)) {
      return res;
    }
    try {
      // The answer as it came, when it came as text: read strictly (a
      // repeated member name, which JSON.parse merges, is refused).
      const text = answerTexts.get(res);
      verifyReceipt(text !== undefined ? strictAnswer(text) : res, this.receiptKeys);
    } catch (err) {
      throw err instanceof ReceiptError ? new BadReceiptError(res, err) : err;
    }
    return res;
  }

  /**
   * Reads the ledger record of `key` from the stream leader (not a direct
   * get, which a follower may answer before it has the latest write).
   *
   * @param key - the key
   * @returns the record
   * @throws {@link NotFoundError} when there is none
   */
  async get(key: string): Promise<LedgerRecord> {
    const shape = await this.#ledger();
    const place = placeOf(shape, key, this.names.bucket);
    let e = await place.kv.get(place.stored);
    if (e === null || e.operation !== "PUT") {
      // A miss may be a migration that moved the record: look at the
      // ledger's shape, and read its new place when it changed.
      const now = await this.#ledger(Date.now()); // a look begun after the miss
      if (now !== shape) {
        const { kv, stored } = placeOf(now, key, this.names.bucket);
        e = await kv.get(stored);
      }
    }
    if (e === null || e.operation !== "PUT") {
      throw new NotFoundError(key);
    }
    const rec = decodeRecord(e.value);
    if (rec === undefined) {
      throw new IdemError("bad_record", `the ledger record of ${key} is not a record`);
    }
    return rec;
  }

  /**
   * Waits until the ledger record of `key` is an answer (see
   * {@link isAnswered}) and returns it.
   *
   * @param key - the key
   * @param timeoutMs - how long to wait. Default: {@link DEFAULT_WAIT_MS}
   * @returns the record
   * @throws {@link NoAnswerError} when none came in time
   */
  async watch(key: string, timeoutMs: number = DEFAULT_WAIT_MS): Promise<LedgerRecord> {
    return this.watchUntil(key, timeoutMs, (r) => isAnswered(r.status));
  }

  /**
   * Waits until the ledger record of `key` is final (see {@link isFinal}) —
   * past `awaiting_approval` and `uncertain` — and returns it.
   *
   * @param key - the key
   * @param timeoutMs - how long to wait. Default: {@link DEFAULT_WAIT_MS}
   * @returns the record
   * @throws {@link NoAnswerError} when none came in time
   */
  async watchFinal(key: string, timeoutMs: number = DEFAULT_WAIT_MS): Promise<LedgerRecord> {
    return this.watchUntil(key, timeoutMs, (r) => isFinal(r.status));
  }

  private async watchUntil(key: string, timeoutMs: number, accept: (rec: LedgerRecord) => boolean): Promise<LedgerRecord> {
    const watch = this.followKey(key, (rec) => rec !== undefined && accept(rec));
    const timer = setTimeout(() => watch.stop(), timeoutMs);
    try {
      const rec = await watch.done;
      if (rec === undefined) {
        throw new NoAnswerError(key, `no answer for ${key} within ${timeoutMs} ms`);
      }
      return rec;
    } finally {
      clearTimeout(timer);
      watch.stop();
    }
  }

  /**
   * Watches the ledger record of `key` and calls `each` with every version
   * of it read (undefined when it is deleted or purged) until `each` returns
   * true, or `stop` is called. The watch creates no consumer: it subscribes
   * to the key's own subject (`$KV.<bucket>.<key>`, on which every write is
   * published) and reads the record from the stream leader at the start,
   * after each message there (which only signals: it may come before the
   * write is stored, or for a write the stream refused, so a read that
   * shows nothing new is made again shortly), and at growing intervals (1 s
   * doubling up to 16 s) in case a message was missed. So it sees acknowledged writes only, and may skip
   * versions written between two reads. It follows the key: while it runs,
   * the client looks at the ledger's recorded shape every 5 s, and when a
   * migration changed it (docs/protocol.md 6.1, 6.2) watches the key's new
   * place; a migration under way is waited out.
   *
   * @internal used by {@link IdemClient.watch} and {@link Submission}
   * @param key - the operation's key
   * @param each - called with each record; true ends the watch
   * @returns `done`, the record `each` accepted (undefined once stopped), and `stop`
   */
  followKey(key: string, each: (rec: LedgerRecord | undefined) => boolean | Promise<boolean>): { done: Promise<LedgerRecord | undefined>; stop: () => void } {
    let stopped = false;
    let wake: (() => void) | undefined;
    const stop = (): void => {
      stopped = true;
      wake?.();
    };
    /** Resolves after `ms`, at a signal on the key's subject (`signalled` then true), or at stop. */
    let signalled = false;
    const pause = (ms: number): Promise<void> =>
      new Promise<void>((resolve) => {
        if (stopped || signalled) {
          resolve();
          return;
        }
        const t = setTimeout(end, ms);
        function end(): void {
          clearTimeout(t);
          wake = undefined;
          resolve();
        }
        wake = end;
      });
    const done = (async (): Promise<LedgerRecord | undefined> => {
      let wait = 250;
      while (!stopped) {
        let shape: LedgerShape;
        try {
          shape = await this.#ledger();
        } catch (err) {
          if (!(err instanceof IdemError) || err.code !== "ledger_migrating") {
            throw err;
          }
          await pause(wait);
          wait = Math.min(wait * 2, 5_000);
          continue;
        }
        wait = 250;
        const { kv, stored, subject } = placeOf(shape, key, this.names.bucket);
        // Subscribed before the first read: a write after the read signals.
        const sub = this.nc.subscribe(subject, {
          callback: () => {
            signalled = true;
            wake?.();
          },
        });
        let seen = 0; // the revision the latest read found (0: none yet)
        let settle = 0; // the pause before reading again after a signal whose write the leader did not show yet; 0: none
        let recheck = WAIT_RECHECK_FIRST_MS; // the pause before reading again without a signal
        let lookedAt = Date.now();
        try {
          while (!stopped) {
            if (signalled) {
              signalled = false;
              settle = WAIT_SETTLE_FIRST_MS;
            }
            let e: KvEntry | null;
            try {
              e = await kv.get(stored);
            } catch {
              // The ledger cannot be read now: a caller outlives an outage.
              await pause(wait);
              wait = Math.min(wait * 2, 5_000);
              continue;
            }
            wait = 250;
            let next = recheck;
            const rev = e?.revision ?? 0;
            if (rev !== seen) {
              seen = rev;
              settle = 0;
              const rec = e !== null && e.operation === "PUT" ? decodeRecord(e.value) : undefined;
              if (await each(rec)) {
                return rec;
              }
            } else if (settle > 0 && settle <= WAIT_SETTLE_LAST_MS) {
              next = settle;
              settle *= 2;
            } else {
              recheck = Math.min(2 * recheck, WAIT_RECHECK_LAST_MS);
            }
            await pause(next);
            // A key whose place a migration moved is never answered where it
            // was watched: look at the shape, and watch again when it changed.
            if (Date.now() - lookedAt >= SHAPE_RECHECK_MS) {
              lookedAt = Date.now();
              let moved: boolean;
              try {
                moved = (await this.#ledger()) !== shape;
              } catch (err) {
                moved = err instanceof IdemError && err.code === "ledger_migrating";
              }
              if (moved) {
                break;
              }
            }
          }
        } finally {
          sub.unsubscribe();
        }
      }
      return undefined;
    })();
    return { done, stop };
  }

  /**
   * Lists the dead-letter stream, oldest first: intents the workers could
   * not handle, with why.
   *
   * @param limit - at most this many (0: all). Default: 0
   * @returns the dead letters
   * @throws {@link IdemError} (`no_dlq`) when the stream does not exist
   */
  async deadLetters(limit = 0): Promise<DeadLetter[]> {
    const jsm = await jetstreamManager(this.nc);
    let first: number, last: number;
    try {
      const info = await jsm.streams.info(this.names.dlqStream);
      ({ first_seq: first, last_seq: last } = info.state);
    } catch (err) {
      throw new IdemError("no_dlq", `dead-letter stream ${this.names.dlqStream}: ${String(err)}`, { cause: err });
    }
    const out: DeadLetter[] = [];
    for (let seq = first; seq > 0 && seq <= last && (limit <= 0 || out.length < limit); seq++) {
      let m: StoredMsg | null;
      try {
        m = await jsm.streams.getMessage(this.names.dlqStream, { seq });
      } catch {
        continue; // replayed and removed
      }
      if (m !== null) {
        out.push(deadLetterOf(m));
      }
    }
    return out;
  }

  /**
   * Publishes dead letter `seq` again on its original subject with its
   * original headers (its `Nats-Msg-Id` is not restored: the ledger decides
   * whether it fires), then removes it from the dead-letter stream.
   *
   * @param seq - the dead letter's sequence ({@link IdemClient.deadLetters} shows it)
   * @returns the new sequence in the work stream
   * @throws {@link IdemError} (`no_dead_letter`, `publish_failed`)
   */
  async replayDeadLetter(seq: number): Promise<number> {
    const jsm = await jetstreamManager(this.nc);
    let m: StoredMsg | null;
    try {
      m = await jsm.streams.getMessage(this.names.dlqStream, { seq });
    } catch (err) {
      throw new IdemError("no_dead_letter", `dead letter ${seq}: ${String(err)}`, { cause: err });
    }
    if (m === null) {
      throw new IdemError("no_dead_letter", `dead letter ${seq}: not found`);
    }
    const d = deadLetterOf(m);
    if (d.subject === "") {
      throw new IdemError("no_dead_letter", `dead letter ${seq} has no original subject`);
    }
    const h = headers();
    for (const [k, vs] of Object.entries(d.headers)) {
      for (const v of vs) h.append(k, v);
    }
    let ack: PubAck;
    try {
      ack = await this.#js.publish(d.subject, m.data, { headers: h });
    } catch (err) {
      throw new IdemError("publish_failed", `replay dead letter ${seq} to ${d.subject}: ${String(err)}`, { cause: err });
    }
    await jsm.streams.deleteMessage(this.names.dlqStream, seq);
    return ack.seq;
  }

  /**
   * The ledger bucket holding `key`: its partition's (docs/protocol.md,
   * 6.1), partition 0's without a key. The partitions are opened once, as
   * many as partition 0's stream metadata records. They read from the stream
   * leader (`allow_direct: false`). Read a key's record under its KV key
   * ({@link IdemClient.ledger}), not under the key itself.
   *
   * @param key - the key whose bucket to return. Default: partition 0's
   * @returns the bucket
   * @throws {@link IdemError} (`no_ledger`, `unknown_layout`)
   */
  async bucket(key?: string): Promise<KV> {
    const { kvs } = await this.#ledger();
    const kv = kvs[key === undefined ? 0 : partition(key, kvs.length)];
    if (kv === undefined) {
      throw new IdemError("no_ledger", `ledger bucket ${this.names.bucket}: no partition for ${String(key)}`);
    }
    return kv;
  }

  /**
   * Where the ledger keeps the record of `key`: its partition's bucket
   * (6.1) and its KV key there in the ledger's key layout (6.2), which
   * partition 0's stream metadata records.
   *
   * @param key - the operation's key
   * @returns the bucket and the KV key
   * @throws {@link IdemError} (`no_ledger`; `ledger_migrating` while a
   * migration is under way; `unknown_layout` for a layout this client does
   * not know; `bad_key` for a key the layout cannot store)
   */
  async ledger(key: string): Promise<{ kv: KV; stored: string }> {
    return placeOf(await this.#ledger(), key, this.names.bucket);
  }

  /**
   * The ledger, opened on first use; unless a look that began at `since` (ms
   * since the epoch; default: 5 s ago) or later found the ledger in the
   * shape it was opened in, the client looks at the shape partition 0's
   * stream records, and opens the ledger again when a migration changed it.
   * Concurrent callers share a look. A look that cannot reach the server
   * keeps the ledger as it is (its reads say what is wrong).
   */
  #ledger(since: number = Date.now() - SHAPE_RECHECK_MS): Promise<LedgerShape> {
    if (this.#kv === undefined) {
      const began = Date.now();
      this.#kv = this.#readShape()
        .then((shape) => this.#open(shape, began))
        .catch((err: unknown) => {
          this.#kv = undefined;
          throw ledgerError(err, this.names.bucket);
        });
      return this.#kv;
    }
    if (this.#shapeAt >= since) {
      return this.#kv;
    }
    if (this.#look !== undefined && this.#look.began >= since) {
      return this.#look.shape;
    }
    const began = Date.now();
    const look = this.#lookAgain(this.#kv, began).finally(() => {
      if (this.#look?.shape === look) this.#look = undefined;
    });
    this.#look = { began, shape: look };
    return look;
  }

  async #lookAgain(opened: Promise<LedgerShape>, began: number): Promise<LedgerShape> {
    const had = await opened;
    let now: { partitions: number; layout: number };
    try {
      now = await this.#readShape();
    } catch (err) {
      if (err instanceof IdemError && (err.code === "ledger_migrating" || err.code === "unknown_layout")) {
        this.#kv = undefined; // open it again once the migration is done
        throw err;
      }
      return had; // cannot tell now
    }
    if (now.partitions === had.kvs.length && now.layout === had.layout) {
      this.#shapeAt = Math.max(this.#shapeAt, began);
      return had;
    }
    const reopened = this.#open(now, began).catch((err: unknown) => {
      this.#kv = undefined;
      throw ledgerError(err, this.names.bucket);
    });
    this.#kv = reopened;
    return reopened;
  }

  /** The shape partition 0's stream records: its partition count and key layout. */
  async #readShape(): Promise<{ partitions: number; layout: number }> {
    // No account-info check ($JS.API.INFO): an agent may not ask for it.
    const jsm = await jetstreamManager(this.nc, { checkAPI: false });
    const info = await jsm.streams.info(`KV_${this.names.bucket}`);
    const recorded = info.config.metadata?.[PARTITIONS_METADATA];
    const n = recorded === undefined ? 1 : Number(recorded);
    if (!validPartitions(n)) {
      throw new IdemError("no_ledger", `ledger ${this.names.bucket}: stream metadata ${PARTITIONS_METADATA}=${String(recorded)} is not a partition count`);
    }
    const migrating = info.config.metadata?.["idemgate.migrating"];
    if (migrating !== undefined) {
      throw new IdemError(
        "ledger_migrating",
        `ledger ${this.names.bucket} is being migrated (stream metadata idemgate.migrating=${migrating}): try again once the migration finished`,
      );
    }
    const recordedLayout = info.config.metadata?.[LAYOUT_METADATA];
    const layout = recordedLayout === undefined ? LAYOUT_FULL : Number(recordedLayout);
    if (!validLayout(layout)) {
      throw new IdemError(
        "unknown_layout",
        `ledger ${this.names.bucket} records key layout ${JSON.stringify(recordedLayout)} (stream metadata ${LAYOUT_METADATA}), which this client does not know: upgrade it`,
      );
    }
    return { partitions: n, layout };
  }

  /** Opens the buckets of a ledger of `shape`, read by a look that began at `began`; they read from the stream leader (`allow_direct: false`). */
  async #open(shape: { partitions: number; layout: number }, began: number): Promise<LedgerShape> {
    const kvm = new Kvm(this.#js);
    const kvs = await Promise.all(
      Array.from({ length: shape.partitions }, (_, i) => kvm.open(partitionBucket(this.names.bucket, i), { allow_direct: false })),
    );
    this.#shapeAt = began;
    return { kvs, layout: shape.layout };
  }
}

/** An error opening the ledger, as the client throws it: an {@link IdemError}, else `no_ledger` with the cause. */
function ledgerError(err: unknown, bucket: string): IdemError {
  return err instanceof IdemError ? err : new IdemError("no_ledger", `ledger bucket ${bucket}: ${String(err)}`, { cause: err });
}

/** The bucket and KV key of `key` in a ledger of `shape`, and the subject its writes are published on. */
function placeOf(shape: LedgerShape, key: string, bucket: string): { kv: KV; stored: string; subject: string } {
  const p = partition(key, shape.kvs.length);
  const kv = shape.kvs[p];
  if (kv === undefined) {
    throw new IdemError("no_ledger", `ledger bucket ${bucket}: no partition for ${key}`);
  }
  const stored = ledgerKey(key, shape.layout);
  return { kv, stored, subject: `$KV.${partitionBucket(bucket, p)}.${stored}` };
}

/** An intent in the dead-letter stream, as `submit dlq list` prints it. */
export interface DeadLetter {
  /** Its sequence in the dead-letter stream. */
  seq: number;
  /** The subject it was published on. */
  subject: string;
  /** Why it was dead-lettered. */
  reason: string;
  /** Its sequence in the work stream. */
  stream_seq: number;
  /** How many times it was delivered. */
  delivered: number;
  /** RFC 3339 time it was dead-lettered. */
  time: string;
  /** Its original headers. */
  headers: Record<string, string[]>;
  /** The payload, when it is JSON. */
  data?: JsonValue;
  /** The payload, when it is not. */
  raw?: string;
}

function deadLetterOf(m: StoredMsg): DeadLetter {
  const get = (k: string): string => m.header?.get(k) ?? "";
  const hs: Record<string, string[]> = {};
  for (const [k, vs] of m.header ?? []) {
    if (!k.startsWith("Idem-Dlq-")) hs[k] = vs;
  }
  const d: DeadLetter = {
    seq: m.seq,
    subject: get("Idem-Dlq-Subject"),
    reason: get("Idem-Dlq-Reason"),
    stream_seq: Number(get("Idem-Dlq-Stream-Seq")) || 0,
    delivered: Number(get("Idem-Dlq-Delivered")) || 0,
    time: get("Idem-Dlq-Time"),
    headers: hs,
  };
  const text = new TextDecoder().decode(m.data);
  try {
    d.data = JSON.parse(text) as JsonValue;
  } catch {
    d.raw = text;
  }
  return d;
}

/** JetStream's err_code for a publish whose Nats-Msg-Id another publish is storing right now. */
const ERR_MSG_ID_IN_PROCESS = 10158;

/**
 * Runs `publish`, and runs it again after a short pause while JetStream
 * answers that a publish with the same `Nats-Msg-Id` is in process (seen on
 * replicated streams with concurrent copies): the copy is a duplicate, and
 * the retry is acknowledged as one.
 */
async function publishRetryingInProcess<T>(publish: () => Promise<T>): Promise<T> {
  let pause = 5;
  for (let attempt = 0; ; attempt++) {
    try {
      return await publish();
    } catch (err) {
      const code = (err as { code?: unknown }).code;
      if (code !== ERR_MSG_ID_IN_PROCESS || attempt >= 20) {
        throw err;
      }
      await new Promise((resolve) => setTimeout(resolve, pause));
      pause = Math.min(pause * 2, 500);
    }
  }
}

/** How a {@link Submission} waits: built by {@link IdemClient.publish}. */
interface SubmissionOptions {
  /** The reply grace, in ms. */
  grace: number;
  /** The tool has no ledger: only its reply answers it. */
  noLedger: boolean;
  /** The tool's lease, in ms: a pending record whose lease ran out a lease ago is abandoned (its intent is gone). */
  leaseMs: number;
  /** Publishes the intent again with a fresh `Nats-Msg-Id` (`<key>:<random>`). */
  republish: () => Promise<PubAck>;
  /** The tool runs a failed operation again: another call's failure answers nothing. */
  retryFailed?: boolean;
  /** The tool answers another call's completion `already_done`. */
  rejectRepeat?: boolean;
}

/**
 * Reports whether an answer names the operation of `key` and `fingerprint`:
 * its `key` equals the submission's and its `fingerprint`, when present,
 * too. A pushed answer must also be bound to the submission's own publish
 * ({@link answerBound}).
 *
 * @param res - a decoded answer
 * @param key - the submission's key
 * @param fingerprint - the submission's fingerprint
 * @returns true when the answer names this operation
 */
export function answerMatches(res: Partial<Result>, key: string, fingerprint: string): boolean {
  return res.key === key && (res.fingerprint === undefined || res.fingerprint === "" || res.fingerprint === fingerprint);
}

/**
 * Reports whether a pushed answer belongs to a submission (docs/protocol.md
 * 7.1): its `Idem-Intent-Seq` header is the stream sequence of one of the
 * submission's own stored publishes (`own`: the sequences of its PubAcks
 * without `duplicate`; a duplicate's names another caller's message), and,
 * unless it is a rejection (which a worker may give before it could derive
 * a key), it names the submission's operation ({@link answerMatches}); an
 * answer that is not a replay names the run of one of the submission's
 * publishes (its `intent_seq`, when it has one), never another run's. The
 * reply subject is no proof of identity: anyone who learns an inbox can name
 * it as the reply subject of an intent of their own, and a worker answers
 * that intent with its own sequence.
 *
 * @param intentSeq - the answer's `Idem-Intent-Seq` header (undefined or "" when absent)
 * @param res - the decoded answer
 * @param sub - the submission's key, fingerprint and own sequences
 * @returns true when the answer is this submission's
 */
export function answerBound(
  intentSeq: string | undefined,
  res: Partial<Result>,
  sub: { key: string; fingerprint: string; own: ReadonlySet<number> },
): boolean {
  const seq = intentSeq !== undefined && /^[1-9][0-9]{0,19}$/.test(intentSeq) ? Number(intentSeq) : 0;
  if (!sub.own.has(seq)) {
    return false;
  }
  if (res.replayed !== true && typeof res.intent_seq === "number" && res.intent_seq !== 0 && !sub.own.has(res.intent_seq)) {
    return false; // not a replay, yet of another run than this publish's: another run's answer
  }
  return res.status === "rejected" || answerMatches(res, sub.key, sub.fingerprint);
}

/** One published intent awaiting its answer. */
export class Submission {
  /** The key, as the client derived it. */
  readonly key: string;
  /** The fingerprint, as the client derived it. */
  readonly fingerprint: string;
  /** JetStream dropped the publish as a duplicate of an earlier intent with this key: the answer comes from the ledger. */
  readonly duplicate: boolean;
  /** The intent's stream sequence (the original's, when `duplicate`). */
  readonly sequence: number;
  /** How many times the intent was published again with a fresh `Nats-Msg-Id` (protocol section 7: a duplicate with no record). */
  republished = 0;
  /** Messages on the inbox dropped because they were not answers bound to this submission's own publishes. */
  dropped = 0;
  readonly #client: IdemClient;
  readonly #sub: Subscription;
  readonly #tool: string;
  readonly #callID: string | undefined;
  readonly #opts: SubmissionOptions;
  /** Stream sequences of this submission's own stored publishes: a record claimed by one of them is this call's outcome. */
  readonly #own = new Set<number>();
  #waited = false;

  /** @internal Built by {@link IdemClient.publish}. */
  constructor(client: IdemClient, sub: Subscription, env: Envelope, id: { key: string; fingerprint: string }, ack: PubAck, opts: SubmissionOptions) {
    this.#client = client;
    this.#sub = sub;
    this.#tool = env.tool;
    this.#callID = env.call_id;
    this.key = id.key;
    this.fingerprint = id.fingerprint;
    this.duplicate = ack.duplicate;
    this.sequence = ack.seq;
    this.#opts = opts;
    if (!ack.duplicate) {
      this.#own.add(ack.seq);
    }
  }

  /**
   * Returns the answer: the pushed reply, or — when the publish was a
   * duplicate, or no reply came within the grace period — the record watched
   * on the ledger key. A record with another fingerprint is answered as a
   * `conflict` (publish dedup hides a conflict from the workers). An answer
   * whose key or fingerprint is not this submission's is dropped. An
   * intent without a reply whose key shows no record after the grace — a
   * duplicate, or a stored intent a server crash lost — is published again
   * with a fresh `Nats-Msg-Id`, then after twice the grace, and so on; a
   * republish that fails is tried again at the next turn. Call it once.
   *
   * @param timeoutMs - how long to wait. Default: {@link DEFAULT_WAIT_MS}
   * @returns the answer
   * @throws {@link NoAnswerError} when none came in time; {@link IdemError} (`already_waited`) on a second call
   */
  wait(timeoutMs: number = DEFAULT_WAIT_MS): Promise<Result> {
    return this.#wait(timeoutMs, isAnswered);
  }

  /**
   * {@link Submission.wait} that goes on past `awaiting_approval` and
   * `uncertain` answers, watching the ledger, until the operation's final
   * answer (completed, failed, denied, conflict, rejected): an operator's
   * approval, denial or resolution decides it. Call it once (instead of
   * `wait`).
   *
   * @param timeoutMs - how long to wait in all. Default: {@link DEFAULT_WAIT_MS}
   * @returns the final answer
   * @throws {@link NoAnswerError} when none came in time; {@link IdemError} (`already_waited`) on a second call
   */
  waitFinal(timeoutMs: number = DEFAULT_WAIT_MS): Promise<Result> {
    return this.#wait(timeoutMs, isFinal);
  }

  #wait(timeoutMs: number, enough: (status: string) => boolean): Promise<Result> {
    if (this.#waited) {
      return Promise.reject(new IdemError("already_waited", `the submission of ${this.key} was already waited on`));
    }
    this.#waited = true;
    const grace = this.#opts.grace;
    return new Promise<Result>((resolve, reject) => {
      let settled = false;
      let watching = false;
      /** The ledger key has shown a record (of any status) since watching. */
      // The latest record of the key the watch saw; undefined: none (or
      // deleted). A pending one whose lease ran out a lease ago answers
      // nothing: its intent is gone (dead-lettered), so it counts as none.
      let latest: LedgerRecord | undefined;
      // A republish whose acknowledgement has not come yet: a record of its
      // firing can arrive first, and is this call's own only once its
      // sequence is known (7.4).
      let acking: Promise<unknown> | undefined;
      const unrecorded = (): boolean =>
        latest === undefined ||
        latest.status === "forgotten" ||
        (latest.status === "pending" && Date.parse(latest.lease_until ?? "") + this.#opts.leaseMs < Date.now());
      /** A reply of this submission arrived. */
      let replied = false;
      let stopWatch: (() => void) | undefined;
      const timers: NodeJS.Timeout[] = [];
      const finish = (outcome: { res: Result } | { err: unknown }): void => {
        if (settled) {
          return;
        }
        settled = true;
        timers.forEach(clearTimeout);
        this.#sub.unsubscribe();
        stopWatch?.();
        if ("res" in outcome) {
          try {
            resolve(this.#checkRun(this.#client.checkReceipt(outcome.res)));
          } catch (err) {
            reject(err);
          }
        } else {
          reject(outcome.err);
        }
      };
      const startWatch = async (): Promise<void> => {
        if (watching || settled || this.#opts.noLedger) {
          return; // a tool without the ledger is answered by its reply only
        }
        watching = true;
        const w = this.#client.followKey(this.key, async (rec) => {
          latest = rec; // undefined: deleted or purged, the key is free again
          // A record of another fingerprint is a conflict: final.
          if (rec === undefined || !isAnswered(rec.status) || (!enough(rec.status) && rec.fingerprint === this.fingerprint)) {
            return false;
          }
          if (
            this.#opts.retryFailed &&
            rec.status === "failed" &&
            rec.fingerprint === this.fingerprint &&
            (rec.intent_seq === undefined || !this.#own.has(rec.intent_seq))
          ) {
            return false; // another call's failure: this call runs it again
          }
          if (acking !== undefined) {
            await acking;
          }
          return true;
        });
        stopWatch = w.stop;
        try {
          const rec = await w.done;
          if (rec !== undefined) {
            finish({ res: this.fromRecord(rec) });
          }
        } catch (err) {
          finish({ err });
        }
      };
      // Answers bound to no publish of this submission known yet, held while
      // a republish is being acknowledged: its answer can come before its
      // PubAck, and is this submission's once the sequence is known.
      let publishing = 0;
      const held: { intentSeq: string | undefined; res: Result }[] = [];
      const consider = (intentSeq: string | undefined, res: Result): void => {
        if (settled) {
          return;
        }
        if (!answerBound(intentSeq, res, { key: this.key, fingerprint: this.fingerprint, own: this.#own })) {
          if (publishing > 0) {
            held.push({ intentSeq, res });
          } else {
            this.dropped++;
          }
          return;
        }
        replied = true;
        if (enough(res.status)) {
          finish({ res });
          return;
        }
        void startWatch(); // the final answer comes from the ledger
      };
      const acknowledged = (): void => {
        publishing--;
        for (const h of held.splice(0)) {
          consider(h.intentSeq, h.res);
        }
      };
      const readReply = async (): Promise<void> => {
        try {
          for await (const m of this.#sub) {
            let res: unknown;
            try {
              res = JSON.parse(m.string());
            } catch {
              this.dropped++; // not an answer at all: not this submission's
              continue;
            }
            if (typeof res !== "object" || res === null) {
              this.dropped++;
              continue;
            }
            answerTexts.set(res, m.data);
            consider(m.headers?.get(HEADER_INTENT_SEQ), res as Result);
          }
        } catch (err) {
          finish({ err });
        }
      };
      // Protocol section 7.2, the retry rule: a duplicate whose key shows no
      // record (or an abandoned pending one) after the grace is published
      // again with a fresh Nats-Msg-Id, then after twice the grace, and so
      // on, until a reply or an answering record. So is a stored publish
      // without a reply: a server crash can lose an intent it acknowledged
      // (a work stream persisted asynchronously).
      const republishLater = (delay: number): void => {
        timers.push(
          setTimeout(() => {
            if (settled || replied) {
              return;
            }
            if (!unrecorded()) {
              republishLater(delay * 2); // the record will answer; look again later
              return;
            }
            publishing++;
            const sent = this.#opts.republish();
            sent.then(
              (ack) => {
                this.republished++;
                if (!ack.duplicate) {
                  this.#own.add(ack.seq);
                }
                acknowledged();
                republishLater(delay * 2);
              },
              () => {
                acknowledged();
                republishLater(delay * 2); // the server may be restarting: the next turn tries again
              },
            );
            acking = sent.catch(() => undefined); // after the reactions above: the sequence is known then
          }, delay),
        );
      };
      timers.push(
        setTimeout(() => finish({ err: new NoAnswerError(this.key, `no answer for ${this.key} within ${timeoutMs} ms`) }), timeoutMs),
      );
      void readReply();
      if (this.duplicate) {
        void startWatch();
        if (!this.#opts.noLedger) {
          republishLater(grace);
        }
      } else {
        timers.push(
          setTimeout(() => {
            void startWatch();
            if (!this.#opts.noLedger) {
              republishLater(grace); // the watch has a grace to report the record
            }
          }, grace),
        );
      }
    });
  }

  /**
   * Returns `res` when the client checks no receipts, `res` carries none, is
   * a replay, or names a run (`intent_seq`) one of this submission's own
   * publishes started: a run's whole answer, receipt and all, replayed to a
   * caller of a later run of its key verifies but for that.
   *
   * @param res - an answer whose receipt verified
   * @returns the answer
   * @throws {@link BadReceiptError} (`mismatch`) for another run's answer that says it is not replayed
   */
  #checkRun(res: Result): Result {
    if (
      this.#client.receiptKeys === undefined ||
      !receipted(res.status) ||
      (res.status === "conflict" && res.receipt === undefined) ||
      res.replayed === true ||
      (typeof res.intent_seq === "number" && this.#own.has(res.intent_seq))
    ) {
      return res;
    }
    throw new BadReceiptError(
      res,
      new ReceiptError("mismatch", `the answer is not a replay, yet its run (intent_seq ${String(res.intent_seq ?? 0)}) is none of this call's publishes: another run's answer`),
    );
  }

  /**
   * The answer a ledger record gives this submission: a conflict when the
   * fingerprints differ (its `fingerprint` this submission's, its
   * `record_fingerprint` the record's; not a replay: it is about this call),
   * else the record's outcome, `replayed` unless one of this submission's own
   * publishes claimed the record. Only final answers carry `completed_at`
   * and the record's receipt (see {@link recordReceipt}).
   *
   * @param rec - an answered record of this key
   * @returns the answer
   */
  fromRecord(rec: LedgerRecord): Result {
    const callID = this.#callID !== undefined && this.#callID !== "" ? { call_id: this.#callID } : {};
    if (rec.fingerprint !== this.fingerprint) {
      return {
        key: this.key,
        tool: this.#tool,
        status: "conflict",
        replayed: false,
        fingerprint: this.fingerprint,
        record_fingerprint: rec.fingerprint,
        attempts: 0,
        error: {
          code: "conflict",
          message: `key ${this.key} was first used with other arguments (fingerprint ${rec.fingerprint}, this intent's ${this.fingerprint})`,
        },
        ...callID,
        completed_at: new Date().toISOString(),
      };
    }
    const final = isFinal(rec.status);
    const at = rec.completed_at ?? rec.updated_at;
    const receipt = final ? recordReceipt(rec) : undefined;
    // A final answer names its run, which its receipt binds.
    const run = final
      ? { ...(rec.intent_seq ? { intent_seq: rec.intent_seq } : {}), ...(rec.attempt ? { attempt: rec.attempt } : {}) }
      : {};
    const replayed = rec.intent_seq === undefined || !this.#own.has(rec.intent_seq);
    if (this.#opts.rejectRepeat && replayed && rec.status === "completed") {
      return {
        key: this.key,
        tool: this.#tool,
        status: "already_done",
        replayed: true,
        fingerprint: rec.fingerprint,
        attempts: rec.attempts ?? 0,
        ...run,
        ...(rec.result !== undefined ? { result: rec.result } : {}),
        error: {
          code: "already_done",
          message: `the operation already ran: completed at ${at ?? "an earlier time"}; this tool refuses to run it again`,
        },
        ...callID,
        ...(at !== undefined ? { completed_at: at } : {}),
        ...(receipt !== undefined ? { receipt } : {}),
      };
    }
    return {
      key: this.key,
      tool: this.#tool,
      status: rec.status,
      replayed: rec.intent_seq === undefined || !this.#own.has(rec.intent_seq),
      fingerprint: rec.fingerprint,
      attempts: rec.attempts ?? 0,
      ...run,
      ...(rec.result !== undefined ? { result: rec.result } : {}),
      ...(rec.error !== undefined ? { error: rec.error } : {}),
      ...callID,
      ...(final && at !== undefined ? { completed_at: at } : {}),
      ...(receipt !== undefined ? { receipt } : {}),
    };
  }
}
