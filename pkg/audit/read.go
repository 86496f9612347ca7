package audit

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemgate/idemgate/pkg/intent"
)

// Filter selects the appends of a trail to read.
type Filter struct {
	// Partition is the one partition to read; AllPartitions for all.
	Partition int
	// Since and Until bound the appends' times (the stream's timestamps);
	// zero is open. Whole appends are read, so every partition's last line
	// read carries a seal.
	Since, Until time.Time
}

// AllPartitions is Filter.Partition for every partition.
const AllPartitions = -1

// fetchWait bounds one fetch of a read: messages are known to be pending.
const fetchWait = 5 * time.Second

// Read calls line with every line (an Entry's JSON) of the audit stream's
// appends that f selects, oldest first, as they are stored: the
// partitions' lines interleave, each partition's in its chain's order. It
// reads the appends stored when it starts. It stops at line's first error
// and returns it.
func Read(ctx context.Context, js jetstream.JetStream, names intent.Names, f Filter, line func([]byte) error) error {
	s, err := js.Stream(ctx, names.AuditStream)
	if err != nil {
		return fmt.Errorf("audit stream %s: %w", names.AuditStream, err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		return fmt.Errorf("audit stream %s: %w", names.AuditStream, err)
	}
	last := info.State.LastSeq
	if info.State.Msgs == 0 {
		return nil
	}
	cfg := jetstream.ConsumerConfig{
		Description:       "idemgate audit read",
		AckPolicy:         jetstream.AckNonePolicy,
		FilterSubject:     names.AuditSubjects(),
		InactiveThreshold: time.Minute,
		MemoryStorage:     true,
	}
	if f.Partition != AllPartitions {
		cfg.FilterSubject = names.AuditSubject(f.Partition)
	}
	if !f.Since.IsZero() {
		since := f.Since
		cfg.DeliverPolicy, cfg.OptStartTime = jetstream.DeliverByStartTimePolicy, &since
	}
	c, err := s.CreateConsumer(ctx, cfg)
	if err != nil {
		return fmt.Errorf("read audit stream %s: %w", names.AuditStream, err)
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = s.DeleteConsumer(dctx, c.CachedInfo().Name)
	}()
	if c.CachedInfo().NumPending == 0 {
		return nil
	}
	for {
		fctx, cancel := context.WithTimeout(ctx, fetchWait)
		batch, err := c.Fetch(256, jetstream.FetchContext(fctx))
		if err != nil {
			cancel()
			return fmt.Errorf("read audit stream %s: %w", names.AuditStream, err)
		}
		n, err := readBatch(batch, last, f.Until, line)
		cancel()
		switch {
		case errors.Is(err, errReadDone):
			return nil
		case err != nil:
			return err
		case n == 0 && ctx.Err() != nil:
			return ctx.Err()
		case n == 0:
			return fmt.Errorf("read audit stream %s: no message within %s while some were pending: try again", names.AuditStream, fetchWait)
		}
	}
}

// errReadDone ends a read: the last message was read.
var errReadDone = errors.New("audit: read done")

// readBatch passes the lines of batch's messages to line, up to stream
// sequence last and time until; errReadDone once it got there.
func readBatch(batch jetstream.MessageBatch, last uint64, until time.Time, line func([]byte) error) (int, error) {
	n := 0
	for m := range batch.Messages() {
		n++
		meta, err := m.Metadata()
		if err != nil {
			return n, fmt.Errorf("read audit stream: %w", err)
		}
		if meta.Sequence.Stream > last || (!until.IsZero() && meta.Timestamp.After(until)) {
			return n, errReadDone
		}
		for l := range bytes.SplitSeq(m.Data(), []byte{'\n'}) {
			if len(bytes.TrimSpace(l)) == 0 {
				continue
			}
			if err := line(l); err != nil {
				return n, err
			}
		}
		if meta.NumPending == 0 || meta.Sequence.Stream == last {
			return n, errReadDone
		}
	}
	if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) && !errors.Is(err, context.DeadlineExceeded) {
		return n, fmt.Errorf("read audit stream: %w", err)
	}
	return n, nil
}

// History returns the trail's entries about key (its full key, or its
// compact ledger key: the events naming either) from its partition of a ledger of partitions
// partitions, appended since since (zero: all the trail keeps), oldest
// first, as JSON lines. It reads the whole partition from since: bound it
// with the operation's creation time where known.
func History(ctx context.Context, js jetstream.JetStream, names intent.Names, partitions int, key string, since time.Time) ([][]byte, error) {
	op := newKeyMatcher(key)
	var out [][]byte
	err := Read(ctx, js, names, Filter{Partition: intent.Partition(key, partitions), Since: since}, func(line []byte) error {
		if !op.named(line) {
			return nil
		}
		pe, err := parseEntry(line)
		if err != nil {
			return nil // verify reports it
		}
		ev, err := decodeEvent(pe.Event)
		if err != nil || !op.is(ev.Key) {
			return nil
		}
		out = append(out, bytes.Clone(line))
		return nil
	})
	return out, err
}
