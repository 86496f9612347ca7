package worker

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/idemgate/idemgate/pkg/effects"
	"github.com/idemgate/idemgate/pkg/intent"
)

// outcomeKind is what one firing of an effect comes to.
type outcomeKind int

const (
	// outcomeDone: the effect happened; its result is the operation's.
	outcomeDone outcomeKind = iota + 1
	// outcomeFailed: the effect failed permanently, or transiently at the
	// consumer's last delivery: the failure is the operation's outcome.
	outcomeFailed
	// outcomeTransient: try again later, with the same key.
	outcomeTransient
)

// outcome is the one sorting of what an effect returned, for the ledger
// path (fire) and the direct path (direct) alike.
type outcome struct {
	kind   outcomeKind
	result json.RawMessage // outcomeDone
	err    intent.Error    // outcomeFailed: as recorded and answered, its message bounded
	cause  error           // outcomeFailed, outcomeTransient: what the effect returned
}

// outcomeOf sorts the return of j's effect and counts it.
func (w *Worker) outcomeOf(j *job, result json.RawMessage, err error) outcome {
	var pe *effects.PermanentError
	switch {
	case err == nil:
		return outcome{kind: outcomeDone, result: result}
	case errors.As(err, &pe):
		w.m.failures.WithLabelValues(j.env.Tool, "permanent").Inc()
		return outcome{kind: outcomeFailed, err: pe.IntentError(), cause: err}
	case w.lastDelivery(j):
		w.m.failures.WithLabelValues(j.env.Tool, "transient").Inc()
		return outcome{kind: outcomeFailed, cause: err, err: intent.Error{
			Code:    intent.CodeEffectFailed,
			Message: effects.TruncateMessage(fmt.Sprintf("gave up after %d deliveries: %v", j.meta.NumDelivered, err), effects.MaxErrorMessage),
		}}
	default:
		w.m.failures.WithLabelValues(j.env.Tool, "transient").Inc()
		return outcome{kind: outcomeTransient, cause: err}
	}
}
