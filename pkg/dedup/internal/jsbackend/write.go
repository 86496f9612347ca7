package jsbackend

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/idemgate/idemgate/pkg/retry"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// A record is written as one JetStream publish request on the key's
// subject, with the key's expected latest revision, and the sequence of the
// acknowledgement is read without a JSON decode — what kv.Create and
// kv.Update do, without their key regexp, their fallback read after a
// refused create, and the decode of every acknowledgement. Inside the
// package the refusals are the jetstream KV API's: a refused create matches
// jetstream.ErrKeyExists, a refused compare-and-set
// jetstream.ErrKeyRevisionMismatch, each wrapping the server's
// *jetstream.APIError (10071 "wrong last sequence: N", or 10164 on a
// replicated stream while a write of the key is in process); no responders,
// after the jetstream client's retries, is jetstream.ErrNoStreamResponse.
// The exported methods report refusals as ErrExists and ErrRevision.

// Publish retries on no responders, as the jetstream client's own: a stream
// leader election is over in a moment.
const (
	pubRetryWait     = 250 * time.Millisecond
	pubRetryAttempts = 2
)

// Mode says how a write goes out.
type Mode int

const (
	// Grouped writes go through the group commit, when the bucket has one.
	Grouped Mode = iota
	// Alone writes go out on their own, past the group commit's queue: a
	// lease's heartbeat must not wait behind a batch (a batch stalled by an
	// outage would hold every holder's extension, and their leases would
	// lapse together).
	Alone
)

// Create writes data as key's first record. A key with a record refuses it
// with an error matching ErrExists, and Create returns that key's latest
// message, read no older than the message the refusal named (by a direct
// get when a replica has it, else from the leader). A key with only a delete
// marker is written over by the group commit (as kv.Create does), and
// refused on its own, the marker returned, for the caller to write over by
// compare-and-set. A write whose acknowledgement was lost is settled by a
// leader read.
func (b *Bucket) Create(ctx context.Context, key string, data []byte) (uint64, Entry, error) {
	var rev uint64
	var err error
	if b.batch == nil {
		rev, err = b.putNew(ctx, key, data)
	} else {
		rev, err = b.batch.do(ctx, &write{key: key, data: data, create: true})
	}
	switch {
	case err == nil:
		return rev, Entry{}, nil
	case !errors.Is(err, jetstream.ErrKeyExists):
		if got, ok := b.settle(ctx, key, 0, data, settleTimeout); ok {
			return got, Entry{}, nil
		}
		return 0, Entry{}, err
	}
	e, rerr := b.readSince(ctx, key, refusedAt(err))
	if rerr != nil {
		return 0, Entry{}, rerr
	}
	return 0, e, fmt.Errorf("%w: %w", ErrExists, err)
}

// Update writes data over key's revision rev (compare-and-set), with ttl as
// its per-message TTL when positive, and returns the new revision. Another
// revision refuses it with an error matching ErrRevision. A write whose
// acknowledgement was lost is settled by a leader read, which gets no longer
// than the write had (at most 2s), so that a caller bounding its attempts
// gets each back in that time.
func (b *Bucket) Update(ctx context.Context, key string, data []byte, rev uint64, ttl time.Duration, m Mode) (uint64, error) {
	settleIn := settleTimeout
	if d, ok := ctx.Deadline(); ok {
		settleIn = min(settleIn, max(time.Until(d), 100*time.Millisecond))
	}
	since := time.Now()
	var pauses backoff.BackOff // made at the first pause: most writes need none
	for {
		var newRev uint64
		var err error
		if b.batch == nil || m == Alone {
			newRev, err = b.put(ctx, key, data, rev, ttl)
		} else {
			newRev, err = b.batch.do(ctx, &write{key: key, data: data, rev: rev, ttl: ttl})
		}
		switch {
		case err == nil:
			return newRev, nil
		case errors.Is(err, jetstream.ErrKeyRevisionMismatch), errors.Is(err, jetstream.ErrKeyExists):
			// The mismatch is tested first: on R1 it also matches
			// ErrKeyExists; both mean the write was refused.
			if b.retryCAS(ctx, key, rev, err, since) {
				if pauses == nil {
					pauses = casPauses(ctx)
				}
				if retry.Wait(ctx, pauses) {
					continue
				}
			}
			return 0, fmt.Errorf("%w: %w", ErrRevision, err)
		}
		if got, ok := b.settle(ctx, key, rev, data, settleIn); ok {
			return got, nil
		}
		return 0, err
	}
}

// Delete places a delete marker over key's revision rev (compare-and-set).
// Another revision refuses it with an error matching ErrRevision — as does a
// replicated stream while a write of the key is in process.
func (b *Bucket) Delete(ctx context.Context, key string, rev uint64) error {
	err := b.kv.Delete(ctx, key, jetstream.LastRevision(rev))
	if err != nil && wrongLastSequence(err) {
		return fmt.Errorf("%w: %w", ErrRevision, err)
	}
	return err
}

// Place writes data as key's record, on its own, with ttl as its
// per-message TTL when positive, unless the key has a record already:
// placed false then, and nothing written. A delete marker is written over.
// A migration moves records with it.
func (b *Bucket) Place(ctx context.Context, key string, data []byte, ttl time.Duration) (placed bool, err error) {
	_, err = b.publish(ctx, key, data, 0, ttl) // create-only
	switch {
	case err == nil:
		return true, nil
	case !wrongLastSequence(err):
		return false, fmt.Errorf("write to %s: %w", b.Name(), err)
	}
	e, err := b.Read(ctx, key)
	if err != nil {
		return false, fmt.Errorf("read its new place: %w", err)
	}
	if !e.Deleted {
		return false, nil
	}
	if _, err := b.put(ctx, key, data, e.Rev, ttl); err != nil {
		return false, fmt.Errorf("write over a delete marker: %w", err)
	}
	return true, nil
}

// Purge removes every message of key from the bucket's stream: its record
// and its markers, leaving nothing.
func (b *Bucket) Purge(ctx context.Context, key string) error {
	s, err := b.streamOf(ctx)
	if err != nil {
		return err
	}
	return s.Purge(ctx, jetstream.WithPurgeSubject(b.keyPrefix+key))
}

// casRetryFor bounds how long a refused compare-and-set whose revision is
// still the latest is retried (see retryCAS): as long as a lost
// acknowledgement is settled.
const casRetryFor = settleTimeout

// casPauses are the pauses before a refused compare-and-set is sent again
// (see retryCAS): 1ms, doubling up to 100ms (1, 2, 4 ... 64, 100, 100ms),
// cut short when ctx is done; casRetryFor bounds how long they go on.
func casPauses(ctx context.Context) backoff.BackOff {
	return retry.Doubling(ctx, time.Millisecond, 100*time.Millisecond)
}

// retryCAS reports whether a compare-and-set on rev, refused with err after
// being first sent at since, should be tried again, after a short pause
// (casPauses). A
// replicated stream refuses a compare-and-set on a key whose previous write
// is still in process, with the constant "wrong last sequence" error
// (10164), even when rev is right — just after that write was acknowledged,
// too, and for longer on a loaded server. So when the leader still has rev
// as the latest revision, the refusal is not a lost race and the write is
// retried, for up to casRetryFor; the retry is itself a compare-and-set, so
// it cannot overwrite another writer.
func (b *Bucket) retryCAS(ctx context.Context, key string, rev uint64, err error, since time.Time) bool {
	var apiErr *jetstream.APIError
	if time.Since(since) >= casRetryFor || !errors.As(err, &apiErr) ||
		apiErr.ErrorCode != jetstream.JSErrCodeStreamWrongLastSequenceConstant {
		return false
	}
	e, rerr := b.Read(ctx, key)
	return rerr == nil && e.Rev == rev
}

// settle resolves a write of data over rev whose outcome is unknown: it
// reports the new revision and true if the leader's latest value is data, as
// read within the given time.
func (b *Bucket) settle(ctx context.Context, key string, rev uint64, data []byte, within time.Duration) (uint64, bool) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), within)
	defer cancel()
	e, err := b.Read(ctx, key)
	if err != nil || !e.Live() || e.Rev <= rev || !bytes.Equal(e.Data, data) {
		return 0, false
	}
	return e.Rev, true
}

// putNew writes data as key's first record: refused, with an error matching
// jetstream.ErrKeyExists, when the key has any message — a record or a
// delete marker.
func (b *Bucket) putNew(ctx context.Context, key string, data []byte) (uint64, error) {
	rev, err := b.publish(ctx, key, data, 0, 0)
	if err != nil && wrongLastSequence(err) {
		return 0, fmt.Errorf("%w: %w", err, jetstream.ErrKeyExists)
	}
	return rev, err
}

// put writes data over key's revision rev on its own, with ttl as its
// per-message TTL when positive; a stale rev gives an error matching
// jetstream.ErrKeyRevisionMismatch, as kv.Update does.
func (b *Bucket) put(ctx context.Context, key string, data []byte, rev uint64, ttl time.Duration) (uint64, error) {
	seq, err := b.publish(ctx, key, data, rev, ttl)
	if err != nil && wrongLastSequence(err) {
		return 0, fmt.Errorf("%w: %w", err, jetstream.ErrKeyRevisionMismatch)
	}
	return seq, err
}

// publish sends data on key's subject expecting rev as the subject's last
// sequence, and returns the stored message's sequence.
func (b *Bucket) publish(ctx context.Context, key string, data []byte, rev uint64, ttl time.Duration) (uint64, error) {
	if !validKey(key) {
		return 0, jetstream.ErrInvalidKey
	}
	ctx, cancel := b.withTimeout(ctx)
	defer cancel()
	h := nats.Header{jetstream.ExpectedLastSubjSeqHeader: []string{strconv.FormatUint(rev, 10)}}
	if ttl > 0 {
		h[jetstream.MsgTTLHeader] = []string{ttl.String()}
	}
	m := &nats.Msg{Subject: b.putPrefix + key, Data: data, Header: h}
	resp, err := b.nc.RequestMsgWithContext(ctx, m)
	for r := 0; errors.Is(err, nats.ErrNoResponders) && r < pubRetryAttempts; r++ {
		t := time.NewTimer(pubRetryWait)
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
		resp, err = b.nc.RequestMsgWithContext(ctx, m)
	}
	if errors.Is(err, nats.ErrNoResponders) {
		return 0, jetstream.ErrNoStreamResponse
	}
	if err != nil {
		return 0, err
	}
	return pubAckSeq(resp.Data)
}

// pubAckPrefix starts every acknowledgement of a stored message.
var pubAckPrefix = []byte(`{"stream":"`)

// pubAckSeq returns the sequence of a publish acknowledgement. The server
// writes an acknowledgement from a template, {"stream":"S","seq":N} (a
// "domain" member after the stream's in a domain), which is read without a
// decode; anything else — a refusal, a duplicate, another server's layout —
// is decoded in full.
func pubAckSeq(data []byte) (uint64, error) {
	if bytes.HasPrefix(data, pubAckPrefix) && data[len(data)-1] == '}' {
		i := bytes.LastIndex(data, []byte(`,"seq":`))
		if end := len(data) - 1; i > len(pubAckPrefix) && i+7 < end {
			if seq, err := strconv.ParseUint(string(data[i+7:end]), 10, 64); err == nil {
				return seq, nil
			}
		}
	}
	var ack struct {
		Error    *jetstream.APIError `json:"error,omitempty"`
		Stream   string              `json:"stream"`
		Sequence uint64              `json:"seq"`
	}
	if err := json.Unmarshal(data, &ack); err != nil {
		return 0, jetstream.ErrInvalidJSAck
	}
	if ack.Error != nil {
		return 0, fmt.Errorf("nats: %w", ack.Error)
	}
	if ack.Stream == "" {
		return 0, jetstream.ErrInvalidJSAck
	}
	return ack.Sequence, nil
}

// wrongLastSequence reports whether err is the server's refusal of an
// expected last subject sequence: 10071, or 10164 on a replicated stream.
func wrongLastSequence(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)
}

// validKey reports whether key is a valid KV key, by the jetstream KV API's
// rule: one or more of [-/_=.a-zA-Z0-9], neither starting nor ending with a
// dot, no two dots in a row.
func validKey(key string) bool {
	if key == "" || key[0] == '.' || key[len(key)-1] == '.' {
		return false
	}
	for i := 0; i < len(key); i++ {
		switch c := key[i]; {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '-', c == '/', c == '_', c == '=':
		case c == '.':
			if key[i-1] == '.' {
				return false
			}
		default:
			return false
		}
	}
	return true
}
