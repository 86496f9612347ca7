package dedup_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/internal/natstest"
	"github.com/idemgate/idemgate/pkg/audit"
	"github.com/idemgate/idemgate/pkg/dedup"
	"github.com/idemgate/idemgate/pkg/intent"
)

// A ledger WithReceipts signs every final outcome it writes — a
// completion, a failure, a denial, a resolution — and keeps the signature,
// from which a record read back gives the receipt as it was made; answers
// carry it, and it verifies; records that are not final carry none.
func TestReceipts(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	js := jetStream(t, natstest.RunServer(t).ClientURL())
	_, err := dedup.EnsureBucket(ctx, js, dedup.BucketConfig{Bucket: "RECEIPTS"})
	require.NoError(t, err)
	signer, err := audit.GenerateSigner()
	require.NoError(t, err)
	keys, err := audit.NewKeySet(signer.Public("w1", time.Now().Add(-time.Hour)))
	require.NoError(t, err)
	batch := audit.NewBatchSigner(signer)
	var n atomic.Int32
	l, err := dedup.Open(ctx, js, dedup.BucketConfig{Bucket: "RECEIPTS"}, dedup.Bind(), dedup.WithReceipts("w1", func(_ context.Context, ev audit.Event) (json.RawMessage, audit.Signature) {
		require.True(t, ev.Status.Final())
		require.False(t, ev.At.IsZero())
		n.Add(1)
		return batch.SignSealed(ev)
	}))
	require.NoError(t, err)
	defer l.Close()
	// stored checks that the record of key keeps its receipt as its
	// signature, and gives back rec's receipt, which verifies for its
	// answer.
	stored := func(key string, rec dedup.Record) {
		t.Helper()
		got, _, err := l.Get(ctx, key)
		require.NoError(t, err)
		require.Empty(t, got.Receipt, "the receipt is not stored whole")
		require.NotNil(t, got.Signature)
		require.Equal(t, string(rec.Receipt), string(got.SignedReceipt()), "rebuilt as made")
		res := got.Answer(dedup.Caller{Key: key, Fingerprint: got.Fingerprint}, true)
		require.Equal(t, string(rec.Receipt), string(res.Receipt), "a replay carries it")
		_, err = audit.VerifyReceipt(res, keys)
		require.NoError(t, err)
	}

	claim := func(key string) *dedup.Lease {
		c, err := l.Claim(ctx, dedup.ClaimRequest{Key: key, Fingerprint: "fp", Holder: "w2", Tool: "test", Session: "s1"})
		require.NoError(t, err)
		require.Equal(t, dedup.Acquired, c.Outcome)
		require.Empty(t, c.Record.Receipt)
		return c.Lease
	}
	done := claim(keyFor(t, "done"))
	require.NoError(t, done.Extend(ctx, time.Minute))
	require.Empty(t, done.Record().Receipt)
	rec, err := done.Complete(ctx, json.RawMessage(`{"ok":true}`), 1)
	require.NoError(t, err)
	ev, err := audit.VerifyEvent(rec.Receipt, keys)
	require.NoError(t, err)
	require.Equal(t, []any{audit.KindOutcome, keyFor(t, "done"), "w1", "s1", intent.StatusCompleted, 1},
		[]any{ev.Kind, ev.Key, ev.Holder, ev.Session, ev.Status, ev.Attempts}, "written by the ledger's writer")
	stored(keyFor(t, "done"), rec)
	got, _, err := l.Get(ctx, keyFor(t, "done"))
	require.NoError(t, err)
	conflict := got.Answer(dedup.Caller{Key: keyFor(t, "done"), Fingerprint: "other"}, false)
	require.Equal(t, intent.StatusConflict, conflict.Status)
	require.Empty(t, conflict.Receipt, "another operation's receipt is not the conflict's")

	failed := claim(keyFor(t, "failed"))
	rec, err = failed.Fail(ctx, intent.Error{Code: intent.CodeEffectFailed, Message: "no"}, 1)
	require.NoError(t, err)
	require.Contains(t, string(rec.Receipt), `"status":"failed"`)
	stored(keyFor(t, "failed"), rec)

	parked := claim(keyFor(t, "denied"))
	rec, err = parked.AwaitApproval(ctx, json.RawMessage(`{"tool":"test","args":{}}`))
	require.NoError(t, err)
	require.Empty(t, rec.Receipt)
	require.Empty(t, rec.Answer(dedup.Caller{Key: keyFor(t, "denied")}, false).Receipt)
	rec, _, err = l.Deny(ctx, keyFor(t, "denied"), "ops", "no")
	require.NoError(t, err)
	require.Contains(t, string(rec.Receipt), `"status":"denied"`)
	require.Contains(t, string(rec.Receipt), `"by":"ops"`)
	stored(keyFor(t, "denied"), rec)
	before := n.Load()
	again, _, err := l.Deny(ctx, keyFor(t, "denied"), "ops", "no")
	require.NoError(t, err)
	require.Equal(t, before, n.Load(), "a decision that changes nothing signs nothing")
	require.Equal(t, string(rec.Receipt), string(again.SignedReceipt()))

	approved := claim(keyFor(t, "approved"))
	_, err = approved.AwaitApproval(ctx, json.RawMessage(`{"tool":"test","args":{}}`))
	require.NoError(t, err)
	rec, _, err = l.Approve(ctx, keyFor(t, "approved"), "fp", "ops", "", time.Hour)
	require.NoError(t, err)
	require.Empty(t, rec.Receipt, "an approval is not an outcome")
}

// A record that stores its receipt whole (the signature with it left out)
// answers with it as it is; a malformed signature gives no receipt, never
// a wrong one.
func TestStoredReceipts(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 12, 3, 7, 0, 0, 123456789, time.UTC)
	whole := dedup.Record{Status: intent.StatusCompleted, Fingerprint: "fp", Holder: "w1", Attempt: 1, Attempts: 1,
		CompletedAt: at, Receipt: json.RawMessage(`{"kind":"outcome","sig":"c2ln"}`)}
	require.JSONEq(t, string(whole.Receipt), string(whole.Answer(dedup.Caller{Key: "k"}, true).Receipt))

	bad := whole
	bad.Receipt = nil
	for _, proof := range []string{
		"not base64!",
		base64.RawURLEncoding.EncodeToString(append([]byte{'X'}, make([]byte, 32)...)), // a side neither L nor R
		base64.RawURLEncoding.EncodeToString(append([]byte{'L'}, make([]byte, 31)...)), // a step cut short
	} {
		bad.Signature = &dedup.Signature{Key: "k", Signer: "id", Sig: "c2ln", Proof: proof}
		require.Empty(t, bad.SignedReceipt(), "proof %q", proof)
	}
	bad.Signature.Proof = base64.RawURLEncoding.EncodeToString(append([]byte{'L'}, make([]byte, 32)...))
	require.NotEmpty(t, bad.SignedReceipt(), "a well-formed proof gives a receipt (which then fails to verify)")
	bad.Status = intent.StatusPending
	require.Empty(t, bad.Answer(dedup.Caller{Key: "k"}, false).Receipt, "not final: no receipt")
}
