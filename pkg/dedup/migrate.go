package dedup

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemgate/idemgate/pkg/dedup/internal/jsbackend"
	"github.com/idemgate/idemgate/pkg/intent"
)

// migratingMetadata marks a ledger whose migration (Migrate) started and has
// not finished, with its target ("<partitions>/<layout>"), on partition 0's
// stream. While it is there, opening the ledger (Open)
// fails with ErrMigrating: a worker started mid-migration would miss the
// records already moved.
const migratingMetadata = "idemgate.migrating"

// ErrMigrating: the ledger is being migrated (or a migration was
// interrupted); finish it with Migrate before opening the ledger.
var ErrMigrating = errors.New("dedup: ledger migration not finished")

// MigrateConfig is what a migration makes of a ledger. The zero value
// changes nothing.
type MigrateConfig struct {
	// Partitions is the new partition count: a power of two, at least the
	// ledger's (partitions only grow). Default: 0, the ledger's.
	Partitions int
	// Layout is the new key layout: the ledger's, or intent.LayoutCompact
	// for a ledger of intent.LayoutFull (layouts only go that way).
	// Default: 0, the ledger's.
	Layout int
}

// MigrateReport is what a migration found and did.
type MigrateReport struct {
	// FromPartitions and FromLayout are the ledger's shape before; ToPartitions
	// and ToLayout after.
	FromPartitions, FromLayout int
	ToPartitions, ToLayout     int
	// Records counts the live records of the ledger afterwards, every one
	// in its place.
	Records int
	// Moved counts the records written to their new bucket or KV key (and
	// removed from the old); Records - Moved stayed where they were.
	Moved int
	// Resumed counts the moves an interrupted run had written already:
	// only their old copies were removed.
	Resumed int
}

// Migrate grows the partitions of the ledger named bucket and/or converts
// its key layout from intent.LayoutFull to intent.LayoutCompact, offline:
// every worker and client of the ledger must be stopped (a caller checks
// the work stream's consumer: Migrate cannot see it). It refuses (with
// ErrInFlight, writing nothing) while any record is pending with a live
// lease or approved — a holder may be firing it — and refuses a key the new
// layout cannot store (ErrInvalid). A record pending past its lease must
// stay unchanged for one more lease first, as for a takeover (a holder that
// is only stalled writes it again when it wakes), so Migrate then waits
// that long before it changes anything.
//
// It marks the ledger (stream metadata idemgate.migrating), so that nothing
// opens it meanwhile; creates the new partitions' buckets with partition 0's
// settings; moves every record whose partition or KV key changes — written
// create-only to its new place with the rest of its TTL, then purged from
// its old one — and at last records the new count and layout on every
// partition, partition 0's last, which lifts the mark. Run again after an
// interruption (with the same target), it finds the records already
// written, removes their old copies and goes on; run again after it
// finished, it does nothing. A record is never absent from both places.
//
// A missing ledger gives an error matching jetstream.ErrBucketNotFound; an
// interrupted migration to another target, ErrMigrating; a target that is
// not a growth of the partitions or a conversion to compact keys,
// ErrInvalid.
func Migrate(ctx context.Context, js jetstream.JetStream, bucket string, cfg MigrateConfig) (MigrateReport, error) {
	md, exists, err := jsbackend.Metadata(ctx, js, bucket)
	if err != nil {
		return MigrateReport{}, err
	}
	if !exists {
		return MigrateReport{}, fmt.Errorf("migrate ledger %s: %w", bucket, jetstream.ErrBucketNotFound)
	}
	from, err := shapeOf(bucket, md)
	if err != nil {
		return MigrateReport{}, err
	}
	to := shape{partitions: orDefault(cfg.Partitions, from.partitions), layout: orDefault(cfg.Layout, from.layout)}
	if err := checkTarget(bucket, from, to); err != nil {
		return MigrateReport{}, err
	}
	rep := MigrateReport{FromPartitions: from.partitions, FromLayout: from.layout, ToPartitions: to.partitions, ToLayout: to.layout}
	mark := strconv.Itoa(to.partitions) + "/" + strconv.Itoa(to.layout)
	if m := md[migratingMetadata]; m != "" && m != mark {
		return rep, fmt.Errorf("%w: ledger %s: a migration to %s partitions/layout was interrupted: run it again with that target", ErrMigrating, bucket, m)
	}

	oldKVs, err := bindShape(ctx, js, bucket, from)
	if err != nil {
		return rep, err
	}
	old := newLedger(js, oldKVs, from.layout, DefaultTTL, options{})
	// Look before touching anything: every record, its new place, and
	// nothing in flight.
	now := time.Now()
	found := 0
	var stale []staleLease
	for p := range old.parts {
		err := old.each(ctx, p, func(r Listed) error {
			found++
			if r.firing(now) {
				return fmt.Errorf("migrate ledger %s: %w: %s is %s (lease until %s): stop the workers and let it settle first",
					bucket, ErrInFlight, r.Key, r.Status, r.LeaseUntil.Format(time.RFC3339))
			}
			if r.abandoned(now) {
				stale = append(stale, staleLease{old, r})
			}
			if _, err := intent.LedgerKey(r.Key, to.layout); err != nil {
				return fmt.Errorf("migrate ledger %s to layout %d: %w", bucket, to.layout, err)
			}
			return nil
		})
		if err != nil {
			return rep, err
		}
	}
	if err := confirmAllGone(ctx, stale); err != nil {
		return rep, fmt.Errorf("migrate ledger %s: %w", bucket, err)
	}
	if from == to && md[migratingMetadata] == "" {
		rep.Records = found
		return rep, nil // nothing to do: a migration that finished, run again
	}

	if err := jsbackend.SetMetadata(ctx, js, bucket, map[string]string{migratingMetadata: mark}, nil); err != nil {
		return rep, fmt.Errorf("migrate ledger %s: mark it: %w", bucket, err)
	}
	base, err := jsbackend.SettingsOf(ctx, js, bucket)
	if err != nil {
		return rep, fmt.Errorf("migrate ledger %s: %w", bucket, err)
	}
	kvs := append(make([]jetstream.KeyValue, 0, to.partitions), oldKVs...)
	for i := from.partitions; i < to.partitions; i++ {
		c := BucketConfig{Bucket: PartitionBucket(bucket, i), Replicas: base.Replicas, Storage: base.Storage,
			AtomicPublish: base.AtomicPublish, MaxConsumers: base.MaxConsumers}
		kv, err := ensureBucket(ctx, js, c, shapeMetadata(to, i, mark))
		if err != nil {
			return rep, fmt.Errorf("migrate ledger %s: new partition %d: %w", bucket, i, err)
		}
		kvs = append(kvs, kv)
	}
	nu := newLedger(js, kvs, to.layout, DefaultTTL, options{})

	for i := range old.parts {
		err = old.each(ctx, i, func(r Listed) error {
			resumed, moved, err := nu.moveIn(ctx, old, i, r)
			if moved {
				rep.Moved++
			}
			if resumed {
				rep.Resumed++
			}
			return err
		})
		if err != nil {
			return rep, fmt.Errorf("migrate ledger %s: partition %d: %w", bucket, i, err)
		}
	}

	for p := range nu.parts {
		if err := nu.each(ctx, p, func(Listed) error { rep.Records++; return nil }); err != nil {
			return rep, fmt.Errorf("migrate ledger %s: count the records: %w", bucket, err)
		}
	}
	for i := to.partitions - 1; i >= 0; i-- {
		if err := jsbackend.SetMetadata(ctx, js, PartitionBucket(bucket, i), shapeMetadata(to, i, ""), []string{migratingMetadata}); err != nil {
			return rep, fmt.Errorf("migrate ledger %s: record the new shape on partition %d: %w", bucket, i, err)
		}
	}
	return rep, nil
}

// moveIn writes r, a record of the old ledger's partition p, to its place
// in l, the new ledger, unless it is there already, and purges it from its
// old place. resumed reports that l had it already (an interrupted run
// wrote it).
func (l *Ledger) moveIn(ctx context.Context, old *Ledger, p int, r Listed) (resumed, moved bool, err error) {
	oldKey, err := intent.LedgerKey(r.Key, old.layout)
	if err != nil {
		return false, false, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	from := slot{bucket: old.parts[p], key: oldKey}
	to, err := l.slot(r.Key)
	if err != nil {
		return false, false, err
	}
	if to.bucket.Name() == from.bucket.Name() && to.key == from.key {
		return false, false, nil // in its place
	}
	rec := r.Record
	data, err := rec.marshal()
	if err != nil {
		return false, false, fmt.Errorf("%s: %w", r.Key, err)
	}
	var ttl time.Duration
	if r.ttl > 0 {
		ttl = r.restOf(r.ttl, time.Now())
	}
	placed, err := to.bucket.Place(ctx, to.key, data, ttl) // with the rest of its TTL
	if err != nil {
		return false, false, fmt.Errorf("%s: %w", r.Key, err)
	}
	if err := from.bucket.Purge(ctx, from.key); err != nil {
		return !placed, true, fmt.Errorf("%s: purge its old copy: %w", r.Key, err)
	}
	return !placed, true, nil
}

// staleLease is a record pending past its lease, in its ledger.
type staleLease struct {
	l *Ledger
	r Listed
}

// confirmAllGone waits until every record of stale has stayed at its
// revision for one more lease (its own) on this process's clock, and returns
// an error matching ErrInFlight when one was written meanwhile: its holder
// is alive. The grace counts only while the ledger answers: it is read at
// eight points of the wait, and a read that fails ends it with that error.
// One wait covers them all, and the revisions are read again at its end.
func confirmAllGone(ctx context.Context, stale []staleLease) error {
	if len(stale) == 0 {
		return nil
	}
	start := time.Now()
	var grace time.Duration
	for _, s := range stale {
		grace = max(grace, s.r.leaseLength())
	}
	probe := max(grace/8, 10*time.Millisecond)
	changed := func(s staleLease) error {
		e, err := s.l.read(ctx, s.r.Key)
		if err != nil {
			return fmt.Errorf("%s: ledger unreadable, grace not counted: %w", s.r.Key, err)
		}
		if e.Rev != s.r.Revision {
			return fmt.Errorf("%w: %s was pending past its lease (until %s) and its holder %s wrote it again within one more lease: "+
				"it is alive; stop it and let the operation settle first", ErrInFlight, s.r.Key, s.r.LeaseUntil.Format(time.RFC3339), s.r.Holder)
		}
		return nil
	}
	for time.Since(start) < grace {
		if err := pause(ctx, min(probe, grace-time.Since(start))); err != nil {
			return fmt.Errorf("records pending past their lease must stay unchanged for one more lease (%s): %w", grace, err)
		}
		if err := changed(stale[0]); err != nil {
			return err
		}
	}
	for _, s := range stale {
		if err := changed(s); err != nil {
			return err
		}
	}
	return nil
}

// each calls f for every live record of l's partition p, in stream order,
// until f returns an error.
func (l *Ledger) each(ctx context.Context, p int, f func(Listed) error) error {
	q := Query{Limit: MaxListLimit}
	for {
		page, _, err := l.listPart(ctx, p, q)
		if err != nil {
			return err
		}
		for _, r := range page.Records {
			if err := f(r); err != nil {
				return err
			}
		}
		if !page.More {
			return nil
		}
		q.After = page.Next
	}
}

func orDefault(v, def int) int {
	if v == 0 {
		return def
	}
	return v
}

// checkTarget refuses a migration from one shape to another that is not one.
func checkTarget(bucket string, from, to shape) error {
	switch {
	case !intent.ValidPartitions(to.partitions):
		return fmt.Errorf("%w: migrate ledger %s: partitions %d: give a power of two up to %d", ErrInvalid, bucket, to.partitions, intent.MaxPartitions)
	case to.partitions < from.partitions:
		return fmt.Errorf("%w: migrate ledger %s: it has %d partitions; a migration grows them (to %d or more)", ErrInvalid, bucket, from.partitions, from.partitions)
	case !intent.ValidLedgerLayout(to.layout):
		return fmt.Errorf("%w: migrate ledger %s: layout %d: give %d or %d", ErrInvalid, bucket, to.layout, intent.LayoutFull, intent.LayoutCompact)
	case to.layout != from.layout && !(from.layout == intent.LayoutFull && to.layout == intent.LayoutCompact):
		return fmt.Errorf("%w: migrate ledger %s: it has layout %d; a migration converts layout %d to %d only", ErrInvalid, bucket, from.layout, intent.LayoutFull, intent.LayoutCompact)
	}
	return nil
}

// bindShape returns the buckets of the existing partitions of the ledger
// named bucket, in shape s, whatever its marks.
func bindShape(ctx context.Context, js jetstream.JetStream, bucket string, s shape) ([]jetstream.KeyValue, error) {
	kvs := make([]jetstream.KeyValue, s.partitions)
	for i := range kvs {
		var err error
		if kvs[i], err = jsbackend.Open(ctx, js, PartitionBucket(bucket, i)); err != nil {
			return nil, fmt.Errorf("ledger %s: partition %d: %w", bucket, i, err)
		}
	}
	return kvs, nil
}
