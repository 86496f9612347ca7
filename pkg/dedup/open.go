package dedup

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemgate/idemgate/pkg/dedup/internal/jsbackend"
)

// Open returns a Ledger over the ledger cfg describes, named cfg.Bucket
// (its partition 0's bucket).
//
// By default Open creates the ledger's buckets, or updates them to cfg
// (atomic publish, once allowed, stays allowed); it is safe to call on every
// start. With Bind it
// creates and changes nothing, for clients and operators that must not: the
// ledger must exist (an error matching jetstream.ErrBucketNotFound), and of
// cfg only Bucket, TTL, Partitions and Layout count.
//
// Either way the ledger opens in the partition count and key layout it
// records. A cfg.Partitions or cfg.Layout that is not 0 must be those, or
// Open returns an error matching ErrPartitions or ErrLayout, which names
// both; a ledger whose migration is not finished gives ErrMigrating. Final
// records are kept for cfg.TTL after their last write.
//
// An invalid cfg or option makes Open fail at once, before it sends
// anything, with an error matching ErrInvalid that says how to fix it. js
// provides the connection and API prefix (or domain) for leader reads:
// decisions are never taken on a plain kv.Get, which a follower of a
// replicated bucket may answer without an acknowledged write. Mirrored or
// sourced buckets are not supported. A ledger opened WithBatching should be
// closed with Close when done.
func Open(ctx context.Context, js jetstream.JetStream, cfg BucketConfig, opts ...Option) (*Ledger, error) {
	var o options
	for _, opt := range opts {
		if err := opt(&o); err != nil {
			return nil, fmt.Errorf("open ledger: %w", err)
		}
	}
	if js == nil {
		return nil, fmt.Errorf("%w: open ledger: js is nil: pass a jetstream.JetStream", ErrInvalid)
	}
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("open ledger: %w", err)
	}
	if cfg.TTL < time.Second {
		return nil, fmt.Errorf("%w: open ledger: ttl %s: use at least 1s", ErrInvalid, cfg.TTL)
	}
	var kvs []jetstream.KeyValue
	var layout int
	var err error
	if o.bind {
		kvs, layout, err = bindPartitions(ctx, js, cfg.Bucket)
		if err == nil {
			_, err = agreePartitions(cfg.Bucket, len(kvs), cfg.Partitions)
		}
		if err == nil {
			_, err = agreeLayout(cfg.Bucket, layout, cfg.Layout)
		}
	} else {
		cfg.AtomicPublish = cfg.AtomicPublish || o.batch != nil
		kvs, layout, err = ensurePartitions(ctx, js, cfg)
	}
	if err != nil {
		return nil, err
	}
	return newLedger(js, kvs, layout, cfg.TTL, o), nil
}

// newLedger returns a Ledger over kvs, the buckets of a ledger's
// partitions in partition order (a power of two of them), in key layout
// layout, writing final records with the given retention.
func newLedger(js jetstream.JetStream, kvs []jetstream.KeyValue, layout int, retention time.Duration, o options) *Ledger {
	forgotten := DefaultForgetRetention
	if o.forgetRetention > 0 {
		forgotten = o.forgetRetention
	}
	l := &Ledger{js: js, layout: layout, policy: policy{confirmTakeover: o.confirmTakeover, retention: retention, forgotten: forgotten},
		now: time.Now, receipts: o.receipts, writer: o.writer}
	if o.now != nil {
		l.now = o.now
	}
	var batching *jsbackend.Batching
	if o.batch != nil {
		b := jsbackend.Batching(*o.batch)
		batching = &b
	}
	l.parts = make([]*jsbackend.Bucket, len(kvs))
	for i, kv := range kvs {
		l.parts[i] = jsbackend.New(js, kv, batching)
	}
	return l
}

// Option changes how Open opens a Ledger. An option given a bad value makes
// Open fail at once with an error matching ErrInvalid.
type Option func(*options) error

// options are what Open's options set.
type options struct {
	bind            bool
	batch           *BatchConfig // with its defaults, valid
	confirmTakeover bool
	receipts        ReceiptFunc
	writer          string
	now             func() time.Time
	forgetRetention time.Duration
}

// Bind makes Open create and change nothing: it opens the existing ledger
// named BucketConfig.Bucket, with all its partitions and its key layout, for
// clients and operators that read and write records (a Forget, a decision)
// but must not set up buckets. Default: Open creates or updates the
// buckets.
func Bind() Option {
	return func(o *options) error {
		o.bind = true
		return nil
	}
}

// WithBatching makes the ledger group-commit its writes: the claims (create
// only) and compare-and-set writes (Extend, Complete, Fail, Release,
// AwaitApproval, Hold, operator decisions) of all concurrent callers are
// queued and sent as JetStream atomic batches, each made durable with one
// sync before its acknowledgement instead of one sync per write. Every call
// still returns what it would without batching — the same outcome, the same
// errors — once its batch is acknowledged; batching trades latency for
// throughput and changes no guarantee.
//
// The buckets' streams must allow atomic publish: Open allows it when it
// sets the buckets up (BucketConfig.AtomicPublish); a ledger opened with
// Bind on buckets that do not writes one write at a time. Call Ledger.Close
// when done to flush the queue. A bad cfg gives an error matching
// ErrInvalid. Default: no batching.
func WithBatching(cfg BatchConfig) Option {
	return func(o *options) error {
		c := cfg.withDefaults() // an option may serve many Opens at once
		if err := c.validate(); err != nil {
			return err
		}
		o.batch = &c
		return nil
	}
}

// WithConfirmedTakeover makes a claim take over a pending record whose lease
// expired only when its ClaimRequest.Confirmed names that record's revision:
// the claimant saw the revision stay unchanged past its deadline, for a grace
// period, on its own clock. A lease deadline is judged by wall clocks; after
// an outage of the ledger longer than a lease every live lease has expired at
// once, and only a holder that had its chance to extend (and did not) is
// really gone. Default: an expired lease is taken over at once.
func WithConfirmedTakeover() Option {
	return func(o *options) error {
		o.confirmTakeover = true
		return nil
	}
}

// WithReceipts makes every write of a final outcome — Lease.Complete,
// Lease.Fail, Deny, Resolve — sign the record's outcome event
// (Record.OutcomeEvent, its holder writer: the writing claimant) with sign
// and keep the signature in the record, so that every answer from the
// record carries the receipt (Record.Receipt). A nil sign gives an error
// matching ErrInvalid. Default: no receipts.
func WithReceipts(writer string, sign ReceiptFunc) Option {
	return func(o *options) error {
		if sign == nil {
			return fmt.Errorf("%w: receipts: the function is nil: pass one, or leave the option out", ErrInvalid)
		}
		o.receipts, o.writer = sign, writer
		return nil
	}
}

// DefaultForgetRetention is how long a forgotten record (the tombstone a
// Forget leaves) is kept when WithForgetRetention does not say.
const DefaultForgetRetention = 10 * time.Minute

// WithForgetRetention sets how long the tombstone a Forget writes in place
// of the record is kept: it shows who forgot the operation, when and why
// (Get, and a waiter watching the key), until the next claim of the key
// writes over it or it expires. It must be at least a second; a bad value
// gives an error matching ErrInvalid. Default: DefaultForgetRetention
// (10 minutes).
func WithForgetRetention(d time.Duration) Option {
	return func(o *options) error {
		if d < time.Second {
			return fmt.Errorf("%w: forget retention %s: use at least 1s, e.g. 10m", ErrInvalid, d)
		}
		o.forgetRetention = d
		return nil
	}
}

// withClock makes the ledger read the time from now instead of time.Now:
// the clock sets lease deadlines and decides whether a lease has expired.
// For tests.
func withClock(now func() time.Time) Option {
	return func(o *options) error {
		if now == nil {
			return fmt.Errorf("%w: clock: the function is nil", ErrInvalid)
		}
		o.now = now
		return nil
	}
}
