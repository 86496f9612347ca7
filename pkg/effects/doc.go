// Package effects is the contract between idemgate's workers and the side
// effects behind its tools: what an effect implements (Effect, EffectFunc),
// what it is given and returns (Call, Outcome), how its errors are read
// (PermanentError, ErrExhausted), how it retries (RetryPolicy, Retry), and
// the tools a worker serves (Tool, Policy, Registry).
//
// # The contract
//
// A worker that has claimed an operation's key in the ledger calls
// Effect.Fire once with a Call: the key, the tool, the session, the model's
// call id, the canonical args and the ledger's claim number. Fire acts on the
// outside world, retrying internally as its policy says, and returns an
// Outcome: the JSON result, and how many calls it made to the outside world
// (Invocations, reported with an error too; they add up to the answer's
// attempts).
//
// What the error means decides what the worker does:
//
//   - nil: the effect happened. The result is recorded and replayed to every
//     caller of the operation; the effect never fires again for the key.
//   - a *PermanentError (built with Permanent or Permanentf, found with
//     IsPermanent or errors.Is(err, ErrPermanent)): retrying cannot help. The
//     failure is recorded with its code (effect_failed by default) and
//     replayed; the effect never fires again for the key.
//   - any other error, context cancellation and exhausted retries
//     (ErrExhausted) included: transient. The worker releases its claim and
//     the operation is tried again later, with the same key.
//
// # The crash window, and why every effect forwards the key
//
// The ledger makes an effect fire at most once per key, with one exception:
// a worker that crashes (or loses its lease) after the effect happened and
// before the result was recorded. Another worker then takes the key over and
// fires again. The same happens inside one Fire when a request times out on
// this side: the downstream may have acted, and the retry is a second firing.
// Nothing on this side can tell those cases from an effect that never
// happened, so the repeat is absorbed downstream: every effect forwards
// Call.Key to the outside world (HeaderIdempotencyKey; an email's
// Message-ID) so that a keyed service recognises the repeat and does
// nothing. An effect whose downstream cannot do that should keep its
// timeouts generous; for such tools the ledger can hold an abandoned key as
// uncertain, for a person to decide, rather than fire again. Call.Attempt
// above 1 says an earlier holder claimed the key.
//
// # Retries
//
// An effect retries within one Fire as its RetryPolicy says; Retry is that
// loop (exponential backoff, RetryAfter for a wait the other side asked
// for, ErrExhausted when the attempts run out), and every built-in kind
// uses it.
//
// # Tools and the registry
//
// A Tool is a configured tool: its name, how its keys are derived
// (intent.KeySpec), its lease, its Policy (class, ledger, approval,
// abandoned leases, in the values intent defines) and its Effect. A
// Registry is the set of them, read-only and safe for concurrent use:
// Lookup finds a tool, and an intent for a tool that is not configured gets
// UnknownTool's error, which names the closest configured tool. NewRegistry
// builds one from tools written in code, as they are; package toolsfile
// builds one from a tools file, with that file's rules and warnings.
//
// # The kinds
//
// Each built-in kind is a package of its own, with a Config and a New that
// reports every invalid setting as a *SettingError: webhook (an HTTP
// request), smtp (an email through a relay), natsservice (a request to a
// NATS service), mcp (a tool of another MCP server) and noop. Package
// netguard holds the destination rules of the kinds that take a URL. A
// tool written in another language is served as a NATS service or as an
// MCP server, which are the extension points; the kinds a tools file may
// name are fixed.
package effects
