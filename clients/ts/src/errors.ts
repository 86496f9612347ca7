/**
 * Errors thrown by the client. Every one is an {@link IdemError} with a
 * machine-readable `code`, so callers can branch with `instanceof` or on
 * `err.code`.
 *
 * @module
 */

/** The base class of every error this package throws. */
export class IdemError extends Error {
  /** A stable, machine-readable name for the kind of failure. */
  readonly code: string;

  /**
   * @param code - the machine-readable code
   * @param message - a human-readable explanation
   * @param options - the standard `ErrorOptions` (`cause`)
   */
  constructor(code: string, message: string, options?: ErrorOptions) {
    super(message, options);
    this.name = new.target.name;
    this.code = code;
  }
}

/**
 * The intent breaks a rule of the protocol (section 1 of docs/protocol.md): a
 * worker would answer it `rejected` with `invalid_intent`, so the client
 * refuses to publish it. `code` is `"invalid_intent"`.
 */
export class InvalidIntentError extends IdemError {
  /** @param message - what is wrong and how to fix it */
  constructor(message: string) {
    super("invalid_intent", message);
  }
}

/**
 * The envelope is larger than the size limit. `code` is `"too_large"`, the
 * code a worker answers with.
 */
export class TooLargeError extends IdemError {
  /** @param message - the size and the limit */
  constructor(message: string) {
    super("too_large", message);
  }
}

/** A tool's key spec cannot derive keys (a bad window). `code` is `"invalid_spec"`. */
export class InvalidSpecError extends IdemError {
  /** @param message - what is wrong with the spec */
  constructor(message: string) {
    super("invalid_spec", message);
  }
}

/**
 * No answer arrived in time. The operation may still complete: watch its key
 * ({@link IdemClient.watch}) to learn the outcome. `code` is `"no_answer"`.
 */
export class NoAnswerError extends IdemError {
  /** The key that got no answer. */
  readonly key: string;

  /**
   * @param key - the key waited on
   * @param message - why the wait ended
   */
  constructor(key: string, message: string) {
    super("no_answer", message);
    this.key = key;
  }
}

/** The ledger has no record of the key. `code` is `"not_found"`. */
export class NotFoundError extends IdemError {
  /** The key looked up. */
  readonly key: string;

  /** @param key - the key looked up */
  constructor(key: string) {
    super("not_found", `no ledger record for key ${key}`);
    this.key = key;
  }
}
