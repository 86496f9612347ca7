package httpapi

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/pkg/dedup"
	"github.com/idemgate/idemgate/pkg/intent"
)

// A decision refused for the operation's state says who decided it and
// when, else its state and the workers' why, never the ledger's words.
func TestRefusedDetail(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)
	denied := dedup.Record{Status: intent.StatusDenied, Decision: &dedup.Decision{Op: intent.ControlDeny, By: "ops-b", Reason: "fraud", At: at}}
	completed := dedup.Record{Status: intent.StatusCompleted}
	uncertain := dedup.Record{Status: intent.StatusUncertain}
	const prefix = "approve k: dedup: decision does not apply to the record's status: "
	for _, c := range []struct {
		op    string
		after *dedup.Record
		msg   string
		want  string
	}{
		{intent.ControlApprove, &denied, prefix + "denied",
			"Not approved: Denied by ops-b at 2026-03-04T05:06:07Z (“fraud”); the operation is denied. Nothing changed and nothing fired."},
		{intent.ControlApprove, &completed, prefix + "completed, and it never awaited approval",
			"Not approved: the operation is completed, and an approval does not apply to it (completed, and it never awaited approval). Nothing changed."},
		{intent.ControlDeny, &completed, prefix + "completed",
			"Not denied: the operation is completed, and a denial does not apply to it. Nothing changed."},
		{intent.ControlProbe, &uncertain, "probe k: dedup: decision does not apply to the record's status: uncertain, but its tool x has no probe: resolve it by hand",
			"Not probed: the operation is uncertain, and a probe does not apply to it (uncertain, but its tool x has no probe: resolve it by hand). Nothing changed."},
		{intent.ControlResolve, nil, prefix + "completed",
			"Not resolved: the operation's state does not allow it (completed); GET the operation for its record. Nothing changed."},
	} {
		require.Equal(t, c.want, refusedDetail(c.op, c.after, c.msg))
	}
}
