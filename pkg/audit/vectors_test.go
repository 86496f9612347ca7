package audit

import (
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/pkg/intent"
)

var update = flag.Bool("update", false, "write testdata/receipts.json anew")

// receiptVectors is testdata/receipts.json: answers with their receipts
// and what verifying each with keys comes to, for the clients in other
// languages to check themselves against.
type receiptVectors struct {
	Comment string          `json:"comment"`
	Keys    json.RawMessage `json:"keys"`
	Cases   []receiptCase   `json:"cases"`
}

type receiptCase struct {
	Name   string          `json:"name"`
	Answer json.RawMessage `json:"answer"`
	// Error is "" when the receipt verifies, else the kind of failure:
	// no_receipt, bad_signature, unknown_signer, key_not_valid, mismatch.
	Error string `json:"error"`
}

const vectorsFile = "testdata/receipts.json"

// vectorSigner is a key made from a fixed seed: Ed25519 signs
// deterministically, so the vectors are the same each time.
func vectorSigner(t *testing.T, seed byte) *Signer {
	t.Helper()
	b := make([]byte, ed25519.SeedSize)
	for i := range b {
		b[i] = seed + byte(i)
	}
	s, err := NewSigner(ed25519.NewKeyFromSeed(b))
	require.NoError(t, err)
	return s
}

func buildVectors(t *testing.T) receiptVectors {
	t.Helper()
	s, stranger := vectorSigner(t, 1), vectorSigner(t, 101)
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := time.Date(2026, 3, 4, 5, 6, 7, 123456789, time.UTC)
	keys, err := NewKeySet(s.Public("worker-1", t0))
	require.NoError(t, err)
	keysJSON, err := json.Marshal(keys)
	require.NoError(t, err)

	key := "charge." + strings.Repeat("0123456789abcdef", 4)
	fp := strings.Repeat("f0", 32)
	result := json.RawMessage(`{"charge":"ch_1","amount":500,"ratio":1.5e-7,"big":9007199254740991,"whole":100.0,"note":"é☃ \"q\" <b>"}`)
	completed := intent.Result{Key: key, Tool: "charge", Status: intent.StatusCompleted, Fingerprint: fp, Attempts: 1, Result: result,
		CompletedAt: at}
	outcome := func(r intent.Result) Event {
		return Outcome(r.Key, r.Tool, "run-7", r.Fingerprint, r.Status, r.Result, r.Error, r.Attempts, 42, at)
	}
	var cases []receiptCase
	add := func(name string, r intent.Result, errKind string) {
		data, err := json.Marshal(r)
		require.NoError(t, err)
		cases = append(cases, receiptCase{Name: name, Answer: data, Error: errKind})
	}
	withReceipt := func(r intent.Result, receipt json.RawMessage) intent.Result {
		r.Receipt = receipt
		return r
	}

	add("completed, signed alone", withReceipt(completed, s.Sign(outcome(completed))), "")
	batch := make([]Event, 5)
	for i := range batch {
		r := completed
		r.Key = "charge." + strings.Repeat(string("0123456789"[i]), 64)
		batch[i] = outcome(r)
	}
	batch[3] = outcome(completed)
	add("completed, signed in a batch of five", withReceipt(completed, s.SignBatch(batch)[3]), "")

	failed := completed
	failed.Status, failed.Result, failed.Error = intent.StatusFailed, nil, &intent.Error{Code: intent.CodeEffectFailed, Message: "card declined: «insufficient funds»"}
	add("failed", withReceipt(failed, s.Sign(outcome(failed))), "")

	denied := completed
	denied.Status, denied.Result, denied.Error = intent.StatusDenied, nil, &intent.Error{Code: intent.CodeDenied, Message: "denied by ops: fraud"}
	dev := outcome(denied)
	dev.Op, dev.By, dev.Reason = intent.ControlDeny, "ops", "fraud"
	add("denied by an operator", withReceipt(denied, s.Sign(dev)), "")

	conflict := intent.Result{Key: key, Tool: "charge", Status: intent.StatusConflict, Fingerprint: strings.Repeat("0a", 32), RecordFingerprint: fp,
		Error: &intent.Error{Code: intent.CodeConflict, Message: "key was first used with other arguments"}, CompletedAt: at}
	cev := Event{Kind: KindConflict, Key: key, Tool: "charge", Fingerprint: conflict.Fingerprint, RecordFingerprint: fp, Status: intent.StatusConflict,
		ErrorCode: intent.CodeConflict, ErrorDigest: ErrorDigest(*conflict.Error), Holder: "worker-1", IntentSeq: 43, At: at}
	add("conflict", withReceipt(conflict, s.Sign(cev)), "")

	compact, err := intent.LedgerKey(key, intent.LayoutCompact)
	require.NoError(t, err)
	byCompact := outcome(completed)
	byCompact.Key = compact
	add("completed, its receipt naming the compact ledger key", withReceipt(completed, s.Sign(byCompact)), "")

	big := completed
	big.Result = json.RawMessage(`{"id":12345678901234567890}`)
	add("a result with no canonical form, unbound", withReceipt(big, s.Sign(outcome(big))), "")

	nullResult := completed
	nullResult.Result = json.RawMessage(`null`)
	add("a null result", withReceipt(nullResult, s.Sign(outcome(nullResult))), "")

	other := completed
	other.Key = "charge." + strings.Repeat("9", 64)
	add("another operation's receipt", withReceipt(completed, s.Sign(outcome(other))), "mismatch")
	changed := withReceipt(completed, s.Sign(outcome(completed)))
	changed.Result = json.RawMessage(`{"charge":"ch_1","amount":5000,"ratio":1.5e-7,"big":9007199254740991,"whole":100.0,"note":"é☃ \"q\" <b>"}`)
	add("the result changed", changed, "mismatch")
	otherStatus := withReceipt(failed, s.Sign(outcome(completed)))
	add("a completion's receipt on a failure", otherStatus, "mismatch")
	edited := withReceipt(completed, json.RawMessage(strings.Replace(string(s.Sign(outcome(completed))), `"attempts":1`, `"attempts":2`, 1)))
	edited.Attempts = 2
	add("a signed member changed", edited, "bad_signature")
	add("a proof step changed", withReceipt(completed, json.RawMessage(fixStep(string(s.SignBatch(batch)[3])))), "bad_signature")
	add("signed by a key not given", withReceipt(completed, stranger.Sign(outcome(completed))), "unknown_signer")
	early := completed
	eev := outcome(early)
	eev.At = t0.Add(-time.Second)
	add("signed before the key's not_before", withReceipt(early, s.Sign(eev)), "key_not_valid")
	add("a completion without a receipt", completed, "no_receipt")

	return receiptVectors{
		Comment: "Receipts and what verifying each with keys comes to (docs/audit.md). Written by go test ./pkg/audit -run TestReceiptVectors -update.",
		Keys:    keysJSON, Cases: cases,
	}
}

// fixStep makes the first proof step of a receipt differ in one hex digit.
func fixStep(receipt string) string {
	i := strings.Index(receipt, `"proof":["`) + len(`"proof":["`) + 1
	c := receipt[i]
	n := byte('0')
	if c == '0' {
		n = '1'
	}
	return receipt[:i] + string(n) + receipt[i+1:]
}

// The receipt vectors verify in Go as the file says; other languages'
// clients check themselves against the same file.
func TestReceiptVectors(t *testing.T) {
	t.Parallel()
	if *update {
		data, err := json.MarshalIndent(buildVectors(t), "", "  ")
		require.NoError(t, err)
		require.NoError(t, os.MkdirAll(filepath.Dir(vectorsFile), 0o755))
		require.NoError(t, os.WriteFile(vectorsFile, append(data, '\n'), 0o644))
	}
	data, err := os.ReadFile(vectorsFile)
	require.NoError(t, err)
	var v receiptVectors
	require.NoError(t, json.Unmarshal(data, &v))
	keys, err := ParseKeys(v.Keys)
	require.NoError(t, err)
	require.GreaterOrEqual(t, len(v.Cases), 15)
	kinds := map[string]error{"no_receipt": ErrNoReceipt, "bad_signature": ErrBadSignature, "unknown_signer": ErrUnknownSigner,
		"key_not_valid": ErrKeyNotValid, "mismatch": ErrReceiptMismatch}
	for _, c := range v.Cases {
		var res intent.Result
		require.NoError(t, json.Unmarshal(c.Answer, &res), c.Name)
		_, err := VerifyReceipt(res, keys)
		if c.Error == "" {
			require.NoError(t, err, c.Name)
			continue
		}
		require.Error(t, err, c.Name)
		require.True(t, errors.Is(err, kinds[c.Error]), "%s: %v, want %s", c.Name, err, c.Error)
	}
}
