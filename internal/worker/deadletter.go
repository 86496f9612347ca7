package worker

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/idemgate/idemgate/pkg/intent"
)

// deadLetter copies an intent to the dead-letter stream with its reason, its
// original subject, headers and delivery count, and waits for the stream's
// acknowledgement. The copy's Nats-Msg-Id is derived from the work stream's
// sequence, so a second copy of the same message (a worker that died between
// copying and terminating) is dropped by the dead-letter stream. published is
// the original's timestamp: the copy keeps it (intent.HeaderIntentTime), so
// that a replay derives the same window key.
func (w *Worker) deadLetter(ctx context.Context, subject string, hdr nats.Header, data []byte, seq, delivered uint64, published time.Time, reason string) error {
	out := nats.NewMsg(w.res.names.DLQSubject(dlqToken(w.res.names, subject)))
	out.Data = data
	for k, vs := range hdr {
		if k == jetstream.MsgIDHeader {
			out.Header[intent.HeaderDLQMsgID] = vs
			continue
		}
		out.Header[k] = vs
	}
	if out.Header.Get(intent.HeaderIntentTime) == "" && !published.IsZero() {
		out.Header.Set(intent.HeaderIntentTime, published.UTC().Format(time.RFC3339Nano))
	}
	out.Header.Set(intent.HeaderDLQReason, reason)
	out.Header.Set(intent.HeaderDLQSubject, subject)
	out.Header.Set(intent.HeaderDLQStreamSeq, strconv.FormatUint(seq, 10))
	out.Header.Set(intent.HeaderDLQDelivered, strconv.FormatUint(delivered, 10))
	out.Header.Set(intent.HeaderDLQTime, time.Now().UTC().Format(time.RFC3339Nano))
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := w.res.js.PublishMsg(ctx, out, jetstream.WithMsgID(fmt.Sprintf("dlq-%s-%d", w.res.names.Stream, seq))); err != nil {
		return fmt.Errorf("dead-letter stream seq %d: %w", seq, err)
	}
	return nil
}

// dlqToken is the tool token of a dead letter's subject: the intent's tool,
// "_control" for operator decisions, "_unknown" for anything else.
func dlqToken(n intent.Names, subject string) string {
	if t := n.ToolFromSubject(subject); intent.ValidTool(t) {
		return t
	}
	if n.ControlOp(subject) != "" {
		return "_control"
	}
	return "_unknown"
}

// maxDeliveriesAdvisory is what the server publishes when a message's last
// delivery went unacknowledged (its worker died holding it).
type maxDeliveriesAdvisory struct {
	Stream     string `json:"stream"`
	Consumer   string `json:"consumer"`
	StreamSeq  uint64 `json:"stream_seq"`
	Deliveries uint64 `json:"deliveries"`
}

// watchMaxDeliveries dead-letters intents whose last delivery was never
// settled: the server keeps such a message in the work stream and tells only
// by an advisory. One worker of the queue group handles each advisory: it
// copies the message to the dead-letter stream, then removes it from the
// work stream.
func (w *Worker) watchMaxDeliveries() (*nats.Subscription, error) {
	subject := fmt.Sprintf("$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.%s.%s", w.res.names.Stream, w.res.names.Consumer)
	sub, err := w.nc.QueueSubscribe(subject, w.res.names.Consumer, func(m *nats.Msg) {
		var adv maxDeliveriesAdvisory
		if err := json.Unmarshal(m.Data, &adv); err != nil || adv.StreamSeq == 0 {
			w.log.Warn("undecodable max-deliveries advisory", zap.ByteString("data", m.Data))
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		raw, err := w.res.stream.GetMsg(ctx, adv.StreamSeq)
		if err != nil {
			w.log.Info("max-deliveries advisory for a message already gone", zap.Uint64("seq", adv.StreamSeq), zap.Error(err))
			return
		}
		reason := fmt.Sprintf("max deliveries (%d) reached without an answer", adv.Deliveries)
		if err := w.deadLetter(ctx, raw.Subject, raw.Header, raw.Data, adv.StreamSeq, adv.Deliveries, raw.Time, reason); err != nil {
			w.log.Error("dead-letter", zap.Uint64("seq", adv.StreamSeq), zap.Error(err))
			return
		}
		w.answerDeadLetter(raw, adv.Deliveries, reason)
		if err := w.res.stream.DeleteMsg(ctx, adv.StreamSeq); err != nil {
			w.log.Warn("remove dead-lettered intent from the work stream", zap.Uint64("seq", adv.StreamSeq), zap.Error(err))
		}
		w.log.Warn("intent dead-lettered", zap.Uint64("seq", adv.StreamSeq), zap.String("reason", reason))
	})
	if err != nil {
		return nil, fmt.Errorf("watch max-deliveries advisories: %w", err)
	}
	return sub, nil
}

// answerDeadLetter answers the caller of raw, an intent the server gave up
// delivering (its last holder died): dead_lettered, with the key the worker
// derives for it, else the one its client sent.
func (w *Worker) answerDeadLetter(raw *jetstream.RawStreamMsg, delivered uint64, reason string) {
	replyTo := raw.Header.Get(intent.HeaderReplyTo)
	if replyTo == "" {
		return
	}
	var id intent.Identity
	var env *intent.Envelope
	if op := w.res.names.ControlOp(raw.Subject); op != "" {
		if c, err := intent.DecodeControl(op, raw.Data); err == nil {
			id.Key = c.Key
		}
	} else if e, err := intent.Decode(raw.Data, w.cfg.Limits); err == nil {
		env = e
		if t, ok := w.tools.Lookup(env.Tool); ok {
			id, _ = intent.Derive(env, t.KeySpec, intentTime(raw.Header, raw.Time))
		}
	}
	w.reply(context.Background(), raw.Subject, replyTo, deadLettered(id, raw.Header, env, delivered, reason))
}
