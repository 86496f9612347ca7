package audit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/klauspost/compress/s2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"

	"github.com/idemgate/idemgate/pkg/intent"
	"github.com/idemgate/idemgate/pkg/retry"
)

// Defaults of TrailConfig.
const (
	// DefaultQueue is how many events a trail holds in memory, waiting to
	// be written, before it drops new ones.
	DefaultQueue = 65536
	// DefaultMaxBatch is the most events one append writes.
	DefaultMaxBatch = 512
	// DefaultQueueBytes bounds the bytes of the events a trail holds in
	// memory (events of a tool with audit_args carry its args).
	DefaultQueueBytes = 64 << 20
	// DefaultLinger is how long after an append a partition's next one
	// waits for more events, unless a full batch is queued.
	DefaultLinger = 10 * time.Millisecond
)

// maxBatchBytes bounds the data of one append (under the server's
// max_payload, 1 MiB by default).
const maxBatchBytes = 512 << 10

// publishTimeout bounds one append or head read.
const publishTimeout = 5 * time.Second

// Logger receives a trail's warnings (the trail unreachable, events
// dropped) and notices (reachable again). A *zap.SugaredLogger is one.
type Logger interface {
	Warnw(msg string, keysAndValues ...any)
	Infow(msg string, keysAndValues ...any)
}

// TrailConfig is what a Trail writes and how.
type TrailConfig struct {
	// Names are the installation's (intent.NewNames). Required.
	Names intent.Names
	// Installation is the installation's id: the first entry of every
	// chain the trail starts links to it (GenesisDigest). Default: read
	// (or made) with Installation when the trail first starts a chain.
	Installation string
	// Partitions is the ledger's partition count: each has a chain of its
	// own, on Names.AuditSubject(p). Required.
	Partitions int
	// Signer seals every append. Required.
	Signer *Signer
	// Holder names the writing worker in its gap events. Required.
	Holder string
	// Queue bounds the events held in memory, written or about to be.
	// Default: DefaultQueue.
	Queue int
	// QueueBytes bounds their bytes. Default: DefaultQueueBytes.
	QueueBytes int64
	// MaxBatch bounds the events of one append. Default: DefaultMaxBatch.
	MaxBatch int
	// Linger is how long after an append a partition's next append waits
	// for more events, unless MaxBatch are queued: at low rates each
	// append (and its seal) then carries more than a few events, and
	// events wait that much longer in memory. Under load appends follow
	// each other without waiting. Default: DefaultLinger; negative: none.
	Linger time.Duration
	// Log receives warnings and notices. Default: none.
	Log Logger
}

// TrailStats is what a trail did so far.
type TrailStats struct {
	Appended uint64 // events written
	Appends  uint64 // appends (one message each) written
	Dropped  uint64 // events dropped: the queue was full, or the trail closed before they were written
	Moved    uint64 // appends tried again because another writer appended first
	Queued   int64  // events in memory now
}

// Trail writes audit events to the audit stream, each ledger partition's
// in a hash chain of its own. Appending never blocks and never fails: an
// event is queued in memory and written in the background, in batches, one
// append per batch, sealed (see Entry). While the stream cannot be reached
// events queue up to TrailConfig.Queue (and QueueBytes); beyond it they are
// dropped and counted, and the partition's next append starts with a gap event saying
// how many and from when to when, so that a verifier sees a gap, not
// tampering. Several writers (workers) append to one chain: each append
// expects the chain's last message (JetStream's expected last subject
// sequence) and is built again on the new head when another came first.
//
// Start the trail before appending; Close it to write what is queued.
type Trail struct {
	js    jetstream.JetStream
	cfg   TrailConfig
	parts []*chainWriter
	id    string // prefix of the message ids of this trail's appends

	queued      atomic.Int64
	queuedBytes atomic.Int64
	appended    atomic.Uint64
	appends     atomic.Uint64
	dropped     atomic.Uint64
	moved       atomic.Uint64

	// life ends when Close gives up on what is still queued.
	life    context.Context
	endLife context.CancelFunc
	stop    chan struct{}
	closing atomic.Bool
	wg      sync.WaitGroup

	streamMu sync.Mutex
	stream   jetstream.Stream // bound on first use
}

// NewTrail returns a trail writing through js.
func NewTrail(js jetstream.JetStream, cfg TrailConfig) (*Trail, error) {
	switch {
	case js == nil:
		return nil, fmt.Errorf("%w: trail: no JetStream", ErrInvalid)
	case !intent.ValidPartitions(cfg.Partitions):
		return nil, fmt.Errorf("%w: trail: %d partitions: give the ledger's count", ErrInvalid, cfg.Partitions)
	case cfg.Signer == nil:
		return nil, fmt.Errorf("%w: trail: no signer", ErrInvalid)
	case cfg.Holder == "":
		return nil, fmt.Errorf("%w: trail: no holder", ErrInvalid)
	case cfg.Installation != "" && !installationPat.MatchString(cfg.Installation):
		return nil, fmt.Errorf("%w: trail: installation %q: give the installation's id (Installation)", ErrInvalid, cfg.Installation)
	case cfg.Names.AuditStream == "":
		return nil, fmt.Errorf("%w: trail: no names (intent.NewNames)", ErrInvalid)
	case cfg.Queue < 0 || cfg.MaxBatch < 0 || cfg.QueueBytes < 0:
		return nil, fmt.Errorf("%w: trail: queue %d (%d bytes), batch %d: use positive sizes, or 0 for the defaults", ErrInvalid, cfg.Queue, cfg.QueueBytes, cfg.MaxBatch)
	}
	if cfg.Queue == 0 {
		cfg.Queue = DefaultQueue
	}
	if cfg.QueueBytes == 0 {
		cfg.QueueBytes = DefaultQueueBytes
	}
	if cfg.MaxBatch == 0 {
		cfg.MaxBatch = DefaultMaxBatch
	}
	if cfg.Linger == 0 {
		cfg.Linger = DefaultLinger
	}
	t := &Trail{js: js, cfg: cfg, id: nuid.Next(), stop: make(chan struct{})}
	t.life, t.endLife = context.WithCancel(context.Background())
	for p := range cfg.Partitions {
		t.parts = append(t.parts, &chainWriter{t: t, p: p, subject: cfg.Names.AuditSubject(p), wake: make(chan struct{}, 1)})
	}
	return t, nil
}

// Start starts the trail's writers (one goroutine per partition).
func (t *Trail) Start() {
	for _, w := range t.parts {
		t.wg.Add(1)
		go w.run()
	}
}

// Close stops taking events and writes those queued until ctx ends; what
// is still queued then is dropped (and counted). It returns when every
// writer has stopped.
func (t *Trail) Close(ctx context.Context) {
	if !t.closing.CompareAndSwap(false, true) {
		return
	}
	stopAfter := context.AfterFunc(ctx, t.endLife)
	defer stopAfter()
	close(t.stop)
	t.wg.Wait()
	t.endLife()
}

// Stats returns what the trail did so far.
func (t *Trail) Stats() TrailStats {
	return TrailStats{Appended: t.appended.Load(), Appends: t.appends.Load(), Dropped: t.dropped.Load(),
		Moved: t.moved.Load(), Queued: t.queued.Load()}
}

// Append queues e (unsigned: the append's seal vouches for it) for the
// chain of ledger partition p. It never blocks.
func (t *Trail) Append(p int, e Event) { t.enqueue(p, item{raw: e.Canonical(), at: e.At}) }

// AppendSigned queues a signed event (Signer.Sign's, a receipt) for the
// chain of ledger partition p, as it is. It never blocks.
func (t *Trail) AppendSigned(p int, signed json.RawMessage) {
	if len(signed) > 0 {
		t.enqueue(p, item{raw: signed})
	}
}

// item is one queued event, encoded, and when it happened (zero for a
// signed event: read from it when it is dropped).
type item struct {
	raw []byte
	at  time.Time
}

func (it *item) when() time.Time {
	if it.at.IsZero() {
		var e struct {
			At time.Time `json:"at"`
		}
		_ = json.Unmarshal(it.raw, &e)
		it.at = e.At
	}
	return it.at
}

func (t *Trail) enqueue(p int, it item) {
	if p < 0 || p >= len(t.parts) {
		p = 0
	}
	w := t.parts[p]
	if t.closing.Load() {
		w.drop(1, it.when(), it.when())
		return
	}
	size := int64(len(it.raw))
	if t.queued.Add(1) > int64(t.cfg.Queue) || t.queuedBytes.Add(size) > t.cfg.QueueBytes {
		t.queued.Add(-1)
		t.queuedBytes.Add(-size)
		w.drop(1, it.when(), it.when())
		return
	}
	w.mu.Lock()
	w.queue = append(w.queue, it)
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// chainWriter appends the events of one partition.
type chainWriter struct {
	t       *Trail
	p       int
	subject string
	wake    chan struct{}

	mu    sync.Mutex
	queue []item
	// Events dropped since the last gap event, and when they happened.
	drops              uint64
	dropFrom, dropTo   time.Time
	droppedSinceNotice uint64

	// The writer goroutine's own.
	head    head
	seq     uint64 // stream sequence of the chain's last message; 0: none
	known   bool   // head and seq are read
	batches uint64 // appends built, for message ids
	// unsure is the message id of an append whose outcome is not known
	// (its acknowledgement was lost), and the sequence it expected.
	unsure    string
	unsureSeq uint64
	down      time.Time // since when appends fail; zero while they succeed
}

// appendBuffers are the buffers of an append's lines and their S2
// encoding, reused: a publish is done with them when it returns.
var appendBuffers = sync.Pool{New: func() any { return new([2][]byte) }}

// drop counts n events dropped, which happened from from to to.
func (w *chainWriter) drop(n uint64, from, to time.Time) {
	w.t.dropped.Add(n)
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.drops == 0 || from.Before(w.dropFrom) {
		w.dropFrom = from
	}
	if w.drops == 0 || to.After(w.dropTo) {
		w.dropTo = to
	}
	w.drops += n
	w.droppedSinceNotice += n
}

func (w *chainWriter) run() {
	defer w.t.wg.Done()
	defer w.finish()
	linger := time.NewTimer(time.Hour)
	linger.Stop()
	var last time.Time // when the last flush ended
	for {
		select {
		case <-w.wake:
		case <-w.t.stop:
			return
		}
		if wait := w.t.cfg.Linger - time.Since(last); wait > 0 {
			linger.Reset(wait)
			for lingering := true; lingering && !w.full(); {
				select {
				case <-linger.C:
					lingering = false
				case <-w.wake:
				case <-w.t.stop:
					linger.Stop()
					return
				}
			}
			linger.Stop()
		}
		w.flush()
		last = time.Now()
	}
}

// full reports whether a whole batch is queued.
func (w *chainWriter) full() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.queue) >= w.t.cfg.MaxBatch
}

// finish writes what is queued as the trail closes, and counts what it
// could not write as dropped.
func (w *chainWriter) finish() {
	w.flush()
	w.mu.Lock()
	lost := w.queue
	w.queue = nil
	w.mu.Unlock()
	if len(lost) > 0 {
		w.t.release(lost)
		w.t.dropped.Add(uint64(len(lost)))
	}
}

// flush appends what is queued, batch by batch, until the queue is empty
// or the trail's life ends.
func (w *chainWriter) flush() {
	for w.t.life.Err() == nil {
		items, gap := w.take()
		if len(items) == 0 && gap == nil {
			return
		}
		events := make([][]byte, 0, len(items)+1)
		if gap != nil {
			events = append(events, gap.Canonical())
		}
		for i := range items {
			events = append(events, items[i].raw)
		}
		err := w.append(events)
		w.t.release(items)
		if err != nil {
			// The trail is closing and its time is up: these are lost.
			w.t.dropped.Add(uint64(len(items)))
			return
		}
		w.t.appended.Add(uint64(len(items)))
	}
}

// release counts items out of the queue.
func (t *Trail) release(items []item) {
	var size int64
	for i := range items {
		size += int64(len(items[i].raw))
	}
	t.queued.Add(-int64(len(items)))
	t.queuedBytes.Add(-size)
}

// take takes the next batch from the queue, and the gap event of the
// events dropped since the last one (nil when none were).
func (w *chainWriter) take() ([]item, *Event) {
	w.mu.Lock()
	defer w.mu.Unlock()
	n, size := 0, 0
	for n < len(w.queue) && n < w.t.cfg.MaxBatch && size < maxBatchBytes/2 {
		size += len(w.queue[n].raw)
		n++
	}
	items := w.queue[:n:n]
	w.queue = w.queue[n:]
	if len(w.queue) == 0 {
		w.queue = nil
	}
	var gap *Event
	if w.drops > 0 {
		gap = &Event{V: Version, Kind: KindGap, Holder: w.t.cfg.Holder, Dropped: w.drops, From: w.dropFrom, To: w.dropTo, At: time.Now()}
		w.drops = 0
	}
	return items, gap
}

// errMoved: another writer appended first; build the batch again on the
// chain's new head.
var errMoved = errors.New("audit: the chain moved on")

// append writes events as one append to the chain, trying again — on the
// new head when another writer came first, after a pause while the stream
// cannot be reached — until it is written or the trail's life ends.
func (w *chainWriter) append(events [][]byte) error {
	pauses := retry.Doubling(w.t.life, 100*time.Millisecond, 2*time.Second)
	for {
		err := w.try(events)
		switch {
		case err == nil:
			if !w.down.IsZero() {
				w.notice(true, nil)
			}
			return nil
		case errors.Is(err, errMoved):
			w.t.moved.Add(1)
			continue
		case w.t.life.Err() != nil:
			return err
		}
		if w.down.IsZero() {
			w.down = time.Now()
			w.notice(false, err)
		}
		// Once the trail's life ends, the pause does too: one last try
		// writes the events or returns its error.
		retry.Wait(w.t.life, pauses)
	}
}

// notice logs that the trail became unreachable, or reachable again.
func (w *chainWriter) notice(back bool, err error) {
	log := w.t.cfg.Log
	w.mu.Lock()
	dropped := w.droppedSinceNotice
	w.droppedSinceNotice = 0
	w.mu.Unlock()
	if back {
		if log != nil {
			log.Infow("audit trail reachable again", "partition", w.p, "after", time.Since(w.down).String(), "dropped", dropped)
		}
		w.down = time.Time{}
		return
	}
	if log != nil {
		log.Warnw("audit trail unreachable: queueing its events, dropping (and counting) those beyond the queue; operations go on",
			"partition", w.p, "subject", w.subject, "queue", w.t.cfg.Queue, "error", err)
	}
}

// try makes one append of events after the chain's head.
func (w *chainWriter) try(events [][]byte) error {
	ctx, cancel := context.WithTimeout(w.t.life, publishTimeout)
	defer cancel()
	if !w.known {
		if err := w.readHead(ctx); err != nil {
			return err
		}
	}
	bufs := appendBuffers.Get().(*[2][]byte)
	defer appendBuffers.Put(bufs)
	lines, next := appendBatch(bufs[0][:0], w.t.cfg.Signer, w.p, w.head, events)
	packed := s2.Encode(bufs[1][:cap(bufs[1])], lines)
	bufs[0], bufs[1] = lines, packed
	w.batches++
	id := w.t.id + "." + strconv.Itoa(w.p) + "." + strconv.FormatUint(w.batches, 10)
	msg := &nats.Msg{Subject: w.subject, Data: packed, Header: nats.Header{HeaderEncoding: []string{EncodingS2}}}
	ack, err := w.t.js.PublishMsg(ctx, msg, jetstream.WithMsgID(id), jetstream.WithExpectLastSequencePerSubject(w.seq))
	var apiErr *jetstream.APIError
	switch {
	case err == nil:
		w.head, w.seq, w.unsure = next, ack.Sequence, ""
		w.t.appends.Add(1)
		return nil
	case errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant):
		w.known = false
		if w.unsure != "" {
			// An earlier try's acknowledgement was lost: it may be the
			// append that moved the chain on.
			landed, lerr := w.landed(ctx)
			if lerr != nil {
				return lerr
			}
			w.unsure = ""
			if landed {
				return nil
			}
		}
		return errMoved
	default:
		if w.unsure == "" {
			w.unsure, w.unsureSeq = id, w.seq
		}
		// The append may or may not have landed; the next try's expected
		// sequence tells (it is refused if it did).
		return fmt.Errorf("append to %s: %w", w.subject, err)
	}
}

// landed reports whether the append of unknown outcome (w.unsure) was
// stored: it is the chain's first message after the one it expected.
func (w *chainWriter) landed(ctx context.Context) (bool, error) {
	s, err := w.t.boundStream(ctx)
	if err != nil {
		return false, err
	}
	m, err := s.GetMsg(ctx, w.unsureSeq+1, jetstream.WithGetMsgSubject(w.subject))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("read %s after %d: %w", w.subject, w.unsureSeq, err)
	}
	ok := m.Header.Get(jetstream.MsgIDHeader) == w.unsure
	if ok {
		w.t.appends.Add(1)
	}
	return ok, nil
}

// readHead reads the chain's last message: its sequence and last entry. A
// chain without one starts at its genesis (GenesisDigest).
func (w *chainWriter) readHead(ctx context.Context) error {
	s, err := w.t.boundStream(ctx)
	if err != nil {
		return err
	}
	h, seq, err := lastEntry(ctx, s, w.subject)
	if err != nil {
		return err
	}
	if seq == 0 {
		id, err := w.t.installation(ctx)
		if err != nil {
			return err
		}
		h.digest = GenesisDigest(id, w.p)
	}
	w.head, w.seq, w.known = h, seq, true
	return nil
}

// installation returns the installation's id: the configured one, or the
// one Installation reads (or makes) on first use.
func (t *Trail) installation(ctx context.Context) (string, error) {
	t.streamMu.Lock()
	defer t.streamMu.Unlock()
	if t.cfg.Installation == "" {
		id, err := Installation(ctx, t.js, t.cfg.Names)
		if err != nil {
			return "", err
		}
		t.cfg.Installation = id
	}
	return t.cfg.Installation, nil
}

// boundStream returns the audit stream, binding it on first use.
func (t *Trail) boundStream(ctx context.Context) (jetstream.Stream, error) {
	t.streamMu.Lock()
	defer t.streamMu.Unlock()
	if t.stream != nil {
		return t.stream, nil
	}
	s, err := t.js.Stream(ctx, t.cfg.Names.AuditStream)
	if err != nil {
		return nil, fmt.Errorf("audit stream %s: %w", t.cfg.Names.AuditStream, err)
	}
	t.stream = s
	return s, nil
}
