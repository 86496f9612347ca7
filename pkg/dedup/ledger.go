package dedup

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/idemgate/idemgate/pkg/intent"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// defaultTimeout bounds a leader read whose ctx has no deadline, like the
// jetstream package's own API calls.
const defaultTimeout = 5 * time.Second

// settleTimeout bounds the leader read that resolves an ambiguous write (one
// whose acknowledgement was lost), even when the caller's ctx is done.
const settleTimeout = 2 * time.Second

// Ledger is the record store of operation keys: claim, lease, complete, fail,
// release, wait and read. It is safe for concurrent use. Build it with New or
// Open; one built WithBatching group-commits its writes and should be closed
// with Close when done.
type Ledger struct {
	kv        jetstream.KeyValue
	js        jetstream.JetStream
	nc        *nats.Conn
	getSubj   string // JetStream API subject of a (leader) message get on the bucket's stream
	dgetSubj  string // JetStream API subject prefix of a direct get of a key's latest message
	keyPrefix string // "$KV.<bucket>."
	putPrefix string // subject prefix of a key's writes
	timeout   time.Duration
	now       func() time.Time
	layout    int // the key layout (intent.LedgerKey); set by WithLayout

	policy policy // the rules' options: WithConfirmedTakeover, WithRetention

	receipts ReceiptFunc // set by WithReceipts

	batchCfg *BatchConfig // set by WithBatching
	batch    *batcher     // nil: every write goes out on its own

	parts []*Ledger // a partitioned ledger's partitions, parts[0] being this one; nil for one bucket

	directReads atomic.Uint64 // reads readSince took from a direct get
}

// Option adjusts a Ledger built by New or Open.
type Option func(*Ledger)

// WithClock makes the ledger read the time from now instead of time.Now. The
// clock sets lease deadlines and decides whether a lease has expired.
func WithClock(now func() time.Time) Option {
	return func(l *Ledger) { l.now = now }
}

// WithRetention sets how long a final record (completed, failed, denied) is
// kept: its write carries d as its per-message TTL. Unresolved records never
// expire. Default: the bucket's TTL when the ledger is built by Open, else
// DefaultTTL.
func WithRetention(d time.Duration) Option {
	return func(l *Ledger) { l.policy.retention = d }
}

// WithLayout makes the ledger store keys in the given layout
// (intent.LedgerKey): the one the ledger records, which EnsurePartitions and
// BindPartitions return and Open, Bind and OpenReader pass themselves. A
// ledger opened in another layout than its buckets hold would not find their
// records. Default: intent.LayoutFull, the layout of a bucket that records
// none (EnsureBucket's).
func WithLayout(layout int) Option {
	return func(l *Ledger) { l.layout = layout }
}

// WithConfirmedTakeover makes a claim take over a pending record whose lease
// expired only when its ClaimRequest.Confirmed names that record's revision:
// the claimant saw the revision stay unchanged past its deadline, for a grace
// period, on its own clock. A lease deadline is judged by wall clocks; after
// an outage of the ledger longer than a lease every live lease has expired at
// once, and only a holder that had its chance to extend (and did not) is
// really gone. Without the option an expired lease is taken over at once.
func WithConfirmedTakeover() Option {
	return func(l *Ledger) { l.policy.confirmTakeover = true }
}

// ReceiptFunc returns the receipt of a record about to be written with a
// final outcome (see WithReceipts): a JSON object, stored as it is; rec is
// the record as it will be stored, its CompletedAt the outcome's time; ctx
// is the writing call's. It must be quick, and safe for concurrent use.
type ReceiptFunc func(ctx context.Context, key string, rec Record) json.RawMessage

// WithReceipts makes every write of a final outcome — Lease.Complete,
// Lease.Fail, Deny, Resolve — store receipt's return in the record's
// Receipt, so that every answer from the record carries it. Default: no
// receipts.
func WithReceipts(receipt ReceiptFunc) Option {
	return func(l *Ledger) { l.receipts = receipt }
}

// seal sets r's receipt for a write of r: the ReceiptFunc's when r is
// final, none otherwise.
func (l *Ledger) seal(ctx context.Context, key string, r *Record) {
	r.Receipt = nil
	if l.receipts != nil && r.Status.Final() {
		r.Receipt = l.receipts(ctx, key, *r)
	}
}

// New returns a Ledger over kv, a bucket of js (typically one EnsureBucket
// returned). js provides the connection and API prefix (or domain) for leader
// reads: decisions are never taken on a plain kv.Get, which a follower of a
// replicated bucket may answer without an acknowledged write. Mirrored or
// sourced buckets are not supported.
func New(js jetstream.JetStream, kv jetstream.KeyValue, opts ...Option) (*Ledger, error) {
	if js == nil || kv == nil {
		return nil, fmt.Errorf("%w: new ledger: js and kv must not be nil", ErrInvalid)
	}
	jo := js.Options()
	prefix := jetstream.DefaultAPIPrefix
	switch {
	case jo.APIPrefix != "":
		prefix = jo.APIPrefix
		if !strings.HasSuffix(prefix, ".") {
			prefix += "."
		}
	case jo.Domain != "":
		prefix = "$JS." + jo.Domain + ".API."
	}
	timeout := jo.DefaultTimeout
	if timeout <= 0 {
		timeout = defaultTimeout
	}
	l := &Ledger{
		kv:        kv,
		js:        js,
		nc:        js.Conn(),
		getSubj:   prefix + "STREAM.MSG.GET.KV_" + kv.Bucket(),
		dgetSubj:  prefix + "DIRECT.GET.KV_" + kv.Bucket() + ".$KV." + kv.Bucket() + ".",
		keyPrefix: "$KV." + kv.Bucket() + ".",
		putPrefix: "$KV." + kv.Bucket() + ".",
		timeout:   timeout,
		now:       time.Now,
		policy:    policy{retention: DefaultTTL},
		layout:    intent.LayoutFull,
	}
	if prefix != jetstream.DefaultAPIPrefix {
		l.putPrefix = prefix + l.putPrefix // as the jetstream KV API publishes
	}
	for _, opt := range opts {
		opt(l)
	}
	if l.policy.retention < time.Second {
		return nil, fmt.Errorf("%w: new ledger: retention %s: use at least 1s", ErrInvalid, l.policy.retention)
	}
	if !intent.ValidLedgerLayout(l.layout) {
		return nil, fmt.Errorf("%w: new ledger: layout %d: use %d or %d, as the ledger records it (RecordedLayout)",
			ErrInvalid, l.layout, intent.LayoutFull, intent.LayoutCompact)
	}
	if l.batchCfg != nil {
		cfg := l.batchCfg.withDefaults()
		if err := cfg.validate(); err != nil {
			return nil, fmt.Errorf("new ledger: %w", err)
		}
		l.batch = newBatcher(l, cfg)
	}
	return l, nil
}

// Open ensures the buckets of the ledger described by cfg (see
// EnsurePartitions) and returns a Ledger over them, in the ledger's key
// layout. With WithBatching among opts, the bucket is made to allow atomic
// publish (BucketConfig.AtomicPublish).
func Open(ctx context.Context, js jetstream.JetStream, cfg BucketConfig, opts ...Option) (*Ledger, error) {
	var probe Ledger
	for _, opt := range opts {
		opt(&probe)
	}
	if probe.batchCfg != nil {
		cfg.AtomicPublish = true
	}
	kvs, layout, err := EnsurePartitions(ctx, js, cfg)
	if err != nil {
		return nil, err
	}
	return NewPartitioned(js, kvs, append(append([]Option{WithRetention(cfg.withDefaults().TTL)}, opts...), WithLayout(layout))...)
}

// Close stops a batching ledger's group commit (see WithBatching): it sends
// the writes still queued, waits for the batches in flight to be answered,
// and makes later writes go out one by one. The ledger stays usable. Close is
// safe to call more than once, and does nothing for a ledger without
// batching.
func (l *Ledger) Close() {
	for _, p := range l.parts[min(1, len(l.parts)):] {
		p.Close()
	}
	if l.batch != nil {
		l.batch.close()
	}
}

// BatchStats reports what the ledger's group commit did since New; all zero
// without batching.
func (l *Ledger) BatchStats() BatchStats {
	if len(l.parts) > 1 {
		return sumStats(l.parts)
	}
	if l.batch == nil {
		return BatchStats{}
	}
	return l.batch.statsNow()
}

// create writes data as key's first record (or over a delete marker), like
// kv.Create, through the group commit when there is one.
func (l *Ledger) create(ctx context.Context, key string, data []byte) (uint64, error) {
	if l.batch == nil {
		return l.putNew(ctx, key, data)
	}
	return l.batch.do(ctx, &write{key: key, data: data, create: true})
}

// directKey marks a context whose writes bypass the group commit.
type directKey struct{}

// direct makes the writes under ctx go out on their own even with group
// commit: a lease's heartbeat must not wait behind a batch (a batch stalled by
// an outage would hold every holder's extension, and their leases would lapse
// together).
func direct(ctx context.Context) context.Context { return context.WithValue(ctx, directKey{}, true) }

// update writes data over key's revision rev, like kv.Update, with ttl as
// its per-message TTL when positive, through the group commit when there is
// one (and ctx is not direct).
func (l *Ledger) update(ctx context.Context, key string, data []byte, rev uint64, ttl time.Duration) (uint64, error) {
	if l.batch == nil || ctx.Value(directKey{}) != nil {
		return l.put(ctx, key, data, rev, ttl)
	}
	return l.batch.do(ctx, &write{key: key, data: data, rev: rev, ttl: ttl})
}

// Bucket returns the name of the ledger's KV bucket: its partition 0's when
// it has several (see Buckets).
func (l *Ledger) Bucket() string { return l.kv.Bucket() }

// Layout returns the ledger's key layout (see WithLayout).
func (l *Ledger) Layout() int { return l.layout }

// stored returns the KV key under which the ledger keeps key's record
// (intent.LedgerKey in its layout). A key the layout cannot store gives an
// error matching ErrInvalid.
func (l *Ledger) stored(key string) (string, error) {
	k, err := intent.LedgerKey(key, l.layout)
	if err != nil {
		return "", fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	return k, nil
}

// Get reads key's record and revision from the bucket's stream leader, so it
// sees every acknowledged write. It returns an error matching ErrNotFound when
// the key has no record (or only a delete marker).
func (l *Ledger) Get(ctx context.Context, key string) (Record, uint64, error) {
	if p := l.at(key); p != l {
		return p.Get(ctx, key)
	}
	e, err := l.read(ctx, key)
	if err != nil {
		return Record{}, 0, fmt.Errorf("get %s: %w", key, err)
	}
	if !e.live() {
		return Record{}, 0, fmt.Errorf("get %s: %w", key, ErrNotFound)
	}
	rec, err := DecodeRecord(e.data)
	if err != nil {
		return Record{}, 0, fmt.Errorf("get %s: decode record at revision %d: %w", key, e.rev, err)
	}
	return rec, e.rev, nil
}

// transition replaces key's record with rec if the record's latest revision
// is still rev, and returns the new revision; it sets rec.UpdatedAt. The
// operator decisions (decide.go) move records through it. A stale rev gives
// an error matching ErrRevisionMismatch and writes nothing.
func (l *Ledger) transition(ctx context.Context, key string, rev uint64, rec Record) (uint64, error) {
	rec.UpdatedAt = l.clock()
	newRev, err := l.cas(ctx, key, rev, rec)
	if err != nil {
		return 0, fmt.Errorf("transition %s to %s: %w", key, rec.Status, err)
	}
	return newRev, nil
}

// cas writes rec over revision rev. A stale revision gives ErrRevisionMismatch.
// A write whose outcome is unknown (its acknowledgement was lost) is settled by
// a leader read: if the latest value is exactly what was written, it succeeded.
func (l *Ledger) cas(ctx context.Context, key string, rev uint64, rec Record) (uint64, error) {
	data, err := rec.marshal()
	if err != nil {
		return 0, err
	}
	// The settling read gets no longer than the write had: a caller that
	// bounds its attempts (a holder retrying its completion through an
	// outage) must get each attempt back in that time.
	settleIn := settleTimeout
	if d, ok := ctx.Deadline(); ok {
		settleIn = min(settleIn, max(time.Until(d), 100*time.Millisecond))
	}
	for try := 0; ; try++ {
		newRev, err := l.update(ctx, key, data, rev, l.policy.ttl(rec.Status))
		switch {
		case err == nil:
			return newRev, nil
		case errors.Is(err, jetstream.ErrKeyRevisionMismatch), errors.Is(err, jetstream.ErrKeyExists):
			// The mismatch is tested first: on R1 it also matches
			// ErrKeyExists; both mean the write was refused.
			if l.retryCAS(ctx, key, rev, err, try) {
				continue
			}
			return 0, ErrRevisionMismatch
		}
		if got, ok := l.settle(ctx, key, rev, data, settleIn); ok {
			return got, nil
		}
		return 0, err
	}
}

// maxCASRetries bounds the retries of a refused compare-and-set whose
// revision is still the latest (see retryCAS).
const maxCASRetries = 6

// retryCAS reports whether a compare-and-set on rev refused with err should be
// tried again, after a short pause. A replicated stream refuses a
// compare-and-set on a key whose previous write is still in process, with the
// constant "wrong last sequence" error (10164), even when rev is right — just
// after that write was acknowledged, too. So when the leader still has rev as
// the latest revision, the refusal is not a lost race and the write is
// retried; the retry is itself a compare-and-set, so it cannot overwrite
// another writer.
func (l *Ledger) retryCAS(ctx context.Context, key string, rev uint64, err error, try int) bool {
	var apiErr *jetstream.APIError
	if try >= maxCASRetries || !errors.As(err, &apiErr) ||
		apiErr.ErrorCode != jetstream.JSErrCodeStreamWrongLastSequenceConstant {
		return false
	}
	e, rerr := l.read(ctx, key)
	if rerr != nil || e.rev != rev {
		return false
	}
	t := time.NewTimer(time.Millisecond << try)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// settle resolves a write of data over rev whose outcome is unknown: it
// reports the new revision and true if the leader's latest value is data, as
// read within the given time.
func (l *Ledger) settle(ctx context.Context, key string, rev uint64, data []byte, within time.Duration) (uint64, bool) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), within)
	defer cancel()
	e, err := l.read(ctx, key)
	if err != nil || !e.live() || e.rev <= rev || !bytes.Equal(e.data, data) {
		return 0, false
	}
	return e.rev, true
}

// entry is the latest message of a key, as the stream leader has it.
type entry struct {
	rev     uint64 // stream sequence; 0 when the subject has no message
	data    []byte
	deleted bool // a delete or purge marker
}

func (e entry) live() bool { return e.rev != 0 && !e.deleted }

type msgGetRequest struct {
	LastBySubject string `json:"last_by_subj"`
}

type msgGetResponse struct {
	Error   *jetstream.APIError `json:"error,omitempty"`
	Message *struct {
		Subject  string `json:"subject"`
		Sequence uint64 `json:"seq"`
		Header   []byte `json:"hdrs,omitempty"`
		Data     []byte `json:"data,omitempty"`
	} `json:"message,omitempty"`
}

// read fetches key's latest message with a plain (non-direct) JetStream
// message-get request, which only the stream leader answers.
func (l *Ledger) read(ctx context.Context, key string) (entry, error) {
	sk, err := l.stored(key)
	if err != nil {
		return entry{}, err
	}
	req, err := json.Marshal(msgGetRequest{LastBySubject: l.keyPrefix + sk})
	if err != nil {
		return entry{}, err
	}
	_, e, err := l.msgGet(ctx, req)
	return e, err
}

// readSince fetches key's latest message knowing that the stream held its
// message seq a moment ago (a refused write named it): a direct get, which
// any replica holding the stream may answer without the JetStream API's
// queue and JSON, is taken when its message is seq or later — as new as a
// leader read made when the write was refused; anything else (an older
// message from a lagging replica, none, no direct access on the stream, an
// error) falls back to the leader read.
func (l *Ledger) readSince(ctx context.Context, key string, seq uint64) (entry, error) {
	if seq > 0 {
		if e, ok := l.directRead(ctx, key); ok && e.rev >= seq {
			l.directReads.Add(1)
			return e, nil
		}
	}
	return l.read(ctx, key)
}

// directRead asks for key's latest message by a direct get; ok is false
// when the answer is not a message.
func (l *Ledger) directRead(ctx context.Context, key string) (entry, bool) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, l.timeout)
		defer cancel()
	}
	sk, err := l.stored(key)
	if err != nil {
		return entry{}, false
	}
	msg, err := l.nc.RequestWithContext(ctx, l.dgetSubj+sk, nil)
	if err != nil || msg.Header == nil || msg.Header.Get("Status") != "" {
		return entry{}, false
	}
	seq, err := strconv.ParseUint(msg.Header.Get(jetstream.SequenceHeader), 10, 64)
	if err != nil || seq == 0 {
		return entry{}, false
	}
	return entry{rev: seq, data: msg.Data, deleted: isDeleteMarker(msg.Header)}, true
}

// refusedAt returns the sequence a refusal of an expected last subject
// sequence names ("wrong last sequence: N"), or 0 when it names none (a
// replicated stream's 10164, another error).
func refusedAt(err error) uint64 {
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) || apiErr.ErrorCode != jetstream.JSErrCodeStreamWrongLastSequence {
		return 0
	}
	return refusedSeq(apiErr)
}

// refusedSeq returns N of a 10071 refusal's "wrong last sequence: N": the
// refused key's latest revision; 0 when the description names none.
func refusedSeq(apiErr *jetstream.APIError) uint64 {
	_, n, ok := strings.Cut(apiErr.Description, "wrong last sequence: ")
	if !ok {
		return 0
	}
	seq, err := strconv.ParseUint(n, 10, 64)
	if err != nil {
		return 0
	}
	return seq
}

// msgGet sends a message-get request to the stream leader and returns the
// message's subject and entry; a missing message is the zero entry.
func (l *Ledger) msgGet(ctx context.Context, req []byte) (string, entry, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, l.timeout)
		defer cancel()
	}
	msg, err := l.nc.RequestWithContext(ctx, l.getSubj, req)
	if err != nil {
		return "", entry{}, fmt.Errorf("leader read: %w", err)
	}
	var resp msgGetResponse
	if err := json.Unmarshal(msg.Data, &resp); err != nil {
		return "", entry{}, fmt.Errorf("leader read: decode response: %w", err)
	}
	if resp.Error != nil {
		if resp.Error.ErrorCode == jetstream.JSErrCodeMessageNotFound {
			return "", entry{}, nil
		}
		return "", entry{}, fmt.Errorf("leader read: %w", resp.Error)
	}
	if resp.Message == nil {
		return "", entry{}, fmt.Errorf("leader read: %w", jetstream.ErrInvalidJetStreamResponse)
	}
	e := entry{rev: resp.Message.Sequence, data: resp.Message.Data}
	if len(resp.Message.Header) > 0 {
		hdr, err := nats.DecodeHeadersMsg(resp.Message.Header)
		if err != nil {
			return "", entry{}, fmt.Errorf("leader read: decode headers: %w", err)
		}
		e.deleted = isDeleteMarker(hdr)
	}
	return resp.Message.Subject, e, nil
}

// isDeleteMarker reports whether a KV message's headers mark a delete or
// purge (by the client, or a server-placed subject delete marker).
func isDeleteMarker(hdr nats.Header) bool {
	switch hdr.Get("KV-Operation") {
	case "DEL", "PURGE":
		return true
	}
	switch hdr.Get(jetstream.MarkerReasonHeader) {
	case "MaxAge", "Purge", "Remove":
		return true
	}
	return false
}

// clock returns the ledger's current time in UTC, as records store it (and
// without a monotonic reading, so a record compares equal to its decoding).
func (l *Ledger) clock() time.Time { return l.now().UTC() }
