// Package client publishes tool intents to idemgate and waits for their
// answers. Go agents and cmd/submit use it; agents in other languages follow
// the same protocol (docs/protocol.md).
//
// Publish derives the intent's key (asking the workers' tool catalogue how the
// tool derives keys, unless told with WithKeySpec), publishes the envelope on
// idem.intents.<tool> with Nats-Msg-Id set to the key and a private reply
// subject in the Idem-Reply-To header. Submission.Wait then returns:
//
//   - the answer the worker pushed to the reply subject, bound to one of the
//     submission's own stored publishes by its Idem-Intent-Seq header (any
//     other message on the inbox is dropped: anyone who learns the inbox can
//     name it as the reply subject of an intent of their own); or
//   - when the publish was a JetStream duplicate (the stream's duplicate window
//     dropped it), the record read by watching the ledger key — compared by
//     fingerprint, so the same key with other arguments is answered as a
//     conflict even though no worker saw the copy; or
//   - when no reply arrived within the grace period (replies are plain NATS
//     messages and at most once: a server restart can drop one), the record
//     watched on the ledger key.
//
// A duplicate whose key shows no record that will answer after the grace
// period is published again under a fresh message id, then after twice the
// grace, four times, and so on, until it is answered (docs/protocol.md 7.2).
//
// A duplicate is an answer (Result.Replayed), never an error; so are conflicts
// and failures. Wait returns ErrNoAnswer only when its context ends first.
package client
