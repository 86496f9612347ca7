package worker

import (
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
)

// verb is what the consumer is told about one intent message.
type verb int

const (
	verbAck  verb = iota // handled: answered and recorded; remove from the work stream
	verbNak              // not handled now: deliver again after delay
	verbTerm             // bad input: never deliver again
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
// keeps the message with InProgress while it runs (see keepAlive); a panic is
// recovered by the caller and settled as a nak.
func (w *Worker) settle(msg jetstream.Msg, v verdict) {
	var err error
	switch v.verb {
	case verbAck:
		err = msg.Ack()
	case verbNak:
		err = msg.NakWithDelay(v.delay)
	case verbTerm:
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
