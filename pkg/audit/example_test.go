package audit_test

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/idemgate/idemgate/pkg/audit"
	"github.com/idemgate/idemgate/pkg/intent"
)

// A worker signs the outcome it records; whoever holds its public key
// verifies the receipt against the answer, and only that answer.
func Example() {
	signer, _ := audit.GenerateSigner()
	keys, _ := audit.NewKeySet(signer.Public("worker-1", time.Time{}))

	result := json.RawMessage(`{"charge":"ch_1"}`)
	at := time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)
	answer := intent.Result{Key: "charge.0123", Tool: "charge", Status: intent.StatusCompleted, Fingerprint: "f0", Attempts: 1, IntentSeq: 42,
		Result: result, CompletedAt: at}
	answer.Receipt = signer.Sign(audit.Outcome(answer.Key, "charge", "", "f0", intent.StatusCompleted, result, nil, 1, 42, at))

	ev, err := audit.VerifyReceipt(answer, keys)
	fmt.Println(ev.Kind, ev.Status, err)

	answer.Result = json.RawMessage(`{"charge":"ch_2"}`)
	_, err = audit.VerifyReceipt(answer, keys)
	fmt.Println(err != nil)
	// Output:
	// outcome completed <nil>
	// true
}
