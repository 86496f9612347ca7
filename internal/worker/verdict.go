package worker

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
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
// keeps the message with InProgress while it runs (see heartbeats.hold and guard); a panic is
// recovered by the caller and settled as a nak.
func (w *Worker) settle(msg jetstream.Msg, v verdict) {
	meta, _ := msg.Metadata()
	last := meta != nil && meta.NumDelivered >= uint64(w.cfg.MaxDeliver)
	if v.verb == verbNak && last {
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
		var seq, delivered uint64
		if meta != nil {
			seq, delivered = meta.Sequence.Stream, meta.NumDelivered
		}
		if derr := w.deadLetter(context.Background(), msg.Subject(), msg.Headers(), msg.Data(), seq, delivered, v.reason); derr != nil {
			// Never drop it: leave it to redelivery (or, at the last
			// delivery, to the max-deliveries advisory).
			w.log.Error("dead-letter; leaving the intent to redelivery", zap.String("subject", msg.Subject()), zap.Error(derr))
			err = msg.NakWithDelay(w.cfg.RetryDelay)
			break
		}
		w.m.deadLetters.WithLabelValues(w.m.tool(w.res.names.ToolFromSubject(msg.Subject()))).Inc()
		err = msg.TermWithReason(v.reason)
	}
	if err != nil {
		// The message is redelivered after AckWait; the ledger makes that safe.
		w.log.Warn("settle intent", zap.Stringer("verb", v.verb), zap.String("subject", msg.Subject()), zap.Error(err))
	}
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
