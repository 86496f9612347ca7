package worker

import (
	"context"
	"fmt"
	"time"

	"github.com/idemgate/idemgate/pkg/intent"
	"go.uber.org/zap"
)

// verb is what the consumer is told about one intent message.
type verb int

const (
	verbAck  verb = iota // handled: answered and recorded; remove from the work stream
	verbNak              // not handled now: deliver again after delay
	verbTerm             // bad input, or out of deliveries: dead-letter, never deliver again
)

func (v verb) String() string {
	switch v {
	case verbAck:
		return "ack"
	case verbNak:
		return "nak"
	case verbTerm:
		return "term"
	}
	return "unknown"
}

// verdict is the outcome of handling one intent, as the consumer sees it.
type verdict struct {
	verb   verb
	delay  time.Duration // verbNak: redelivery delay
	reason string        // verbTerm, verbNak: why, for the server's advisory and the log
}

func ack() verdict               { return verdict{verb: verbAck} }
func term(reason string) verdict { return verdict{verb: verbTerm, reason: reason} }
func nak(delay time.Duration, reason string) verdict {
	return verdict{verb: verbNak, delay: delay, reason: reason}
}

// settle is the one place where outcomes become JetStream verbs. Long work
// keeps the message with InProgress while it runs (see heartbeats.hold and
// guard); a panic is recovered by the caller and settled as a nak. Every
// path that ends an intent answers it: an intent dead-lettered before it was
// answered (out of deliveries) is answered dead_lettered, so its caller may
// retry the operation under the same key.
func (w *Worker) settle(j *job, v verdict) {
	msg, meta := j.msg, j.meta
	if v.verb == verbNak && meta.NumDelivered >= uint64(w.cfg.MaxDeliver) {
		// Not delivered again by the server: dead-letter it rather than
		// leave it in the work stream unanswered.
		v = term(fmt.Sprintf("max deliveries (%d) reached: %s", meta.NumDelivered, v.reason))
	}
	var err error
	switch v.verb {
	case verbAck:
		err = msg.Ack()
	case verbNak:
		err = msg.NakWithDelay(v.delay)
	case verbTerm:
		if derr := w.deadLetter(context.Background(), msg.Subject(), msg.Headers(), msg.Data(), meta.Sequence.Stream, meta.NumDelivered, meta.Timestamp, v.reason); derr != nil {
			// Never drop it: leave it to redelivery (past the last
			// delivery, the next worker dead-letters it again).
			w.log.Error("dead-letter; leaving the intent to redelivery", zap.String("subject", msg.Subject()), zap.Error(derr))
			err = msg.NakWithDelay(w.cfg.RetryDelay)
			break
		}
		w.m.deadLetters.WithLabelValues(w.m.tool(w.res.names.ToolFromSubject(msg.Subject()))).Inc()
		if !j.answered {
			w.answer(j, deadLettered(j.id, j.env, meta.NumDelivered, v.reason))
		}
		err = msg.TermWithReason(v.reason)
	}
	if err != nil {
		// The message is redelivered after AckWait; the ledger makes that safe.
		w.log.Warn("settle intent", zap.Stringer("verb", v.verb), zap.String("subject", msg.Subject()), zap.Error(err))
	}
}

// deadLettered is the answer to the caller of an intent (env, derived as
// id where it was) dead-lettered before it was answered: nothing is recorded
// for it, and the operation may be retried with the same key (a retry that
// is a publish duplicate is published again under a fresh message id:
// docs/protocol.md). Its identity is the worker's derivation, or none.
func deadLettered(id intent.Identity, env *intent.Envelope, delivered uint64, reason string) intent.Result {
	res := intent.Rejected(intent.CodeDeadLettered, fmt.Sprintf(
		"the intent was not handled in %d deliveries and was dead-lettered (%s): its operation may be retried with the same key", delivered, reason))
	res.Key, res.Fingerprint = id.Key, id.Fingerprint
	if env != nil {
		res.Tool, res.CallID = env.Tool, env.CallID
	}
	return res
}

// retryDelay is the delay before delivery n+1 of an intent whose effect failed
// transiently: RetryDelay doubled per delivery, capped at MaxRetryDelay.
func (w *Worker) retryDelay(delivered uint64) time.Duration {
	d := w.cfg.RetryDelay
	for i := uint64(1); i < delivered && d < w.cfg.MaxRetryDelay; i++ {
		d *= 2
	}
	return min(d, w.cfg.MaxRetryDelay)
}
