package dedup

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemgate/idemgate/pkg/audit"
	"github.com/idemgate/idemgate/pkg/dedup/internal/jsbackend"
	"github.com/idemgate/idemgate/pkg/intent"
)

// Ledger is the record store of operation keys: claim, lease, complete, fail,
// release, wait and read. It is safe for concurrent use. Open it with Open;
// one opened WithBatching group-commits its writes and should be closed with
// Close when done.
//
// A Ledger keeps its records in its partitions' buckets (package
// jsbackend): it reads a record, asks the state machine (machine.go) what
// the record becomes, and writes that by compare-and-set on the revision it
// read.
type Ledger struct {
	js       jetstream.JetStream
	parts    []*jsbackend.Bucket // partition i's bucket at i
	layout   int                 // the key layout (intent.LedgerKey), as the ledger records it
	policy   policy              // what the rules consult
	now      func() time.Time
	receipts ReceiptFunc // set by WithReceipts
	writer   string      // the holder WithReceipts names as the receipts' writer
}

// ReceiptFunc signs the outcome event of a record about to be written with
// a final outcome (see WithReceipts; Record.OutcomeEvent): it returns the
// signed event, and the signature it added. ctx is the writing call's. It
// must be quick, and safe for concurrent use.
type ReceiptFunc func(ctx context.Context, ev audit.Event) (json.RawMessage, audit.Signature)

// seal sets r's receipt for a write of r under key: the ReceiptFunc's when r
// is final, none otherwise. The record stores it as its Signature, which
// with the record's own members gives the receipt back; whole when they
// cannot (a writer without a name, over a record naming a holder).
func (l *Ledger) seal(ctx context.Context, key string, r *Record) {
	r.Receipt, r.Signature = nil, nil
	if l.receipts == nil || !r.Status.Final() {
		return
	}
	raw, sig := l.receipts(ctx, r.OutcomeEvent(key, l.writer))
	r.Receipt = raw
	if len(raw) == 0 || sig.Sig == "" || (l.writer == "" && r.Holder != "") {
		return
	}
	r.Signature = &Signature{Key: key, Signer: sig.Signer, Sig: sig.Sig, Proof: audit.CompactProof(sig.Proof)}
	if l.writer != r.Holder {
		r.Signature.Holder = l.writer
	}
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

// BatchStats reports what the ledger's group commit did since Open; all
// zero without batching.
func (l *Ledger) BatchStats() BatchStats {
	var s BatchStats
	for _, p := range l.parts {
		s = s.Add(BatchStats(p.Stats()))
	}
	return s
}

// Layout returns the ledger's key layout (intent.LedgerKey), as the ledger
// records it (see BucketConfig.Layout).
func (l *Ledger) Layout() int { return l.layout }

// Partitions returns the ledger's partition count.
func (l *Ledger) Partitions() int { return len(l.parts) }

// Buckets returns the bucket names of the ledger's partitions, in partition
// order.
func (l *Ledger) Buckets() []string {
	names := make([]string, len(l.parts))
	for i, p := range l.parts {
		names[i] = p.Name()
	}
	return names
}

// Current reports whether the ledger still has the shape it was opened in:
// the partition count and key layout its partition 0 records. A migration
// (Migrate) changes them under a running ledger, whose reads then miss and
// whose watches are never answered: open it again when Current reports
// false (also when the ledger is gone). While a migration is marked, it
// returns an error matching ErrMigrating.
func (l *Ledger) Current(ctx context.Context) (bool, error) {
	n, layout, err := recorded(ctx, l.js, l.parts[0].Name())
	if err != nil {
		return false, err
	}
	return n == len(l.parts) && layout == l.layout, nil
}

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
	if isBudgetKey(k) {
		return slot{}, fmt.Errorf("%w: key %q has the shape of a budget's count (%s<tool>.<scope>.<window>), which no operation may use", ErrInvalid, key, budgetPrefix)
	}
	return slot{bucket: l.parts[intent.Partition(key, len(l.parts))], key: k}, nil
}

// Get reads key's record and revision from the bucket's stream leader, so it
// sees every acknowledged write. It returns an error matching ErrNotFound when
// the key has no record (or only a delete marker), ErrInvalid for a key the
// ledger's layout cannot store.
func (l *Ledger) Get(ctx context.Context, key string) (Record, uint64, error) {
	e, err := l.read(ctx, key)
	if err != nil {
		return Record{}, 0, fmt.Errorf("get %s: %w", key, err)
	}
	if !e.Live() {
		return Record{}, 0, fmt.Errorf("get %s: %w", key, ErrNotFound)
	}
	rec, err := decodeRecord(e.Data)
	if err != nil {
		return Record{}, 0, fmt.Errorf("get %s: decode record at revision %d: %w", key, e.Rev, err)
	}
	return rec, e.Rev, nil
}

// Peek reads key's record by a direct get, which any server holding the
// partition's stream answers without the JetStream API's queue: cheaper
// than Get, and possibly older than the latest acknowledged write, as the
// first value of a watch may be. ok is false when it finds no live record
// it can decode, or the stream serves no direct gets, or the read fails: a
// caller waiting for an answer then watches the key.
func (l *Ledger) Peek(ctx context.Context, key string) (rec Record, rev uint64, ok bool) {
	s, err := l.slot(key)
	if err != nil {
		return Record{}, 0, false
	}
	e, ok := s.bucket.Peek(ctx, s.key)
	if !ok || !e.Live() {
		return Record{}, 0, false
	}
	if rec, err = decodeRecord(e.Data); err != nil {
		return Record{}, 0, false
	}
	return rec, e.Rev, true
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
// an error matching errRevisionMismatch and writes nothing.
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
// revision gives errRevisionMismatch. A write whose outcome is unknown (its
// acknowledgement was lost) is settled by a leader read: if the latest value
// is exactly what was written, it succeeded.
func (l *Ledger) cas(ctx context.Context, s slot, rev uint64, rec Record, m jsbackend.Mode) (uint64, error) {
	data, err := rec.marshal()
	if err != nil {
		return 0, err
	}
	newRev, err := s.bucket.Update(ctx, s.key, data, rev, l.policy.ttl(rec), m)
	if errors.Is(err, jsbackend.ErrRevision) {
		return 0, errRevisionMismatch
	}
	return newRev, err
}

// clock returns the ledger's current time in UTC, as records store it (and
// without a monotonic reading, so a record compares equal to its decoding).
func (l *Ledger) clock() time.Time { return l.now().UTC() }
