package dedup

import (
	"context"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// What the package's external tests reach that its users do not.

// WithClock makes the ledger read the time from now instead of time.Now.
func WithClock(now func() time.Time) Option { return withClock(now) }

// EnsureBucket makes one ledger bucket that records no shape: a ledger made
// before partitions and layouts (one partition, layout 1).
func EnsureBucket(ctx context.Context, js jetstream.JetStream, cfg BucketConfig) (jetstream.KeyValue, error) {
	return ensureBucket(ctx, js, cfg, nil)
}

// EnsurePartitions creates or updates the buckets of the ledger cfg
// describes, as Open does, and returns them in partition order with the
// ledger's key layout.
func EnsurePartitions(ctx context.Context, js jetstream.JetStream, cfg BucketConfig) ([]jetstream.KeyValue, int, error) {
	return ensurePartitions(ctx, js, cfg)
}

// BindPartitions returns the buckets of the existing ledger named bucket, in
// partition order, and its key layout.
func BindPartitions(ctx context.Context, js jetstream.JetStream, bucket string) ([]jetstream.KeyValue, int, error) {
	return bindPartitions(ctx, js, bucket)
}

// RecordedLayout returns the key layout recorded on the ledger named bucket
// (0 when it does not exist).
func RecordedLayout(ctx context.Context, js jetstream.JetStream, bucket string) (int, error) {
	_, layout, err := recorded(ctx, js, bucket)
	return layout, err
}

// DecodeRecord decodes a ledger record as stored in the bucket.
func DecodeRecord(data []byte) (Record, error) { return decodeRecord(data) }

// ErrRevisionMismatch is the refusal of a compare-and-set (Transition).
var ErrRevisionMismatch = errRevisionMismatch

// DefaultBatchAckWait is BatchConfig.AckWait's default.
const DefaultBatchAckWait = defaultBatchAckWait

// Revision returns the revision of the lease's latest write.
func (ls *Lease) Revision() uint64 { return ls.revision() }

// Transition exposes the raw compare-and-set of a record.
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

// Backdate moves back by d when t's last Update, and its last whole read,
// began: as if that long had passed since.
func (t *Tracker) Backdate(d time.Duration) {
	t.begun, t.wholeAt = t.begun.Add(-d), t.wholeAt.Add(-d)
}
