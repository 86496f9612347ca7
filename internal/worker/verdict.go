package worker

import (
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
	// waited marks a nak of an intent that only waited (for its tool's
	// cap, another holder, the ledger) and tried nothing: it never ends
	// the intent at its last delivery (see letter).
	waited bool
}

func ack() verdict               { return verdict{verb: verbAck} }
func term(reason string) verdict { return verdict{verb: verbTerm, reason: reason} }
func nak(delay time.Duration, reason string) verdict {
	return verdict{verb: verbNak, delay: delay, reason: reason}
}

// requeue is a nak of an intent that waited and tried nothing — the
// worker stopping while it waited, a holder still in flight: its
// redelivery is back-pressure, not a try, and it never ends the intent.
func requeue(delay time.Duration, reason string) verdict {
	return verdict{verb: verbNak, delay: delay, reason: reason, waited: true}
}

// settle is the one place where outcomes become JetStream verbs (finish
// calls it once letter has sealed the verdict). Long work keeps the message
// with InProgress while it runs (see heartbeats.hold and guard); a panic is
// recovered (rescue) and settled as a nak.
func (w *Worker) settle(j *job, v verdict) {
	var err error
	switch v.verb {
	case verbAck:
		err = j.msg.Ack()
	case verbNak:
		err = j.msg.NakWithDelay(v.delay)
	case verbTerm:
		err = j.msg.TermWithReason(v.reason)
	}
	if err != nil && j.meta != nil {
		// The message is redelivered after AckWait; the ledger makes that safe.
		w.log.Warn("settle intent", zap.Stringer("verb", v.verb), zap.String("subject", j.msg.Subject()), zap.Error(err))
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
