package client

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/pkg/audit"
	"github.com/idemgate/idemgate/pkg/dedup"
	"github.com/idemgate/idemgate/pkg/intent"
)

// An already_done answer carries the receipt of the completion it reports,
// which the client checks as a completed answer's: the answer as a worker
// makes it passes; one with another result, a junk receipt or none is
// refused.
func TestAlreadyDoneReceiptIsChecked(t *testing.T) {
	t.Parallel()
	signer, err := audit.GenerateSigner()
	require.NoError(t, err)
	keys, err := audit.NewKeySet(signer.Public("w1", time.Time{}))
	require.NoError(t, err)
	c := &Client{receiptKeys: keys}

	key := "charge." + strings.Repeat("ab", 32)
	rec := dedup.Record{Status: intent.StatusCompleted, Tool: "charge", Fingerprint: "fp", Holder: "w1", Attempt: 1, Attempts: 1,
		IntentSeq: 5, Result: json.RawMessage(`{"charge":"ch_1"}`), CompletedAt: time.Now().UTC()}
	rec.Receipt = signer.Sign(rec.OutcomeEvent(key, "w1"))
	done := rec.Answer(dedup.Caller{Key: key, Fingerprint: "fp", RejectRepeat: true}, true)
	require.Equal(t, intent.StatusAlreadyDone, done.Status)
	require.NoError(t, c.checkReceipt(&done), "the worker's already_done answer")

	other := done
	other.Result = json.RawMessage(`{"charge":"ch_2"}`)
	require.ErrorIs(t, c.checkReceipt(&other), ErrBadReceipt, "another result")
	junk := done
	junk.Receipt = json.RawMessage(strings.Replace(string(done.Receipt), `"sig":"`, `"sig":"A`, 1))
	require.ErrorIs(t, c.checkReceipt(&junk), ErrBadReceipt, "a junk receipt")
	none := done
	none.Receipt = nil
	require.ErrorIs(t, c.checkReceipt(&none), ErrBadReceipt, "no receipt")
}

// A pushed answer is checked as its text came: one whose text repeats a
// member name (which decoding merges) is refused, though the answer it
// decodes to carries a receipt that holds.
func TestPushedAnswerTextIsChecked(t *testing.T) {
	t.Parallel()
	signer, err := audit.GenerateSigner()
	require.NoError(t, err)
	keys, err := audit.NewKeySet(signer.Public("w1", time.Time{}))
	require.NoError(t, err)
	key := "charge." + strings.Repeat("ab", 32)
	rec := dedup.Record{Status: intent.StatusCompleted, Tool: "charge", Fingerprint: "fp", Holder: "w1", Attempt: 1, Attempts: 1,
		IntentSeq: 5, Result: json.RawMessage(`{"charge":"ch_1"}`), CompletedAt: time.Now().UTC()}
	rec.Receipt = signer.Sign(rec.OutcomeEvent(key, "w1"))
	good, err := json.Marshal(rec.Answer(dedup.Caller{Key: key, Fingerprint: "fp"}, false))
	require.NoError(t, err)
	repeated := []byte(strings.Replace(string(good), `"status":"completed"`, `"status":"failed","status":"completed"`, 1))
	for _, c := range []struct {
		name string
		data []byte
		bad  bool
	}{{"as the worker wrote it", good, false}, {"a member name repeated", repeated, true}} {
		s := &Submission{Key: key, Fingerprint: "fp", c: &Client{receiptKeys: keys}, own: []uint64{5}}
		m := nats.NewMsg("_INBOX.x")
		m.Header.Set(intent.HeaderIntentSeq, "5")
		m.Data = c.data
		res, ok := s.pushed(m)
		require.True(t, ok, c.name)
		_, err := s.verified(res, nil)
		if c.bad {
			require.ErrorIs(t, err, ErrBadReceipt, c.name)
			require.ErrorIs(t, err, audit.ErrInvalid, c.name)
		} else {
			require.NoError(t, err, c.name)
		}
	}
}
