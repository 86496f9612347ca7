package worker

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/idemgate/idemgate/pkg/intent"
)

// letter seals the verdict v that ends j: a nak at the last delivery is a
// term (the server would not deliver it again), and an intent that is
// terminated is copied to the dead-letter stream first. A copy that fails
// leaves the intent to redelivery (a nak): past its last delivery, the next
// worker copies it again. Every path that ends an intent answers it: one
// dead-lettered before it was answered is answered dead_lettered (finish),
// so its caller may retry the operation under the same key.
func (w *Worker) letter(j *job, v verdict) verdict {
	if j.meta == nil {
		return v // not a JetStream message: nowhere to redeliver, nothing to copy
	}
	if v.verb == verbNak && !v.waited && w.lastDelivery(j) {
		v = term(fmt.Sprintf("max deliveries (%d) reached: %s", j.meta.NumDelivered, v.reason))
	}
	if v.verb != verbTerm {
		return v
	}
	msg, meta := j.msg, j.meta
	if err := w.deadLetter(context.Background(), msg.Subject(), msg.Headers(), msg.Data(), meta.Sequence.Stream, meta.NumDelivered, meta.Timestamp, v.reason); err != nil {
		// Never drop it: leave it to redelivery (past the last delivery,
		// the next worker dead-letters it again).
		w.log.Error("dead-letter; leaving the intent to redelivery", zap.String("subject", msg.Subject()), zap.Error(err))
		return nak(w.cfg.RetryDelay, "dead-letter: "+err.Error())
	}
	w.obs.deadLettered(msg.Subject())
	return v
}

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
	if _, err := w.letters.PublishMsg(ctx, out, jetstream.WithMsgID(fmt.Sprintf("dlq-%s-%d", w.res.names.Stream, seq))); err != nil {
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

// overdueFactor times Config.MaxDeliver is how many deliveries an intent
// gets before it is dead-lettered unhandled (overdue).
const overdueFactor = 10

// overdueAfter is the delivery past which an intent is overdue. Deliveries
// past Config.MaxDeliver are served as any other: they were not spent on
// tries — an intent redelivered while it waited (under its tool's cap, for
// a holder; a heartbeat that ran late on a loaded box, a worker that stopped
// or died holding it) tried nothing, and the ledger decides whether it
// fires. A try that fails at or past the last delivery ends it (letter,
// outcome), and so does a record whose tries ran out (triedOut). Only a
// delivery far past them — an intent whose every handling kills its worker
// before it claims — is overdue.
func (w *Worker) overdueAfter() uint64 { return uint64(w.cfg.MaxDeliver) * overdueFactor }

// overdue is an intent delivered past overdueAfter: every worker that had
// it died holding it. The consumer delivers without limit so that such an
// intent comes back to a worker, which dead-letters and answers it,
// whatever became of the others (a server advisory would reach only the
// workers subscribed at that moment, and only once).
func (w *Worker) overdue(j *job) handled {
	j.id, j.env = w.identify(j.msg.Subject(), j.msg.Headers(), j.msg.Data(), j.meta.Timestamp)
	return unanswered(term(fmt.Sprintf("delivered %d times (more than %d) without an answer: every worker that handled it stopped first",
		j.meta.NumDelivered, w.overdueAfter())))
}

// identify derives, as far as it can, the identity of an intent (or
// operator decision) that is dead-lettered without being admitted, so that
// its caller's answer carries the key the caller expects: the worker's
// derivation, else (an unknown tool, an undecodable body) none, and the
// answer falls back to the key its client sent.
func (w *Worker) identify(subject string, h nats.Header, data []byte, published time.Time) (intent.Identity, *intent.Envelope) {
	if op := w.res.names.ControlOp(subject); op != "" {
		if c, err := intent.DecodeControl(op, data); err == nil {
			return intent.Identity{Key: c.Key}, nil
		}
		return intent.Identity{}, nil
	}
	env, err := intent.Decode(data, w.cfg.Limits)
	if err != nil {
		return intent.Identity{}, nil
	}
	var id intent.Identity
	if t, ok := w.tools.Lookup(env.Tool); ok {
		id, _ = intent.Derive(env, t.KeySpec, intentTime(h, published))
	}
	return id, env
}
