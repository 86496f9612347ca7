package dedup

import (
	"context"
	"fmt"
	"sync"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemgate/idemgate/pkg/dedup/internal/jsbackend"
)

// Change is one write to the ledger seen by WatchAll: a record written, or
// deleted (by a forget, or purged).
type Change struct {
	// Key is the record's key as a listing shows it (its KV key: the compact
	// key in layout 2), which every read and decision takes.
	Key string
	// Revision is the write's KV revision (its stream sequence in the key's
	// partition); later writes of a key have higher revisions.
	Revision uint64
	// Partition is the index of the key's partition (0 without partitions).
	Partition int
	// Deleted reports a deletion: Record is then the zero record.
	Deleted bool
	// Record is the record written.
	Record Record
}

// changeBuffer is how many changes WatchAll holds for a slow reader before
// the watch itself waits (the server then holds the rest).
const changeBuffer = 256

// WatchAll watches every key of the ledger, in every partition, and sends
// each write made after the call on the returned channel: a record written
// or deleted, pushed by the server (no polling). Writes of one key arrive in
// order; writes of keys in different partitions may interleave in any order.
// The ledger keeps one message per key, so a write superseded before the
// watch delivered it is skipped: a reader sees every key's latest state, not
// necessarily each state between.
// The channel is closed when ctx ends (or the connection closes); every watch
// is stopped then. A reader that falls behind slows the watch, not the
// ledger: the server keeps the writes until they are read.
func (l *Ledger) WatchAll(ctx context.Context) (<-chan Change, error) {
	watchers := make([]*jsbackend.Watcher, 0, len(l.parts))
	stopAll := func() {
		for _, w := range watchers {
			w.Stop()
		}
	}
	for _, p := range l.parts {
		w, err := p.WatchAll(ctx)
		if err != nil {
			stopAll()
			return nil, fmt.Errorf("watch ledger %s: %w", p.Name(), err)
		}
		watchers = append(watchers, w)
	}
	out := make(chan Change, changeBuffer)
	var wg sync.WaitGroup
	for i, w := range watchers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer w.Stop()
			l.forward(ctx, i, w, out)
		}()
	}
	go func() {
		wg.Wait()
		close(out)
	}()
	return out, nil
}

// forward sends the changes w delivers on out until ctx ends or w closes.
func (l *Ledger) forward(ctx context.Context, partition int, w *jsbackend.Watcher, out chan<- Change) {
	for {
		select {
		case <-ctx.Done():
			return
		case e, ok := <-w.Updates():
			if !ok {
				return
			}
			if e == nil {
				continue
			}
			key, ok := l.keyOf(e.Key())
			if !ok {
				continue // not stored under its key's KV key in this layout
			}
			c := Change{Key: key, Revision: e.Revision(), Partition: partition}
			switch e.Operation() {
			case jetstream.KeyValueDelete, jetstream.KeyValuePurge:
				c.Deleted = true
			default:
				rec, err := decodeRecord(e.Value())
				if err != nil {
					continue // not a record this package wrote
				}
				c.Record = rec
			}
			select {
			case out <- c:
			case <-ctx.Done():
				return
			}
		}
	}
}
