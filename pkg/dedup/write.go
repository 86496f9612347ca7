package dedup

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// The ledger writes a record as one JetStream publish request on the key's
// subject, with the key's expected latest revision, and reads the sequence
// of the acknowledgement without a JSON decode — what kv.Create and
// kv.Update do, without their key regexp, their fallback read after a
// refused create, and the decode of every acknowledgement. The errors are
// the jetstream KV API's: a refused create matches jetstream.ErrKeyExists, a
// refused compare-and-set jetstream.ErrKeyRevisionMismatch, each wrapping the
// server's *jetstream.APIError (10071 "wrong last sequence: N", or 10164 on a
// replicated stream while a write of the key is in process); no responders,
// after the jetstream client's retries, is jetstream.ErrNoStreamResponse.

// Publish retries on no responders, as the jetstream client's own: a stream
// leader election is over in a moment.
const (
	pubRetryWait     = 250 * time.Millisecond
	pubRetryAttempts = 2
)

// putNew writes data as key's first record: refused, with an error matching
// jetstream.ErrKeyExists, when the key has any message — a record or a
// delete marker (Claim reads which, and writes over a marker by
// compare-and-set).
func (l *Ledger) putNew(ctx context.Context, key string, data []byte) (uint64, error) {
	rev, err := l.publish(ctx, key, data, 0, 0)
	if err != nil && wrongLastSequence(err) {
		return 0, fmt.Errorf("%w: %w", err, jetstream.ErrKeyExists)
	}
	return rev, err
}

// put writes data over key's revision rev on its own, with ttl as its
// per-message TTL when positive (a final record: see ttlFor); a stale rev
// gives an error matching jetstream.ErrKeyRevisionMismatch, as kv.Update
// does.
func (l *Ledger) put(ctx context.Context, key string, data []byte, rev uint64, ttl time.Duration) (uint64, error) {
	seq, err := l.publish(ctx, key, data, rev, ttl)
	if err != nil && wrongLastSequence(err) {
		return 0, fmt.Errorf("%w: %w", err, jetstream.ErrKeyRevisionMismatch)
	}
	return seq, err
}

// publish sends data on key's subject (its stored key's) expecting rev as the subject's last
// sequence, and returns the stored message's sequence.
func (l *Ledger) publish(ctx context.Context, key string, data []byte, rev uint64, ttl time.Duration) (uint64, error) {
	sk, err := l.stored(key)
	if err != nil {
		return 0, err
	}
	if !validKey(sk) {
		return 0, jetstream.ErrInvalidKey
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, l.timeout)
		defer cancel()
	}
	h := nats.Header{jetstream.ExpectedLastSubjSeqHeader: []string{strconv.FormatUint(rev, 10)}}
	if ttl > 0 {
		h[jetstream.MsgTTLHeader] = []string{ttl.String()}
	}
	m := &nats.Msg{Subject: l.putPrefix + sk, Data: data, Header: h}
	resp, err := l.nc.RequestMsgWithContext(ctx, m)
	for r := 0; errors.Is(err, nats.ErrNoResponders) && r < pubRetryAttempts; r++ {
		t := time.NewTimer(pubRetryWait)
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
		resp, err = l.nc.RequestMsgWithContext(ctx, m)
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
