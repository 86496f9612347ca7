package dedup

import "context"

// Transition exposes the raw compare-and-set of a record to the package's
// external tests.
func (l *Ledger) Transition(ctx context.Context, key string, rev uint64, rec Record) (uint64, error) {
	return l.transition(ctx, key, rev, rec)
}
