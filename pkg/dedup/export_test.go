package dedup

import "context"

// Transition exposes the raw compare-and-set of a record to the package's
// external tests.
func (l *Ledger) Transition(ctx context.Context, key string, rev uint64, rec Record) (uint64, error) {
	return l.at(key).transition(ctx, key, rev, rec)
}

// StepDown asks partition i's stream leader to hand over to server.
func StepDown(ctx context.Context, l *Ledger, i int, server string) error {
	p := l.partitions()[i]
	return p.stepDown(ctx, p.kv.Bucket(), server)
}

// DirectReads is how many reads l took from a direct get.
func DirectReads(l *Ledger) uint64 { return l.directReads.Load() }
