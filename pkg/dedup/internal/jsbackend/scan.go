package jsbackend

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/idemgate/idemgate/pkg/retry"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// listFetch is how many messages one pull request of a scan asks for.
const listFetch = 256

// maxScanRetries bounds the retries of a pull that found no consumer to
// answer it.
const maxScanRetries = 8

// scanPauses are the pauses before such a pull is sent again: 1ms, doubling
// (2, 4 ... 128ms), maxScanRetries of them, cut short when ctx is done.
func scanPauses(ctx context.Context) backoff.BackOff {
	return backoff.WithMaxRetries(retry.Doubling(ctx, time.Millisecond, time.Millisecond<<(maxScanRetries-1)), maxScanRetries)
}

// Scan is a range of a bucket's messages to read (see Bucket.Scan).
type Scan struct {
	// After is the stream sequence the scan starts after.
	After uint64
	// Token keeps the keys whose first token is this (the server then
	// delivers only those: subject $KV.<bucket>.<token>.>); "" keeps every
	// key.
	Token string
	// Limit stops the scan once visit kept this many messages; at least 1.
	Limit int
	// MaxScan stops the scan once it read this many messages; 0: no bound.
	MaxScan int
	// Markers passes delete markers to visit too (Msg.Deleted), for a
	// reader that follows what was written since a point; false passes
	// them over.
	Markers bool
}

// Msg is a record's message found by a scan.
type Msg struct {
	// Key is the message's KV key.
	Key string
	// Rev is its stream sequence.
	Rev uint64
	// Data is the record as written.
	Data []byte
	// TTL is its per-message TTL; 0 when it has none.
	TTL time.Duration
	// Deleted reports a delete marker (a deletion, a purge, an expired
	// record's marker): Data is then empty. Only a Scan with Markers set
	// passes them.
	Deleted bool
}

// Scan reads the messages of s in stream order and calls visit with each
// record's (delete markers are passed over unless s.Markers); visit reports whether it kept
// the message. The bucket keeps one message per key (its history is 1), so
// a scan sees exactly the live records its server holds: on a replicated
// bucket that may be a replica not yet holding every acknowledged write. A
// record written again while a caller pages through the bucket moves to the
// end and is seen there again.
// Scan returns the stream sequence of the last message read (s.After when
// none), how many messages it read, and more: it stopped at s.Limit or
// s.MaxScan before the end.
//
// It reads with an ephemeral consumer that starts after s.After and is
// deleted when the scan is done: a scan costs what it reads.
func (b *Bucket) Scan(ctx context.Context, s Scan, visit func(Msg) bool) (next uint64, read int, more bool, err error) {
	filter := b.keyPrefix + ">"
	if s.Token != "" {
		filter = b.keyPrefix + s.Token + ".>"
	}
	stream := streamName(b.Name())
	cons, err := b.js.CreateConsumer(ctx, stream, jetstream.ConsumerConfig{
		Description:       "idemgate ledger listing",
		DeliverPolicy:     jetstream.DeliverByStartSequencePolicy,
		OptStartSeq:       s.After + 1,
		AckPolicy:         jetstream.AckNonePolicy,
		FilterSubject:     filter,
		InactiveThreshold: 30 * time.Second,
		MemoryStorage:     true,
		Replicas:          1,
	})
	if err != nil {
		return 0, 0, false, fmt.Errorf("consumer on %s: %w", stream, err)
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), b.timeout)
		defer cancel()
		_ = b.js.DeleteConsumer(dctx, stream, cons.CachedInfo().Name)
	}()
	sc := &scanner{b: b, cons: cons, visit: visit, markers: s.Markers, next: s.After}
	pending := cons.CachedInfo().NumPending
	for pending > 0 {
		if sc.kept >= s.Limit || (s.MaxScan > 0 && sc.read >= s.MaxScan) {
			return sc.next, sc.read, true, nil
		}
		n := min(listFetch, s.Limit-sc.kept)
		if s.MaxScan > 0 {
			n = min(n, s.MaxScan-sc.read)
		}
		got, last, err := sc.fetch(ctx, n)
		if got == 0 {
			// Records are pending and none came: a consumer of a replicated
			// stream may take a moment to be served after its creation was
			// answered.
			pauses := scanPauses(ctx)
			for got == 0 && retry.Wait(ctx, pauses) {
				got, last, err = sc.fetch(ctx, n)
			}
		}
		switch {
		case err != nil && !errors.Is(err, nats.ErrNoResponders):
			return 0, 0, false, err
		case got == 0:
			// A pull the server drops (a user without permission to publish
			// on $JS.API.CONSUMER.MSG.NEXT) looks like an empty bucket: say so.
			return 0, 0, false, fmt.Errorf("the consumer on %s has records pending (%d) and delivered none: is $JS.API.CONSUMER.MSG.NEXT.%s.* allowed to this user?",
				stream, pending, stream)
		}
		pending = last
	}
	return sc.next, sc.read, false, nil
}

// scanner is one Scan's progress.
type scanner struct {
	b       *Bucket
	cons    jetstream.Consumer
	visit   func(Msg) bool
	markers bool   // visit delete markers too
	next    uint64 // the stream sequence of the last message read
	read    int    // messages read
	kept    int    // messages visit kept
}

// fetch reads up to n messages and visits them. It returns how many it read
// and the pending count after the last one.
func (sc *scanner) fetch(ctx context.Context, n int) (int, uint64, error) {
	batch, err := sc.cons.FetchNoWait(n)
	if err != nil {
		return 0, 0, err
	}
	got, pending := 0, uint64(0)
	for {
		var msg jetstream.Msg
		select {
		case <-ctx.Done():
			return got, pending, ctx.Err()
		case m, ok := <-batch.Messages():
			if !ok {
				if err := batch.Error(); err != nil && !errors.Is(err, jetstream.ErrNoMessages) {
					return got, pending, err
				}
				return got, pending, nil
			}
			msg = m
		}
		meta, err := msg.Metadata()
		if err != nil {
			return got, pending, err
		}
		got++
		sc.read++
		pending = meta.NumPending
		sc.next = meta.Sequence.Stream
		key := strings.TrimPrefix(msg.Subject(), sc.b.keyPrefix)
		if isDeleteMarker(msg.Headers()) {
			if sc.markers && sc.visit(Msg{Key: key, Rev: meta.Sequence.Stream, Deleted: true}) {
				sc.kept++
			}
			continue
		}
		ttl, _ := time.ParseDuration(msg.Headers().Get(jetstream.MsgTTLHeader))
		if sc.visit(Msg{Key: key, Rev: meta.Sequence.Stream, Data: msg.Data(), TTL: ttl}) {
			sc.kept++
		}
	}
}

// Position is where a bucket's stream is (Bucket.Position).
type Position struct {
	// Created is when the stream was created: another time means the
	// stream was made again (deleted, or lost by a server that kept it in
	// memory) and its sequences start over.
	Created time.Time
	// FirstSeq and LastSeq are the stream sequences of its first and last
	// messages.
	FirstSeq, LastSeq uint64
	// MarkerTTL is how long the delete marker an expired record leaves
	// stays; 0 when an expired record leaves none.
	MarkerTTL time.Duration
}

// Position returns the stream's current Position, read from the server.
func (b *Bucket) Position(ctx context.Context) (Position, error) {
	s, err := b.streamOf(ctx)
	if err != nil {
		return Position{}, err
	}
	ctx, cancel := b.withTimeout(ctx)
	defer cancel()
	info, err := s.Info(ctx)
	if err != nil {
		return Position{}, err
	}
	return Position{Created: info.Created, FirstSeq: info.State.FirstSeq, LastSeq: info.State.LastSeq,
		MarkerTTL: info.Config.SubjectDeleteMarkerTTL}, nil
}
