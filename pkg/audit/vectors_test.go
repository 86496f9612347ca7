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
	// AnswerText is, for a case a reader must see as written (a repeated
	// member name, which a JSON parser merges), the answer's JSON text;
	// Answer is then what most parsers make of it.
	AnswerText string `json:"answer_text,omitempty"`
	// Error is "" when the receipt verifies, else the kind of failure:
	// no_receipt, invalid, bad_signature, unknown_signer, key_not_valid,
	// mismatch.
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
	completed := intent.Result{Key: key, Tool: "charge", Status: intent.StatusCompleted, Fingerprint: fp, Attempts: 1, IntentSeq: 42, Attempt: 1,
		Result: result, CompletedAt: at}
	outcome := func(r intent.Result) Event {
		ev := Outcome(r.Key, r.Tool, "run-7", r.Fingerprint, r.Status, r.Result, r.Error, r.Attempts, r.IntentSeq, r.CompletedAt)
		ev.Holder, ev.Attempt = "worker-1", r.Attempt
		return ev
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
		Error: &intent.Error{Code: intent.CodeConflict, Message: "key was first used with other arguments"}, IntentSeq: 43, CompletedAt: at}
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

	// already_done reports a completion: its receipt is the completion's,
	// checked as a completed answer's is (its error, the refusal, unbound).
	done := completed
	done.Status, done.Replayed = intent.StatusAlreadyDone, true
	done.Error = &intent.Error{Code: intent.CodeAlreadyDone, Message: "the operation already ran"}
	add("already_done, with its completion's receipt", withReceipt(done, s.Sign(outcome(completed))), "")
	forged := withReceipt(done, s.Sign(outcome(completed)))
	forged.Result = json.RawMessage(`{"charge":"ch_2"}`)
	add("already_done, another result", forged, "mismatch")
	add("already_done, a receipt of status already_done", withReceipt(done, s.Sign(outcome(done))), "mismatch")
	junk := string(s.Sign(outcome(completed)))
	junk = strings.Replace(junk, sigOf(t, junk), strings.Repeat("A", 86), 1)
	add("already_done, a receipt with a junk signature", withReceipt(done, json.RawMessage(junk)), "bad_signature")
	add("already_done without a receipt", done, "no_receipt")
	otherDone := withReceipt(done, s.Sign(outcome(completed)))
	otherDone.Attempts = 2
	add("already_done, other attempts", otherDone, "mismatch")

	// A receipt binds its run: the intent sequence, the attempt, the time.
	run2 := completed
	run2.IntentSeq, run2.CompletedAt = 77, at.Add(time.Hour)
	add("the receipt of an earlier run of the key", withReceipt(run2, s.Sign(outcome(completed))), "mismatch")
	seq := completed
	seq.IntentSeq = 43
	add("the receipt of another intent", withReceipt(seq, s.Sign(outcome(completed))), "mismatch")
	att := completed
	att.Attempt = 2
	add("the receipt of another attempt", withReceipt(att, s.Sign(outcome(completed))), "mismatch")
	later := completed
	later.CompletedAt = at.Add(time.Nanosecond)
	add("the receipt of another time", withReceipt(later, s.Sign(outcome(completed))), "mismatch")
	zoned := completed
	zoned.CompletedAt = at.In(time.FixedZone("", 2*3600))
	add("completed_at in another zone, the same instant", withReceipt(zoned, s.Sign(outcome(completed))), "")
	otherConflict := withReceipt(conflict, s.Sign(cev))
	otherConflict.IntentSeq = 44
	add("a conflict's receipt on another intent's conflict", otherConflict, "mismatch")

	// One text per receipt, and every member signed.
	signed := string(s.Sign(outcome(completed)))
	add("a receipt with an extra __proto__ member", withReceipt(completed, json.RawMessage(`{"__proto__":{"x":1},`+signed[1:])), "bad_signature")
	sig := sigOf(t, signed)
	i := strings.IndexAny(sig, "-_")
	require.GreaterOrEqual(t, i, 0, "the vector's signature has no - or _")
	plus := sig[:i] + map[byte]string{'-': "+", '_': "/"}[sig[i]] + sig[i+1:]
	add("a sig with + or / for - or _", withReceipt(completed, json.RawMessage(strings.Replace(signed, sig, plus, 1))), "bad_signature")
	add("a sig with a line break", withReceipt(completed, json.RawMessage(strings.Replace(signed, sig, sig[:40]+`\n`+sig[40:], 1))), "bad_signature")
	add("a sig whose unused last bits are set", withReceipt(completed, json.RawMessage(strings.Replace(signed, sig, sig[:85]+lastBitsSet(sig[85]), 1))), "bad_signature")
	batched := string(s.SignBatch(batch)[3])
	stepAt := strings.Index(batched, `"proof":["`) + len(`"proof":["`) + 1
	add("a proof step in upper-case hex", withReceipt(completed, json.RawMessage(batched[:stepAt]+strings.ToUpper(batched[stepAt:stepAt+64])+batched[stepAt+64:])), "invalid")

	// A result that repeats a member name is refused, never left unbound.
	dup := completed
	dup.Result = json.RawMessage(`{"id":12345678901234567890}`)
	dupText, err := json.Marshal(withReceipt(dup, s.Sign(outcome(dup))))
	require.NoError(t, err)
	dupText = []byte(strings.Replace(string(dupText), `{"id":12345678901234567890}`, `{"id":1,"id":2}`, 1))
	cases = append(cases, receiptCase{Name: "a result repeating a member name, its receipt leaving the result unbound",
		Answer: dupText, AnswerText: string(dupText), Error: "invalid"})
	surrogate := completed
	surrogate.Result = json.RawMessage(`{"id":12345678901234567890,"s":"\ud800"}`)
	add("a result with a lone surrogate and a big number", withReceipt(surrogate, s.Sign(outcome(big))), "invalid")

	return receiptVectors{
		Comment: "Receipts and what verifying each with keys comes to (docs/audit.md). Written by go test ./pkg/audit -run TestReceiptVectors -update.",
		Keys:    keysJSON, Cases: cases,
	}
}

// sigOf is the "sig" of a signed event.
func sigOf(t *testing.T, signed string) string {
	t.Helper()
	var ev struct{ Sig string }
	require.NoError(t, json.Unmarshal([]byte(signed), &ev))
	return ev.Sig
}

// lastBitsSet is the base64url character c with its low bit set: as the
// last of 86, the same 64 bytes to a lenient decoder.
func lastBitsSet(c byte) string {
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	return string(alphabet[strings.IndexByte(alphabet, c)|1])
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
		"key_not_valid": ErrKeyNotValid, "mismatch": ErrReceiptMismatch, "invalid": ErrInvalid}
	for _, c := range v.Cases {
		t.Run(c.Name, func(t *testing.T) {
			answer := c.Answer
			if c.AnswerText != "" {
				answer = json.RawMessage(c.AnswerText)
			}
			_, err := VerifyReceiptJSON(answer, keys)
			if c.Error == "" {
				require.NoError(t, err)
				return
			}
			require.Error(t, err, "want %s", c.Error)
			require.True(t, errors.Is(err, kinds[c.Error]), "%v, want %s", err, c.Error)
		})
	}
}
