package dedup

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemgate/idemgate/pkg/dedup/internal/jsbackend"
)

// Reader is the read side of the ledger, for clients and operators that
// must not write: a leader read of a key and a wait for its record. It is
// safe for concurrent use.
type Reader struct {
	l *Ledger
}

// NewReader returns a Reader over kv, a ledger bucket of js (see New for
// why js is needed: reads are answered by the bucket's stream leader).
func NewReader(js jetstream.JetStream, kv jetstream.KeyValue) (*Reader, error) {
	l, err := New(js, kv)
	if err != nil {
		return nil, err
	}
	return &Reader{l: l}, nil
}

// Get reads key's record and revision from the stream leader (see
// Ledger.Get). It returns an error matching ErrNotFound when there is none.
func (r *Reader) Get(ctx context.Context, key string) (Record, uint64, error) {
	return r.l.Get(ctx, key)
}

// Current reports whether the ledger still has the shape r was opened with
// (OpenReader): the partition count and key layout its partition 0 records.
// A migration (Migrate) changes them under a running reader, whose reads
// then miss and whose watches are never answered: open it again when
// Current reports false (also when the ledger is gone). While a migration
// is marked, it returns an error matching ErrMigrating.
func (r *Reader) Current(ctx context.Context) (bool, error) {
	n, layout, err := recorded(ctx, r.l.js, r.l.Bucket())
	if err != nil {
		return false, err
	}
	return n == r.l.Partitions() && layout == r.l.layout, nil
}

// List returns one page of the ledger's records that q selects (see
// Ledger.List).
func (r *Reader) List(ctx context.Context, q Query) (Page, error) {
	return r.l.List(ctx, q)
}

// WaitFor watches key until its record satisfies accept and returns it (see
// Ledger.WaitFor).
func (r *Reader) WaitFor(ctx context.Context, key string, accept func(Record) bool) (Record, uint64, error) {
	return r.l.WaitFor(ctx, key, accept)
}

// WaitFor watches key until its record satisfies accept and returns that
// record and its revision. The watch is pushed by the server (no polling),
// starts with the key's latest record and may start before the key exists;
// a deletion does not end it (the operation may be claimed again). It
// returns ctx.Err() (wrapped) when ctx ends first, and stops the watch on
// every path. Unlike Wait, it never returns a record accept refused: it is
// for callers waiting for an answer, not for claimants.
func (l *Ledger) WaitFor(ctx context.Context, key string, accept func(Record) bool) (Record, uint64, error) {
	w, err := l.watch(ctx, key)
	if err != nil {
		return Record{}, 0, fmt.Errorf("wait for %s: %w", key, err)
	}
	defer w.Stop()
	for {
		select {
		case <-ctx.Done():
			return Record{}, 0, fmt.Errorf("wait for %s: %w", key, ctx.Err())
		case u, ok := <-w.Updates():
			if !ok {
				if ctx.Err() != nil {
					return Record{}, 0, fmt.Errorf("wait for %s: %w", key, ctx.Err())
				}
				return Record{}, 0, fmt.Errorf("wait for %s: %w", key, errWatchClosed)
			}
			e, ok := jsbackend.Observed(u)
			if !ok || e.Deleted {
				continue // the end of the initial values, or a deletion
			}
			rec, err := DecodeRecord(e.Data)
			if err != nil {
				return Record{}, 0, fmt.Errorf("wait for %s: record at revision %d: %w", key, e.Rev, err)
			}
			if accept(rec) {
				return rec, e.Rev, nil
			}
		}
	}
}
