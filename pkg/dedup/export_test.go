package dedup

import "context"

// Transition exposes the raw compare-and-set of a record to the package's
// external tests.
func (l *Ledger) Transition(ctx context.Context, key string, rev uint64, rec Record) (uint64, error) {
	return l.transition(ctx, key, rev, rec)
}

// StepDown asks partition i's stream leader to hand over to server.
func StepDown(ctx context.Context, l *Ledger, i int, server string) error {
	return l.parts[i].StepDown(ctx, server)
}

// DirectReads is how many reads l took from a direct get.
func DirectReads(l *Ledger) uint64 {
	var n uint64
	for _, p := range l.parts {
		n += p.DirectReads()
	}
	return n
}
