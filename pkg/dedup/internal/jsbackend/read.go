package jsbackend

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// errNoMessage: a message get found no message at the sequence it asked for.
var errNoMessage = errors.New("no message")

type msgGetRequest struct {
	LastBySubject string `json:"last_by_subj,omitempty"`
	Seq           uint64 `json:"seq,omitempty"`
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

// Read returns key's latest message, read with a plain (non-direct)
// JetStream message-get request, which only the stream leader answers: it
// sees every acknowledged write. A key without a message is the zero Entry.
func (b *Bucket) Read(ctx context.Context, key string) (Entry, error) {
	req, err := json.Marshal(msgGetRequest{LastBySubject: b.keyPrefix + key})
	if err != nil {
		return Entry{}, err
	}
	_, e, err := b.msgGet(ctx, req)
	return e, err
}

// readSince fetches key's latest message knowing that the stream held its
// message seq a moment ago (a refused write named it): a direct get, which
// any replica holding the stream may answer without the JetStream API's
// queue and JSON, is taken when its message is seq or later — as new as a
// leader read made when the write was refused; anything else (an older
// message from a lagging replica, none, no direct access on the stream, an
// error) falls back to the leader read.
func (b *Bucket) readSince(ctx context.Context, key string, seq uint64) (Entry, error) {
	if seq > 0 {
		if e, ok := b.directRead(ctx, key); ok && e.Rev >= seq {
			b.directReads.Add(1)
			return e, nil
		}
	}
	return b.Read(ctx, key)
}

// Peek returns key's latest message as a direct get finds it: any server
// holding the stream may answer, so it may be older than an acknowledged
// write. ok is false when the answer is not a message (no message, a stream
// without direct gets, an error).
func (b *Bucket) Peek(ctx context.Context, key string) (Entry, bool) {
	return b.directRead(ctx, key)
}

// directRead asks for key's latest message by a direct get; ok is false
// when the answer is not a message.
func (b *Bucket) directRead(ctx context.Context, key string) (Entry, bool) {
	ctx, cancel := b.withTimeout(ctx)
	defer cancel()
	msg, err := b.nc.RequestWithContext(ctx, b.dgetSubj+key, nil)
	if err != nil || msg.Header == nil || msg.Header.Get("Status") != "" {
		return Entry{}, false
	}
	seq, err := strconv.ParseUint(msg.Header.Get(jetstream.SequenceHeader), 10, 64)
	if err != nil || seq == 0 {
		return Entry{}, false
	}
	return Entry{Rev: seq, Data: msg.Data, Deleted: isDeleteMarker(msg.Header)}, true
}

// readSeq fetches the message at stream sequence seq from the stream leader
// and returns the KV key it is a message of.
func (b *Bucket) readSeq(ctx context.Context, seq uint64) (string, Entry, error) {
	req, err := json.Marshal(msgGetRequest{Seq: seq})
	if err != nil {
		return "", Entry{}, err
	}
	subject, e, err := b.msgGet(ctx, req)
	if err == nil && e.Rev == 0 {
		return "", Entry{}, errNoMessage
	}
	key, ok := strings.CutPrefix(subject, b.keyPrefix)
	if err == nil && !ok {
		err = fmt.Errorf("message %d is on %s, not a key of the bucket", seq, subject)
	}
	return key, e, err
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
func (b *Bucket) msgGet(ctx context.Context, req []byte) (string, Entry, error) {
	ctx, cancel := b.withTimeout(ctx)
	defer cancel()
	msg, err := b.nc.RequestWithContext(ctx, b.getSubj, req)
	if err != nil {
		return "", Entry{}, fmt.Errorf("leader read: %w", err)
	}
	var resp msgGetResponse
	if err := json.Unmarshal(msg.Data, &resp); err != nil {
		return "", Entry{}, fmt.Errorf("leader read: decode response: %w", err)
	}
	if resp.Error != nil {
		if resp.Error.ErrorCode == jetstream.JSErrCodeMessageNotFound {
			return "", Entry{}, nil
		}
		return "", Entry{}, fmt.Errorf("leader read: %w", resp.Error)
	}
	if resp.Message == nil {
		return "", Entry{}, fmt.Errorf("leader read: %w", jetstream.ErrInvalidJetStreamResponse)
	}
	e := Entry{Rev: resp.Message.Sequence, Data: resp.Message.Data}
	if len(resp.Message.Header) > 0 {
		hdr, err := nats.DecodeHeadersMsg(resp.Message.Header)
		if err != nil {
			return "", Entry{}, fmt.Errorf("leader read: decode headers: %w", err)
		}
		e.Deleted = isDeleteMarker(hdr)
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
