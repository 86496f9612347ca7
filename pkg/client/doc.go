// Package client publishes tool intents to idemgate and waits for their
// answers. Go agents, cmd/submit and the front doors use it; agents in other languages follow
// the same protocol (docs/protocol.md).
//
// Every submission takes one path. Prepare looks the tool up in the workers'
// tool catalogue, which the client remembers (Catalog, Tool: the one copy
// the HTTP and MCP front doors read too), builds the envelope by the
// protocol's rules with its args parsed once (intent.Build) and derives its
// key from them (unless told the tool's key spec with WithKeySpec);
// PublishPrepared publishes the built envelope on idem.intents.<tool> with
// Nats-Msg-Id set to the key and a private reply subject in the
// Idem-Reply-To header (Publish is both). Submission.Wait then returns:
//
//   - the answer the worker pushed to the reply subject, bound to one of the
//     submission's own stored publishes by its Idem-Intent-Seq header (any
//     other message on the inbox is dropped: anyone who learns the inbox can
//     name it as the reply subject of an intent of their own); or
//   - when the publish was a JetStream duplicate (the stream's duplicate window
//     dropped it), the record read from the ledger key (a direct get, and a
//     watch only while no record answers yet) — compared by
//     fingerprint, so the same key with other arguments is answered as a
//     conflict even though no worker saw the copy; or
//   - when no reply arrived within the grace period (replies are plain NATS
//     messages and at most once: a server restart can drop one), the record
//     read, or watched, likewise.
//
// A duplicate whose key shows no record that will answer after the grace
// period is published again under a fresh message id, then after twice the
// grace, four times, and so on, until it is answered (docs/protocol.md 7.2).
//
// A duplicate is an answer (Result.Replayed), never an error; so are conflicts
// and failures. Wait returns ErrNoAnswer only when its context ends first.
package client
