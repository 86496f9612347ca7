// Package dedup is the idempotency ledger: one record per operation key in a
// JetStream KV bucket, through which workers agree on who fires an effect and
// every caller gets the recorded answer.
//
// # Using it
//
// Open opens a ledger: it sets its buckets up, or with Bind opens an
// existing one without changing it (clients, operators). A worker claims the
// key of each intent it handles:
//
//	ledger, err := dedup.Open(ctx, js, dedup.BucketConfig{Bucket: "IDEM_LEDGER"}, dedup.WithBatching(dedup.BatchConfig{}))
//	res, err := ledger.Claim(ctx, dedup.ClaimRequest{Key: id.Key, Fingerprint: id.Fingerprint, Holder: workerID})
//	switch res.Outcome {
//	case dedup.Acquired, dedup.TookOver: // fire the effect, then res.Lease.Complete / Fail / Release
//	case dedup.Done:                     // replay res.Record
//	case dedup.Busy:                     // ledger.Wait(ctx, key), then answer or claim again
//	case dedup.Conflict:                 // answer "conflict"; never fire, never replay
//	}
//
// A duplicate is a result, not an error.
//
// # Guarantees
//
//   - At most one claimant holds a key at a time. Claim is a create-only write
//     (exactly one concurrent creator wins); a takeover of an expired lease is a
//     compare-and-set on the record's revision (exactly one taker wins).
//   - The revision is a fencing token: Extend, Complete, Fail and Release are
//     compare-and-set on the lease's revision, so a holder that lost its lease
//     gets ErrLeaseLost and cannot overwrite the new holder's record.
//   - Decisions are taken on the outcome of the claim's own write, on a watch,
//     or on a read answered by the bucket's stream leader (Ledger.Get) — never
//     on a plain kv.Get, which a follower of a replicated bucket may answer
//     without an acknowledged write.
//   - A key with a different fingerprint is a Conflict: never fired, never
//     replayed.
//
// The effect therefore fires at most once per key, except in one window: a
// holder that fires the effect and then vanishes (crash, partition, a pause
// past its lease) before Complete lets the next claimant take over and fire
// again. That window is closed downstream: every effect forwards the key (an
// Idempotency-Key header, an SMTP Message-ID) so a keyed service absorbs the
// repeat; or, for tools whose policy says so, the claimant that won an
// abandoned record moves it to uncertain (Lease.Hold) instead of firing. Leases
// are judged by the claimant's clock, so clocks should agree to well within a
// lease. Records live for the bucket's TTL after their last write.
//
// # Key layouts
//
// A ledger stores each record under its key's KV key in the ledger's layout
// (intent.LedgerKey): the key itself in layout 1, and in layout 2 — what a
// new ledger gets — a derived key shortened to its tool and 22 base64url
// characters of its digest, which shortens what the server keeps in memory
// per key on every replica.
// The layout is recorded on the buckets when the ledger is created (stream
// metadata idemgate.layout) and read at open, like the partition count
// (idemgate.partitions); every method
// takes operation keys; a compact key is its own stored form, so List
// reports a layout-2 record under its compact key, which every method also
// takes.
//
// # Batching
//
// By default every write goes to the server on its own, and a bucket that
// syncs before acknowledging (the durable setting) syncs once per write,
// which caps a worker at a few thousand writes a second. WithBatching makes
// a Ledger group-commit instead: the writes of all its concurrent callers —
// claims, lease writes, transitions — queue up and go out as JetStream atomic
// batches, each made durable by one sync before its acknowledgement. A batch
// carries what queued while the previous one was in flight (up to
// BatchConfig.Max), so batches grow with the load, and a lightly loaded
// ledger still writes one write at a time.
//
// Batching trades latency for throughput: a write waits for the batch in
// flight and then for its own. It changes no guarantee above. Every write in
// a batch keeps its own condition (create-only, or compare-and-set on its
// revision), checked by the server; a batch holds at most one write per key,
// and a key's writes go out in the order they were made. A batch is written
// whole or not at all, and a write is answered only once its batch is
// acknowledged, so an answered write is as durable as without batching. A
// write refused on its own account gets the answer it would get alone (the
// same Claim outcome, ErrLeaseLost) and the rest of its
// batch is sent again without it; a write whose acknowledgement was lost is
// settled by a leader read, as without batching. The one difference a caller
// can see: a write already sent waits for its batch's acknowledgement
// (bounded by the JetStream API timeout) even when its context is done, so
// that its outcome is known. Close flushes the queue.
//
// # Record states
//
// Every change is a compare-and-set made by one of the methods named on its
// arrow; nothing else moves a record.
//
//	              Claim (create)
//	(no record) ─────────────────▶ pending ─── Lease.Complete ──▶ completed
//	                               │  │  ▲  ╲
//	                               │  │  │   ╲── Lease.Fail ────▶ failed
//	     Lease.Release (transient  │  │  │
//	     failure): no holder,      │  │  └── Claim after lease_until:
//	     lease_until = now,  ◀─────┘  │      TookOver (attempt+1, new holder),
//	     attempts kept; the next      │      or Acquired after a Release
//	     Claim is Acquired            │
//	                                  ├── Lease.Hold (an abandoned lease, by
//	                                  │   the claimant that won it) ──▶ uncertain
//	                                  └── Lease.AwaitApproval ──▶ awaiting_approval
//
//	awaiting_approval ── Ledger.Approve ──▶ approved ── Claim (Acquired) ──▶ pending …
//	      │                                   │
//	      └── Ledger.Deny ──▶ denied ◀── Ledger.Deny
//	uncertain ── Ledger.Resolve ──▶ completed | failed
//
// completed, failed, denied, awaiting_approval and uncertain are answered
// (Claim reports Done, Wait returns them); pending and approved are not
// (Claim reports Busy, Wait keeps watching). After Release the record stays
// pending with no holder and its attempts count, so the next claim is Acquired
// with attempt+1 and the count of invocations survives transient failures.
//
// # Where things are
//
// machine.go is the record's state machine: every rule above as a pure
// function of the record, the request and the time. The Ledger's methods
// read a record, ask those rules, and write the outcome by compare-and-set;
// the JetStream side — conditional writes, leader reads, group commit,
// watches, scans, bucket setup — is package internal/jsbackend.
package dedup
