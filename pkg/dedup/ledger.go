package dedup

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemgate/idemgate/pkg/dedup/internal/jsbackend"
	"github.com/idemgate/idemgate/pkg/intent"
)

// Ledger is the record store of operation keys: claim, lease, complete, fail,
// release, wait and read. It is safe for concurrent use. Build it with New or
// Open; one built WithBatching group-commits its writes and should be closed
// with Close when done.
//
// A Ledger keeps its records in its partitions' buckets (package
// jsbackend): it reads a record, asks the state machine (machine.go) what
// the record becomes, and writes that by compare-and-set on the revision it
// read.
type Ledger struct {
	js       jetstream.JetStream
	parts    []*jsbackend.Bucket // partition i's bucket at i
	layout   int                 // the key layout (intent.LedgerKey); set by WithLayout
	policy   policy              // the rules' options: WithConfirmedTakeover, WithRetention
	now      func() time.Time
	receipts ReceiptFunc  // set by WithReceipts
	batchCfg *BatchConfig // set by WithBatching
}

// Option adjusts a Ledger built by New or Open.
type Option func(*Ledger)

// WithClock makes the ledger read the time from now instead of time.Now. The
// clock sets lease deadlines and decides whether a lease has expired.
func WithClock(now func() time.Time) Option {
	return func(l *Ledger) { l.now = now }
}

// WithRetention sets how long a final record (completed, failed, denied) is
// kept: its write carries d as its per-message TTL. Unresolved records never
// expire. Default: the bucket's TTL when the ledger is built by Open, else
// DefaultTTL.
func WithRetention(d time.Duration) Option {
	return func(l *Ledger) { l.policy.retention = d }
}

// WithLayout makes the ledger store keys in the given layout
// (intent.LedgerKey): the one the ledger records, which EnsurePartitions and
// BindPartitions return and Open, Bind and OpenReader pass themselves. A
// ledger opened in another layout than its buckets hold would not find their
// records. Default: intent.LayoutFull, the layout of a bucket that records
// none (EnsureBucket's).
func WithLayout(layout int) Option {
	return func(l *Ledger) { l.layout = layout }
}

// WithConfirmedTakeover makes a claim take over a pending record whose lease
// expired only when its ClaimRequest.Confirmed names that record's revision:
// the claimant saw the revision stay unchanged past its deadline, for a grace
// period, on its own clock. A lease deadline is judged by wall clocks; after
// an outage of the ledger longer than a lease every live lease has expired at
// once, and only a holder that had its chance to extend (and did not) is
// really gone. Without the option an expired lease is taken over at once.
func WithConfirmedTakeover() Option {
	return func(l *Ledger) { l.policy.confirmTakeover = true }
}

// ReceiptFunc returns the receipt of a record about to be written with a
// final outcome (see WithReceipts): a JSON object, stored as it is; rec is
// the record as it will be stored, its CompletedAt the outcome's time; ctx
// is the writing call's. It must be quick, and safe for concurrent use.
type ReceiptFunc func(ctx context.Context, key string, rec Record) json.RawMessage

// WithReceipts makes every write of a final outcome — Lease.Complete,
// Lease.Fail, Deny, Resolve — store receipt's return in the record's
// Receipt, so that every answer from the record carries it. Default: no
// receipts.
func WithReceipts(receipt ReceiptFunc) Option {
	return func(l *Ledger) { l.receipts = receipt }
}

// seal sets r's receipt for a write of r: the ReceiptFunc's when r is
// final, none otherwise.
func (l *Ledger) seal(ctx context.Context, key string, r *Record) {
	r.Receipt = nil
	if l.receipts != nil && r.Status.Final() {
		r.Receipt = l.receipts(ctx, key, *r)
	}
}

// New returns a Ledger over kv, a bucket of js (typically one EnsureBucket
// returned). js provides the connection and API prefix (or domain) for leader
// reads: decisions are never taken on a plain kv.Get, which a follower of a
// replicated bucket may answer without an acknowledged write. Mirrored or
// sourced buckets are not supported.
func New(js jetstream.JetStream, kv jetstream.KeyValue, opts ...Option) (*Ledger, error) {
	if js == nil || kv == nil {
		return nil, fmt.Errorf("%w: new ledger: js and kv must not be nil", ErrInvalid)
	}
	return NewPartitioned(js, []jetstream.KeyValue{kv}, opts...)
}

// newLedger returns a Ledger over kvs, the buckets of a ledger's partitions
// in partition order.
func newLedger(js jetstream.JetStream, kvs []jetstream.KeyValue, opts ...Option) (*Ledger, error) {
	l := &Ledger{js: js, now: time.Now, policy: policy{retention: DefaultTTL}, layout: intent.LayoutFull}
	for _, opt := range opts {
		opt(l)
	}
	if l.policy.retention < time.Second {
		return nil, fmt.Errorf("%w: new ledger: retention %s: use at least 1s", ErrInvalid, l.policy.retention)
	}
	if !intent.ValidLedgerLayout(l.layout) {
		return nil, fmt.Errorf("%w: new ledger: layout %d: use %d or %d, as the ledger records it (RecordedLayout)",
			ErrInvalid, l.layout, intent.LayoutFull, intent.LayoutCompact)
	}
	var batching *jsbackend.Batching
	if l.batchCfg != nil {
		cfg := l.batchCfg.withDefaults()
		if err := cfg.validate(); err != nil {
			return nil, fmt.Errorf("new ledger: %w", err)
		}
		b := jsbackend.Batching(cfg)
		batching = &b
	}
	l.parts = make([]*jsbackend.Bucket, len(kvs))
	for i, kv := range kvs {
		l.parts[i] = jsbackend.New(js, kv, batching)
	}
	return l, nil
}

// Open ensures the buckets of the ledger described by cfg (see
// EnsurePartitions) and returns a Ledger over them, in the ledger's key
// layout. With WithBatching among opts, the bucket is made to allow atomic
// publish (BucketConfig.AtomicPublish).
func Open(ctx context.Context, js jetstream.JetStream, cfg BucketConfig, opts ...Option) (*Ledger, error) {
	var probe Ledger
	for _, opt := range opts {
		opt(&probe)
	}
	if probe.batchCfg != nil {
		cfg.AtomicPublish = true
	}
	kvs, layout, err := EnsurePartitions(ctx, js, cfg)
	if err != nil {
		return nil, err
	}
	return NewPartitioned(js, kvs, append(append([]Option{WithRetention(cfg.withDefaults().TTL)}, opts...), WithLayout(layout))...)
}

// Close stops a batching ledger's group commit (see WithBatching): it sends
// the writes still queued, waits for the batches in flight to be answered,
// and makes later writes go out one by one. The ledger stays usable. Close is
// safe to call more than once, and does nothing for a ledger without
// batching.
func (l *Ledger) Close() {
	for _, p := range l.parts {
		p.Close()
	}
}

// BatchStats reports what the ledger's group commit did since New; all zero
// without batching.
func (l *Ledger) BatchStats() BatchStats {
	var s BatchStats
	for _, p := range l.parts {
		s = s.Add(BatchStats(p.Stats()))
	}
	return s
}

// Bucket returns the name of the ledger's KV bucket: its partition 0's when
// it has several (see Buckets).
func (l *Ledger) Bucket() string { return l.parts[0].Name() }

// Layout returns the ledger's key layout (see WithLayout).
func (l *Ledger) Layout() int { return l.layout }

// slot is where a key's record lives: its partition's bucket, under its KV
// key in the ledger's layout.
type slot struct {
	bucket *jsbackend.Bucket
	key    string // the KV key
}

// slot returns key's slot. A key the layout cannot store gives an error
// matching ErrInvalid.
func (l *Ledger) slot(key string) (slot, error) {
	k, err := intent.LedgerKey(key, l.layout)
	if err != nil {
		return slot{}, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	return slot{bucket: l.parts[intent.Partition(key, len(l.parts))], key: k}, nil
}

// Get reads key's record and revision from the bucket's stream leader, so it
// sees every acknowledged write. It returns an error matching ErrNotFound when
// the key has no record (or only a delete marker).
func (l *Ledger) Get(ctx context.Context, key string) (Record, uint64, error) {
	e, err := l.read(ctx, key)
	if err != nil {
		return Record{}, 0, fmt.Errorf("get %s: %w", key, err)
	}
	if !e.Live() {
		return Record{}, 0, fmt.Errorf("get %s: %w", key, ErrNotFound)
	}
	rec, err := DecodeRecord(e.Data)
	if err != nil {
		return Record{}, 0, fmt.Errorf("get %s: decode record at revision %d: %w", key, e.Rev, err)
	}
	return rec, e.Rev, nil
}

// read returns key's latest message, as the stream leader has it.
func (l *Ledger) read(ctx context.Context, key string) (jsbackend.Entry, error) {
	s, err := l.slot(key)
	if err != nil {
		return jsbackend.Entry{}, err
	}
	return s.bucket.Read(ctx, s.key)
}

// transition replaces key's record with rec if the record's latest revision
// is still rev, and returns the new revision; it sets rec.UpdatedAt. The
// operator decisions (decide.go) move records through it. A stale rev gives
// an error matching ErrRevisionMismatch and writes nothing.
func (l *Ledger) transition(ctx context.Context, key string, rev uint64, rec Record) (uint64, error) {
	rec.UpdatedAt = l.clock()
	s, err := l.slot(key)
	if err == nil {
		rev, err = l.cas(ctx, s, rev, rec, jsbackend.Grouped)
	}
	if err != nil {
		return 0, fmt.Errorf("transition %s to %s: %w", key, rec.Status, err)
	}
	return rev, nil
}

// cas writes rec over revision rev of s, with the TTL of its status. A stale
// revision gives ErrRevisionMismatch. A write whose outcome is unknown (its
// acknowledgement was lost) is settled by a leader read: if the latest value
// is exactly what was written, it succeeded.
func (l *Ledger) cas(ctx context.Context, s slot, rev uint64, rec Record, m jsbackend.Mode) (uint64, error) {
	data, err := rec.marshal()
	if err != nil {
		return 0, err
	}
	newRev, err := s.bucket.Update(ctx, s.key, data, rev, l.policy.ttl(rec.Status), m)
	if errors.Is(err, jsbackend.ErrRevision) {
		return 0, ErrRevisionMismatch
	}
	return newRev, err
}

// clock returns the ledger's current time in UTC, as records store it (and
// without a monotonic reading, so a record compares equal to its decoding).
func (l *Ledger) clock() time.Time { return l.now().UTC() }
