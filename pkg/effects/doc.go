// Package effects runs the side effects behind idemgate's tools: the Effect
// contract, the registry of configured tools and the built-in effects.
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
// Call.Key to the outside world (the webhook's Idempotency-Key header, an
// email's Message-ID) so that a keyed service recognises the repeat and does
// nothing. An effect whose downstream cannot do that should keep its
// timeouts generous; for such tools the ledger can hold an abandoned key as
// uncertain, for a person to decide, rather than fire again. Call.Attempt
// above 1 says an earlier holder claimed the key.
//
// # The registry
//
// A tools file (YAML; the format is in docs/tools.md) names each tool, how
// its keys are derived (intent.KeySpec), its lease, and its effect: a kind
// and that kind's settings. Parse and LoadFile build a Registry from it and
// report every problem at once, each as a *ConfigError with the file, line,
// field and a hint; unknown fields are problems, so a typo never passes
// silently. So is an unsafe tool whose key a model could choose: keyed by
// all its args, with no closed schema to refuse an arg the model invents;
// it needs key_args, a closed schema or key_args: all. Settings that load but likely misbehave — a key arg that looks
// like a timestamp, a webhook to an address it will refuse — are kept as
// warnings (Registry.Warnings), with their lines. An intent for a tool that
// is not configured gets Registry.UnknownTool's error, which names the
// closest configured tool. NewRegistry builds one from tools written in code,
// as they are: the file's rules, this one included, are the loader's.
//
// The built-in kinds are webhook (Webhook), smtp (SMTP), mcp (MCP: a tool
// of another MCP server; a file's mcp_upstreams entries serve an upstream's
// whole tool list, kept current with it) and noop (Noop). The nats kind
// (NATSService) needs the caller's connection and is added with
// WithNATSConn; WithAllowPrivate names the private addresses every
// URL-taking effect may reach. The kinds a tools file may name are fixed: a
// tool written in another language is served as a NATS service (the nats
// effect) or as an MCP server (the mcp effect), which are the extension
// points, so the loader's plug-in seam is internal to this package.
package effects
