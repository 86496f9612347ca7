package dedup

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemgate/idemgate/pkg/dedup/internal/jsbackend"
	"github.com/idemgate/idemgate/pkg/intent"
)

// A partitioned ledger is N buckets (N a power of two, fixed when the ledger
// is created): partition 0 is the bucket named by BucketConfig.Bucket, so a
// one-partition ledger is exactly a plain bucket; partition i > 0 is
// PartitionBucket(bucket, i). A key lives in partition
// intent.Partition(key, N), and every operation on it — claim, compare-and-
// set, leader read, wait, batch — goes to that partition's bucket (its slot,
// Ledger.slot), each bucket with its own group commit. N is recorded in the
// stream metadata of partition 0 (idemgate.partitions), where every worker
// and client reads it, next to the ledger's key layout (idemgate.layout,
// intent.LedgerKey): how every partition stores its keys.

// Stream metadata entries of a ledger's buckets.
const (
	// partitionsMetadata records a ledger's partition count on every
	// partition's stream; partition 0's is the one read at open. A bucket
	// without it is a one-partition ledger.
	partitionsMetadata = "idemgate.partitions"
	// partitionMetadata records which partition a bucket is.
	partitionMetadata = "idemgate.partition"
	// layoutMetadata records a ledger's key layout (intent.LedgerKey) on
	// every partition's stream; partition 0's is the one read at open. A
	// bucket without it is of layout intent.LayoutFull.
	layoutMetadata = "idemgate.layout"
)

// ErrPartitions: a ledger was opened with another partition count than the
// one recorded when it was created.
var ErrPartitions = errors.New("dedup: partition count differs from the ledger's")

// ErrLayout: a ledger was opened with another key layout than the one
// recorded when it was created, or records a layout this version does not
// know.
var ErrLayout = errors.New("dedup: key layout differs from the ledger's or is unknown")

// PartitionBucket returns the bucket name of partition i of the ledger
// named bucket: bucket itself for partition 0, bucket + "_P" + i otherwise.
func PartitionBucket(bucket string, i int) string {
	if i == 0 {
		return bucket
	}
	return bucket + "_P" + strconv.Itoa(i)
}

// RecordedPartitions returns the partition count recorded on the ledger
// named bucket: 0 when its partition 0 does not exist, 1 when it exists
// without a record (a ledger made before partitioning, or with one). It
// returns ErrMigrating while a migration is marked, ErrLayout for a layout
// this version does not know, and ErrInvalid for a count it cannot read.
func RecordedPartitions(ctx context.Context, js jetstream.JetStream, bucket string) (int, error) {
	n, _, err := recorded(ctx, js, bucket)
	return n, err
}

// recorded reads the partition count and key layout recorded on partition
// 0's stream of the ledger named bucket; both are 0 when it does not exist.
func recorded(ctx context.Context, js jetstream.JetStream, bucket string) (partitions, layout int, err error) {
	md, exists, err := jsbackend.Metadata(ctx, js, bucket)
	if err != nil || !exists {
		return 0, 0, err
	}
	if m := md[migratingMetadata]; m != "" {
		return 0, 0, fmt.Errorf("%w: ledger %s is being migrated to %s partitions/layout (stream metadata %s): let the migration finish, or run it again to finish an interrupted one (docs/operations.md)",
			ErrMigrating, bucket, m, migratingMetadata)
	}
	s, err := shapeOf(bucket, md)
	return s.partitions, s.layout, err
}

// shape is a ledger's partition count and key layout.
type shape struct{ partitions, layout int }

// shapeOf reads the partition count and key layout partition 0's stream
// metadata md records (1 and intent.LayoutFull where it records none).
func shapeOf(bucket string, md map[string]string) (shape, error) {
	s := shape{partitions: 1, layout: intent.LayoutFull}
	if v, ok := md[partitionsMetadata]; ok {
		n, err := strconv.Atoi(v)
		if err != nil || !intent.ValidPartitions(n) {
			return shape{}, fmt.Errorf("%w: ledger %s: stream metadata %s=%q is not a partition count (a power of two up to %d)",
				ErrInvalid, bucket, partitionsMetadata, v, intent.MaxPartitions)
		}
		s.partitions = n
	}
	if v, ok := md[layoutMetadata]; ok {
		n, err := strconv.Atoi(v)
		if err != nil || !intent.ValidLedgerLayout(n) {
			return shape{}, fmt.Errorf("%w: ledger %s records key layout %q (stream metadata %s), which this version does not know (it knows %d and %d): upgrade it",
				ErrLayout, bucket, v, layoutMetadata, intent.LayoutFull, intent.LayoutCompact)
		}
		s.layout = n
	}
	return s, nil
}

// ensurePartitions creates the buckets of the ledger cfg describes, or
// updates them to match it (atomic publish, once allowed, stays allowed),
// and returns them in partition order with the ledger's key layout: what
// Open does before it opens the ledger. It is safe to call on every start.
//
// With cfg.Partitions 0 it keeps the count recorded on an existing ledger
// (1 for a new one); a count other than the recorded one gives an error
// matching ErrPartitions, which names both: partitions are fixed at
// creation (growing them is a migration, see Migrate). Likewise with
// cfg.Layout 0 it keeps the recorded layout (intent.DefaultLayout for a new
// ledger), and another one gives an error matching ErrLayout. An invalid cfg
// gives ErrInvalid, and a ledger whose migration is not finished
// ErrMigrating.
func ensurePartitions(ctx context.Context, js jetstream.JetStream, cfg BucketConfig) ([]jetstream.KeyValue, int, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, 0, fmt.Errorf("ensure ledger: %w", err)
	}
	// A start first creates partition 0 as a new ledger's, asking nothing
	// before: that succeeds when there is no ledger, or one of exactly
	// that shape and settings, and settles a race of first starts on a
	// cluster (jsbackend.Create says why asking first would not). Only an
	// existing ledger of another shape or settings is read.
	freshParts, _ := agreePartitions(cfg.Bucket, 0, cfg.Partitions)
	freshLayout, _ := agreeLayout(cfg.Bucket, 0, cfg.Layout)
	kv0, err := createBucket(ctx, js, cfg, shapeMetadata(shape{partitions: freshParts, layout: freshLayout}, 0, ""))
	switch {
	case err == nil:
		kvs := make([]jetstream.KeyValue, freshParts)
		kvs[0] = kv0
		for i := 1; i < freshParts; i++ {
			c := cfg
			c.Bucket = PartitionBucket(cfg.Bucket, i)
			if kvs[i], err = ensureBucket(ctx, js, c, shapeMetadata(shape{partitions: freshParts, layout: freshLayout}, i, "")); err != nil {
				return nil, 0, err
			}
		}
		return kvs, freshLayout, nil
	case !errors.Is(err, jetstream.ErrBucketExists):
		return nil, 0, err
	}
	recParts, recLayout, err := recorded(ctx, js, cfg.Bucket)
	if err != nil {
		return nil, 0, err
	}
	n, err := agreePartitions(cfg.Bucket, recParts, cfg.Partitions)
	if err != nil {
		return nil, 0, err
	}
	layout, err := agreeLayout(cfg.Bucket, recLayout, cfg.Layout)
	if err != nil {
		return nil, 0, err
	}
	kvs := make([]jetstream.KeyValue, n)
	for i := range n {
		c := cfg
		c.Bucket = PartitionBucket(cfg.Bucket, i)
		if kvs[i], err = ensureBucket(ctx, js, c, shapeMetadata(shape{partitions: n, layout: layout}, i, "")); err != nil {
			return nil, 0, err
		}
	}
	// Two first starts with different counts (or layouts) race to create
	// partition 0: the loser sees the winner's here.
	if recParts == 0 {
		againParts, againLayout, err := recorded(ctx, js, cfg.Bucket)
		if err != nil {
			return nil, 0, err
		}
		if _, err := agreePartitions(cfg.Bucket, againParts, n); err != nil {
			return nil, 0, err
		}
		if _, err := agreeLayout(cfg.Bucket, againLayout, layout); err != nil {
			return nil, 0, err
		}
	}
	return kvs, layout, nil
}

// shapeMetadata is the stream metadata of partition i of a ledger of shape
// s; a migration to s that is not finished also marks it with mark.
func shapeMetadata(s shape, i int, mark string) map[string]string {
	md := map[string]string{partitionsMetadata: strconv.Itoa(s.partitions), partitionMetadata: strconv.Itoa(i),
		layoutMetadata: strconv.Itoa(s.layout)}
	if mark != "" {
		md[migratingMetadata] = mark
	}
	return md
}

// agreeLayout is the key layout of a ledger with recorded layout (0: no
// ledger yet) opened asking for want (0: whatever is recorded).
func agreeLayout(bucket string, recorded, want int) (int, error) {
	switch {
	case want == 0 && recorded == 0:
		return intent.DefaultLayout, nil
	case want == 0:
		return recorded, nil
	case recorded == 0, recorded == want:
		return want, nil
	}
	return 0, fmt.Errorf("%w: ledger %s has key layout %d (stream metadata %s; none recorded is %d), this one was started with %d: start it with %d (or 0, to use the recorded layout); converting a ledger is a migration (docs/operations.md)",
		ErrLayout, bucket, recorded, layoutMetadata, intent.LayoutFull, want, recorded)
}

// agreePartitions is the partition count of a ledger with recorded
// partitions (0: none yet) opened asking for want (0: whatever is recorded).
func agreePartitions(bucket string, recorded, want int) (int, error) {
	switch {
	case want == 0 && recorded == 0:
		return 1, nil
	case want == 0:
		return recorded, nil
	case recorded == 0, recorded == want:
		return want, nil
	}
	return 0, fmt.Errorf("%w: ledger %s has %d partitions (stream metadata %s), this one was started with %d: start it with %d (or 0, to use the recorded count); growing the partitions is a migration (docs/operations.md)",
		ErrPartitions, bucket, recorded, partitionsMetadata, want, recorded)
}

// bindPartitions returns the buckets of the existing ledger named bucket,
// in partition order, and its key layout, as its partition 0 records them.
// It creates nothing. A missing ledger gives an error matching
// jetstream.ErrBucketNotFound; a layout this version does not know, one
// matching ErrLayout.
func bindPartitions(ctx context.Context, js jetstream.JetStream, bucket string) ([]jetstream.KeyValue, int, error) {
	n, layout, err := recorded(ctx, js, bucket)
	if err != nil {
		return nil, 0, err
	}
	if n == 0 {
		return nil, 0, fmt.Errorf("ledger %s: %w", bucket, jetstream.ErrBucketNotFound)
	}
	kvs := make([]jetstream.KeyValue, n)
	for i := range n {
		name := PartitionBucket(bucket, i)
		if kvs[i], err = jsbackend.Open(ctx, js, name); err != nil {
			return nil, 0, fmt.Errorf("ledger %s: partition %d of %d (%s): %w", bucket, i, n, name, err)
		}
	}
	return kvs, layout, nil
}

// Leaders returns the server name leading each partition's stream, in
// partition order ("" for a partition whose leader is not known, e.g. on a
// server without clustering).
func (l *Ledger) Leaders(ctx context.Context) ([]string, error) {
	return jsbackend.Leaders(ctx, l.parts)
}

// SpreadLeaders asks the cluster to move partition leaders off the servers
// leading more than their share (N partitions over S servers: at most
// ceil(N/S) each), each to the least-loaded current replica of its
// partition, with a leader step-down naming that server as preferred. It
// returns how many step-downs it asked for; the elections finish after it
// returns (see Leaders). On a single server, or with one partition, it does
// nothing. Running it again (after a node came back and leaders gathered
// on the others) is harmless: the worker calls it at start and on every
// ledger scan.
func (l *Ledger) SpreadLeaders(ctx context.Context) (int, error) {
	if len(l.parts) < 2 {
		return 0, nil
	}
	moved, err := jsbackend.SpreadLeaders(ctx, l.parts)
	if err != nil {
		return moved, fmt.Errorf("spread leaders: %w", err)
	}
	return moved, nil
}

// validPartitionsConfig checks BucketConfig.Partitions.
func validPartitionsConfig(n int) error {
	if n != 0 && !intent.ValidPartitions(n) {
		return fmt.Errorf("%w: partitions %d: use a power of two from 1 to %d, or 0 for the count recorded on the ledger (1 for a new one)",
			ErrInvalid, n, intent.MaxPartitions)
	}
	return nil
}
