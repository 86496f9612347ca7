package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemgate/idemgate/pkg/intent"
)

// Decide publishes a decision (an operator's intent.ControlApprove,
// ControlDeny, ControlResolve or ControlProbe; a user's ControlUserApprove
// or ControlUserDeny) on its control subject and waits for the
// worker's answer: for an approval, the result of the firing it let happen;
// for the others, the operation's new state. A decision that does not apply
// (no such key, wrong state, other arguments) is answered with status
// rejected and an error code, not returned as an error. Only an answer bound
// to the decision's own message (its Idem-Intent-Seq header, the sequence
// the decision's PubAck gave, docs/protocol.md 7.1) counts: every other
// message on the inbox is dropped.
func (c *Client) Decide(ctx context.Context, op string, d intent.Control) (*intent.Result, error) {
	data, err := json.Marshal(d)
	if err != nil {
		return nil, fmt.Errorf("client: encode decision: %w", err)
	}
	if _, err := intent.DecodeControl(op, data); err != nil {
		return nil, fmt.Errorf("client: %w", err)
	}
	ch := make(chan *nats.Msg, inboxBuffer)
	inbox := c.nc.NewRespInbox()
	sub, err := c.nc.ChanSubscribe(inbox, ch)
	if err != nil {
		return nil, fmt.Errorf("client: subscribe %s: %w", inbox, err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	msg := nats.NewMsg(c.names.ControlSubject(op))
	msg.Data = data
	msg.Header.Set(intent.HeaderReplyTo, inbox)
	ack, err := c.js.PublishMsg(ctx, msg)
	if err != nil {
		return nil, fmt.Errorf("client: publish %s: %w", msg.Subject, err)
	}
	want := strconv.FormatUint(ack.Sequence, 10)
	for {
		select {
		case m := <-ch:
			if m.Header.Get(intent.HeaderIntentSeq) != want {
				continue // not the answer to this decision
			}
			var res intent.Result
			if err := json.Unmarshal(m.Data, &res); err != nil {
				continue
			}
			return &res, c.checkReceipt(&res)
		case <-ctx.Done():
			return nil, fmt.Errorf("%w to %s of %s: %w", ErrNoAnswer, op, d.Key, ctx.Err())
		}
	}
}

// DeadLetter is an intent in the dead-letter stream.
type DeadLetter struct {
	Seq       uint64          `json:"seq"`        // its sequence in the dead-letter stream
	Subject   string          `json:"subject"`    // the subject it was published on
	Reason    string          `json:"reason"`     // why it was dead-lettered
	StreamSeq uint64          `json:"stream_seq"` // its sequence in the work stream
	Delivered uint64          `json:"delivered"`  // how many times it was delivered
	Time      time.Time       `json:"time"`       // when it was dead-lettered
	Headers   nats.Header     `json:"headers,omitempty"`
	Data      json.RawMessage `json:"data,omitempty"` // the payload, when it is JSON
	Raw       string          `json:"raw,omitempty"`  // the payload, when it is not
}

func deadLetterOf(m *jetstream.RawStreamMsg) DeadLetter {
	d := DeadLetter{Seq: m.Sequence, Subject: m.Header.Get(intent.HeaderDLQSubject), Reason: m.Header.Get(intent.HeaderDLQReason)}
	d.StreamSeq, _ = strconv.ParseUint(m.Header.Get(intent.HeaderDLQStreamSeq), 10, 64)
	d.Delivered, _ = strconv.ParseUint(m.Header.Get(intent.HeaderDLQDelivered), 10, 64)
	d.Time, _ = time.Parse(time.RFC3339Nano, m.Header.Get(intent.HeaderDLQTime))
	d.Headers = nats.Header{}
	for k, vs := range m.Header {
		if !strings.HasPrefix(k, "Idem-Dlq-") {
			d.Headers[k] = vs
		}
	}
	if json.Valid(m.Data) {
		d.Data = m.Data
	} else {
		d.Raw = string(m.Data)
	}
	return d
}

// DeadLetters lists the dead-letter stream, oldest first, at most limit
// (0: all).
func (c *Client) DeadLetters(ctx context.Context, limit int) ([]DeadLetter, error) {
	s, err := c.js.Stream(ctx, c.names.DLQStream)
	if err != nil {
		return nil, fmt.Errorf("client: dead-letter stream %s: %w", c.names.DLQStream, err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("client: dead-letter stream: %w", err)
	}
	var out []DeadLetter
	for seq := info.State.FirstSeq; seq > 0 && seq <= info.State.LastSeq; seq++ {
		if limit > 0 && len(out) >= limit {
			break
		}
		m, err := s.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue // replayed and removed
		}
		if err != nil {
			return out, fmt.Errorf("client: dead letter %d: %w", seq, err)
		}
		out = append(out, deadLetterOf(m))
	}
	return out, nil
}

// ReplayDeadLetter publishes dead letter seq again on its original subject,
// with its original headers (an intent's Nats-Msg-Id is not restored: the
// ledger, not publish dedup, decides whether it fires), then removes it from
// the dead-letter stream. It returns the new sequence in the work stream.
func (c *Client) ReplayDeadLetter(ctx context.Context, seq uint64) (uint64, error) {
	s, err := c.js.Stream(ctx, c.names.DLQStream)
	if err != nil {
		return 0, fmt.Errorf("client: dead-letter stream %s: %w", c.names.DLQStream, err)
	}
	m, err := s.GetMsg(ctx, seq)
	if err != nil {
		return 0, fmt.Errorf("client: dead letter %d: %w", seq, err)
	}
	d := deadLetterOf(m)
	if d.Subject == "" {
		return 0, fmt.Errorf("client: dead letter %d has no original subject", seq)
	}
	out := nats.NewMsg(d.Subject)
	out.Data = m.Data
	for k, vs := range d.Headers {
		out.Header[k] = vs
	}
	ack, err := c.js.PublishMsg(ctx, out)
	if err != nil {
		return 0, fmt.Errorf("client: replay dead letter %d to %s: %w", seq, d.Subject, err)
	}
	if err := s.DeleteMsg(ctx, seq); err != nil {
		return ack.Sequence, fmt.Errorf("client: replayed dead letter %d (now %d) but could not remove it: %w", seq, ack.Sequence, err)
	}
	return ack.Sequence, nil
}
