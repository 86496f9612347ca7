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
	// permanent marks an outcomeFailed the effect reported permanent
	// (effects.PermanentError), not transient at the last delivery.
	permanent bool
}

// outcomeOf sorts the return of j's effect.
func (w *Worker) outcomeOf(j *job, result json.RawMessage, err error) outcome {
	var pe *effects.PermanentError
	switch {
	case err == nil:
		return outcome{kind: outcomeDone, result: result}
	case errors.As(err, &pe):
		return outcome{kind: outcomeFailed, err: pe.IntentError(), cause: err, permanent: true}
	case w.lastDelivery(j):
		return outcome{kind: outcomeFailed, cause: err, err: intent.Error{
			Code:    intent.CodeEffectFailed,
			Message: effects.TruncateMessage(fmt.Sprintf("gave up after %d deliveries: %v", j.meta.NumDelivered, err), effects.MaxErrorMessage),
		}}
	default:
		return outcome{kind: outcomeTransient, cause: err}
	}
}
