package jsbackend

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"

	"github.com/idemgate/idemgate/pkg/retry"
)

// Atomic batch publish headers (JetStream 2.12 and later).
const (
	batchIDHeader     = "Nats-Batch-Id"
	batchSeqHeader    = "Nats-Batch-Sequence"
	batchCommitHeader = "Nats-Batch-Commit"
)

// JetStream error codes of an atomic batch that was refused as a whole and
// may be sent again.
const (
	errCodeBatchIncomplete  jetstream.ErrorCode = 10176
	errCodeBatchTooInflight jetstream.ErrorCode = 10210
)

// maxBatchPauses bounds how often a batch is sent again after a refusal that
// names no write (a key still being written, too many batches in flight)
// before its writes are sent one by one.
const maxBatchPauses = 4

// batchPauses are the pauses before a batch is sent again: 1ms, doubling
// (2, 4, 8ms), maxBatchPauses of them.
func batchPauses() backoff.BackOff {
	return backoff.WithMaxRetries(retry.Doubling(context.Background(), time.Millisecond, time.Millisecond<<(maxBatchPauses-1)), maxBatchPauses)
}

// Batching is how a Bucket group-commits its writes (dedup.BatchConfig
// says what each field means); every field is set and valid.
type Batching struct {
	Max      int
	Min      int
	InFlight int
	AckWait  time.Duration
}

// Stats counts what a bucket's group commit did (dedup.BatchStats says what
// each field counts).
type Stats struct {
	Batches       uint64
	BatchedWrites uint64
	SingleWrites  uint64
	Resent        uint64
	Fallbacks     uint64
}

// writeState is where a queued write is.
type writeState int

const (
	writeQueued writeState = iota
	writeSent
	writeCancelled
)

// write is one create-only or compare-and-set write of a key.
type write struct {
	ctx    context.Context // the caller's; used when the write goes out alone
	key    string
	data   []byte
	rev    uint64        // expected latest revision of key; 0: no record
	create bool          // a claim: a refusal means the key exists
	ttl    time.Duration // per-message TTL (a final record); 0: none
	// overMarker: a create retried over a delete marker (rev is the
	// marker's), as kv.Create does.
	overMarker bool
	state      writeState // guarded by batcher.mu
	done       chan writeResult
}

type writeResult struct {
	rev uint64
	err error
}

// batcher group-commits a ledger's writes. It runs no goroutine of its own
// while idle: a goroutine per batch in flight, ending with the batch.
type batcher struct {
	b        *Bucket
	cfg      Batching
	idPrefix string

	mu       sync.Mutex
	idle     *sync.Cond // broadcast when nothing is queued or in flight
	queue    []*write
	busy     map[string]struct{} // keys with a write in a batch in flight
	inflight int
	closed   bool
	nextID   uint64
	stats    Stats
}

func newBatcher(bk *Bucket, cfg Batching) *batcher {
	b := &batcher{b: bk, cfg: cfg, idPrefix: nuid.Next(), busy: map[string]struct{}{}}
	b.idle = sync.NewCond(&b.mu)
	return b
}

// do queues w and returns its result. When ctx ends first, the write gives
// ctx's error: dropped if it was still queued (it was not sent), of unknown
// outcome if its batch is in flight — as a single write whose context ends in
// flight, which the caller settles by a leader read. (Waiting for the batch
// would hold the caller past its own deadline: a lease holder recording its
// outcome through an outage must get its turn back to retry, and its heartbeat
// its turn to extend.)
func (b *batcher) do(ctx context.Context, w *write) (uint64, error) {
	if !validKey(w.key) {
		return 0, jetstream.ErrInvalidKey // as the jetstream KV API refuses it
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	w.ctx = ctx
	w.done = make(chan writeResult, 1)
	b.mu.Lock()
	if b.closed {
		b.stats.SingleWrites++
		b.mu.Unlock()
		return b.b.single(w)
	}
	b.queue = append(b.queue, w)
	b.dispatchLocked()
	b.mu.Unlock()

	select {
	case r := <-w.done:
		return r.rev, r.err
	case <-ctx.Done():
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if w.state == writeQueued {
		w.state = writeCancelled
		for i, q := range b.queue {
			if q == w {
				b.queue = append(b.queue[:i], b.queue[i+1:]...)
				break
			}
		}
		b.signalIdleLocked()
	}
	return 0, ctx.Err()
}

// dispatchLocked starts batches while there is room in flight: each takes the
// queued writes in order, at most one per key and none for a key already in
// flight (those wait, in order, for a later batch), up to Max.
func (b *batcher) dispatchLocked() {
	for b.inflight < b.cfg.InFlight && len(b.queue) > 0 {
		var batch, rest []*write
		for _, w := range b.queue {
			if _, busy := b.busy[w.key]; busy || len(batch) == b.cfg.Max {
				rest = append(rest, w)
				continue
			}
			b.busy[w.key] = struct{}{}
			w.state = writeSent
			batch = append(batch, w)
		}
		if len(batch) == 0 {
			return // every queued key is in flight
		}
		b.queue = rest
		b.inflight++
		go b.flush(batch)
	}
}

func (b *batcher) signalIdleLocked() {
	if b.inflight == 0 && len(b.queue) == 0 {
		b.idle.Broadcast()
	}
}

// close stops batching: the queue is flushed, batches in flight finish, and
// later writes go out one by one.
func (b *batcher) close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.closed = true
	for b.inflight > 0 || len(b.queue) > 0 {
		b.idle.Wait()
	}
}

func (b *batcher) statsNow() Stats {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.stats
}

// flush sends ws and answers each of its writes, then frees their keys and
// starts the next batch.
func (b *batcher) flush(ws []*write) {
	defer func() {
		b.mu.Lock()
		for _, w := range ws {
			delete(b.busy, w.key)
		}
		b.inflight--
		b.dispatchLocked()
		b.signalIdleLocked()
		b.mu.Unlock()
	}()
	if len(ws) < b.cfg.Min {
		b.singles(ws)
		return
	}
	b.atomic(ws)
}

// singles sends each of ws on its own, concurrently, exactly as a ledger
// without batching would.
func (b *batcher) singles(ws []*write) {
	b.mu.Lock()
	b.stats.SingleWrites += uint64(len(ws))
	b.mu.Unlock()
	if len(ws) == 1 {
		rev, err := b.b.single(ws[0])
		answer(ws[0], rev, err)
		return
	}
	var wg sync.WaitGroup
	for _, w := range ws {
		wg.Go(func() {
			rev, err := b.b.single(w)
			answer(w, rev, err)
		})
	}
	wg.Wait()
}

func answer(w *write, rev uint64, err error) {
	w.done <- writeResult{rev: rev, err: err}
}

// atomic sends ws as one atomic batch and answers every write. A refusal
// that names the key whose expectation failed answers that write on its own
// (as the server would have answered it alone) and sends the rest again; a
// create refused by a delete marker is sent again over the marker. A refusal
// that names no write is retried after a pause, then the writes go out one
// by one. A lost acknowledgement is answered with the error to every write:
// each caller settles its own write by a leader read, as without batching.
func (b *batcher) atomic(ws []*write) {
	var pauses backoff.BackOff // made at the first pause: most batches need none
	refusals := 0
	for {
		ws = b.live(ws)
		if len(ws) == 0 {
			return
		}
		if len(ws) < b.cfg.Min {
			b.singles(ws)
			return
		}
		ack, sent, err := b.publish(ws)
		if err == nil {
			first := ack.Sequence - uint64(len(ws))
			for i, w := range ws {
				answer(w, first+uint64(i)+1, nil)
			}
			b.mu.Lock()
			b.stats.Batches++
			b.stats.BatchedWrites += uint64(len(ws))
			b.mu.Unlock()
			return
		}
		var apiErr *jetstream.APIError
		switch {
		case !sent, errors.Is(err, nats.ErrNoResponders):
			// Not committed: the batch never reached the stream whole.
			b.fallback(ws)
			return
		case !errors.As(err, &apiErr):
			// The outcome is unknown (the acknowledgement was lost).
			for _, w := range ws {
				answer(w, 0, err)
			}
			return
		}
		switch apiErr.ErrorCode {
		case jetstream.JSErrCodeStreamWrongLastSequence:
			refusals++
			i, marker, ok := b.culprit(ws, apiErr)
			if ok {
				w := ws[i]
				if w.create && marker.Rev != 0 && !w.overMarker {
					// The key's latest entry is a delete marker: create
					// over it.
					w.rev, w.overMarker = marker.Rev, true
				} else {
					answer(w, 0, refused(w, apiErr))
					ws = append(ws[:i:i], ws[i+1:]...)
				}
			}
			if ok && refusals == 1 {
				break // a lone refusal is the usual case: send the rest again
			}
			// Several refusals (a burst of duplicates, say) would cost a
			// round trip each: find them all by reading the keys instead.
			n := len(ws)
			ws = b.screen(ws)
			if !ok && len(ws) == n {
				b.fallback(ws)
				return
			}
		case jetstream.JSErrCodeStreamWrongLastSequenceConstant, errCodeBatchIncomplete, errCodeBatchTooInflight:
			// A key of the batch is still being written (by another writer,
			// or just acknowledged), or the batch was cut: nothing was
			// written; send it again shortly.
			if pauses == nil {
				pauses = batchPauses()
			}
			if !retry.Wait(context.Background(), pauses) {
				b.fallback(ws)
				return
			}
		default:
			// Refused as a whole (atomic publish disabled, limits, ...):
			// nothing was written; each write gets its own answer.
			b.fallback(ws)
			return
		}
		b.mu.Lock()
		b.stats.Resent++
		b.mu.Unlock()
	}
}

// live answers the writes of ws whose callers stopped waiting before the
// batch went out — nothing of them was sent, so they are dropped — and
// returns the others, in order.
func (b *batcher) live(ws []*write) []*write {
	keep := ws[:0:0]
	for _, w := range ws {
		if err := w.ctx.Err(); err != nil {
			answer(w, 0, err)
			continue
		}
		keep = append(keep, w)
	}
	return keep
}

// screenWorkers bounds the concurrent leader reads of a screen.
const screenWorkers = 32

// screen reads the latest revision of every key of ws from the stream leader
// and answers each write the batch would refuse on that account, as the
// server would have answered it alone; it returns the other writes, in
// order. A create whose key's latest entry is a delete marker is kept, as a
// create over the marker. Revisions only grow, so a write refused by the read
// would be refused by the stream too; a write whose read fails is kept.
func (b *batcher) screen(ws []*write) []*write {
	ctx, cancel := context.WithTimeout(context.Background(), b.b.timeout)
	defer cancel()
	latest := make([]Entry, len(ws))
	failed := make([]bool, len(ws))
	next := make(chan int)
	var wg sync.WaitGroup
	for range min(screenWorkers, len(ws)) {
		wg.Go(func() {
			for i := range next {
				e, err := b.b.Read(ctx, ws[i].key)
				latest[i], failed[i] = e, err != nil
			}
		})
	}
	for i := range ws {
		next <- i
	}
	close(next)
	wg.Wait()

	keep := ws[:0:0]
	for i, w := range ws {
		e := latest[i]
		switch {
		case failed[i] || e.Rev == w.rev:
		case w.create && !w.overMarker && e.Deleted:
			w.rev, w.overMarker = e.Rev, true
		default:
			answer(w, 0, refused(w, &jetstream.APIError{
				Code:        400,
				ErrorCode:   jetstream.JSErrCodeStreamWrongLastSequence,
				Description: "wrong last sequence: " + strconv.FormatUint(e.Rev, 10),
			}))
			continue
		}
		keep = append(keep, w)
	}
	return keep
}

func (b *batcher) fallback(ws []*write) {
	b.mu.Lock()
	b.stats.Fallbacks++
	b.mu.Unlock()
	b.singles(ws)
}

// refused is the error a write gets when its own expectation failed, as the
// jetstream KV API reports it: ErrKeyExists for a create, else
// ErrKeyRevisionMismatch.
func refused(w *write, apiErr *jetstream.APIError) error {
	if w.create {
		return fmt.Errorf("%w: %w", apiErr, jetstream.ErrKeyExists)
	}
	return fmt.Errorf("%w: %w", apiErr, jetstream.ErrKeyRevisionMismatch)
}

// batchAck is the acknowledgement of an atomic batch, or its refusal.
type batchAck struct {
	Error    *jetstream.APIError `json:"error,omitempty"`
	Stream   string              `json:"stream"`
	Sequence uint64              `json:"seq"`
	Batch    string              `json:"batch"`
	Count    int                 `json:"count"`
}

// errBadBatchAck: the acknowledgement of a batch does not match it; its
// outcome is unknown.
var errBadBatchAck = errors.New("unexpected acknowledgement of an atomic batch")

// publish sends ws as one atomic batch: every write but the last as a plain
// publish, the last (with the commit header) as a request answered with the
// batch's acknowledgement. sent is false when the commit did not go out, so
// nothing was written.
func (b *batcher) publish(ws []*write) (batchAck, bool, error) {
	b.mu.Lock()
	b.nextID++
	id := b.idPrefix + strconv.FormatUint(b.nextID, 36)
	b.mu.Unlock()
	nc := b.b.nc
	for i, w := range ws {
		m := &nats.Msg{Subject: b.b.putPrefix + w.key, Data: w.data, Header: nats.Header{}}
		m.Header.Set(batchIDHeader, id)
		m.Header.Set(batchSeqHeader, strconv.Itoa(i+1))
		m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(w.rev, 10))
		if w.ttl > 0 {
			m.Header.Set(jetstream.MsgTTLHeader, w.ttl.String())
		}
		if i < len(ws)-1 {
			if err := nc.PublishMsg(m); err != nil {
				return batchAck{}, false, err
			}
			continue
		}
		m.Header.Set(batchCommitHeader, "1")
		ctx, cancel := b.awaited(ws)
		defer cancel()
		resp, err := nc.RequestMsgWithContext(ctx, m)
		if err != nil {
			return batchAck{}, !errors.Is(err, nats.ErrConnectionClosed), err
		}
		var ack batchAck
		if err := json.Unmarshal(resp.Data, &ack); err != nil {
			return batchAck{}, true, fmt.Errorf("%w: %w", errBadBatchAck, err)
		}
		if ack.Error != nil {
			return batchAck{}, true, ack.Error
		}
		if ack.Batch != id || ack.Count != len(ws) || ack.Sequence < uint64(len(ws)) {
			return batchAck{}, true, fmt.Errorf("%w: batch %q of %d at %d", errBadBatchAck, ack.Batch, ack.Count, ack.Sequence)
		}
		return ack, true, nil
	}
	return batchAck{}, false, errors.New("empty batch")
}

// awaited is how long a batch of ws waits for its acknowledgement: until
// every writer of ws has stopped waiting, and at most Batching.AckWait. An
// acknowledgement nobody awaits any more would only hold the queue: after a
// lost one (a connection dropped after the commit went out), every later
// write would wait out the request timeout behind it.
func (b *batcher) awaited(ws []*write) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(context.Background(), min(b.cfg.AckWait, b.b.timeout))
	var waiting atomic.Int64
	waiting.Store(int64(len(ws)))
	stops := make([]func() bool, len(ws))
	for i, w := range ws {
		stops[i] = context.AfterFunc(w.ctx, func() {
			if waiting.Add(-1) == 0 {
				cancel()
			}
		})
	}
	return ctx, func() {
		for _, stop := range stops {
			stop()
		}
		cancel()
	}
}

// culprit finds the write of ws whose expectation failed, from the "wrong
// last sequence: N" refusal: N is that key's latest revision, and the
// leader's message N names the key. marker is that message when it is a
// delete marker. ok is false when no write can be named.
func (b *batcher) culprit(ws []*write, apiErr *jetstream.APIError) (i int, marker Entry, ok bool) {
	n := refusedSeq(apiErr)
	if n == 0 {
		return 0, Entry{}, false
	}
	ctx, cancel := context.WithTimeout(context.Background(), b.b.timeout)
	defer cancel()
	key, e, err := b.b.readSeq(ctx, n)
	if err != nil {
		return 0, Entry{}, false
	}
	for i, w := range ws {
		if w.key == key {
			if w.rev == n {
				return 0, Entry{}, false // not this write's refusal
			}
			if e.Deleted {
				marker = e
			}
			return i, marker, true
		}
	}
	return 0, Entry{}, false
}

// single sends w on its own, exactly as a bucket without batching writes.
func (b *Bucket) single(w *write) (uint64, error) {
	if w.create && !w.overMarker {
		return b.putNew(w.ctx, w.key, w.data)
	}
	rev, err := b.put(w.ctx, w.key, w.data, w.rev, w.ttl)
	if err != nil && w.create && errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		err = fmt.Errorf("%w: %w", err, jetstream.ErrKeyExists)
	}
	return rev, err
}
