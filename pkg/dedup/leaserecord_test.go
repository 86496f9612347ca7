package dedup

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/pkg/intent"
)

// A lease gives back exactly the record it was given, in every shape a
// record takes.
func TestLeaseRecordGivesTheRecordBack(t *testing.T) {
	t.Parallel()
	now := time.Now().UTC()
	pending := Record{Status: intent.StatusPending, Tool: "t", Session: "s", Fingerprint: "fp", Holder: "w1",
		LeaseUntil: now.Add(time.Minute), Attempt: 2, Attempts: 1, IntentSeq: 7, CallID: "c",
		Submissions: []string{"a", "b"}, CreatedAt: now.Add(-time.Hour), UpdatedAt: now, RetentionSeconds: 60}
	settled := pending
	settled.Status, settled.Result, settled.CompletedAt = intent.StatusCompleted, json.RawMessage(`{"ok":1}`), now
	settled.Receipt, settled.Signature = json.RawMessage(`{}`), &Signature{Key: "k", Signer: "s", Sig: "x"}
	settled.Error = &intent.Error{Code: "c", Message: "m"}
	parked := pending
	parked.Status, parked.Intent = intent.StatusApproved, json.RawMessage(`{"tool":"t"}`)
	parked.Decision, parked.Probe = &Decision{Op: "approve", By: "op"}, &Probe{At: now, Key: "k", Verdict: "unknown"}
	far := pending
	far.LeaseUntil = time.Date(3000, 1, 1, 0, 0, 0, 0, time.UTC) // beyond Unix nanoseconds
	zoned := pending
	zoned.CreatedAt = now.In(time.FixedZone("x", 3600))
	monotonic := pending
	monotonic.UpdatedAt = time.Now() // with a monotonic reading
	for name, r := range map[string]Record{
		"zero": {}, "pending": pending, "settled": settled, "parked": parked, "far": far, "zoned": zoned, "monotonic": monotonic,
	} {
		lr := leaseRecordOf(r)
		require.Equal(t, r, lr.record(), name)
		require.True(t, lr.record().UpdatedAt == r.UpdatedAt, name) // the same time.Time, not only the same instant
	}
	require.Nil(t, leaseRecordOf(pending).aside, "a pending record keeps nothing aside")
}
