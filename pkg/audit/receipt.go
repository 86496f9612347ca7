package audit

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/idemgate/idemgate/pkg/intent"
)

// Receipted reports whether an answer of status s carries a receipt:
// completed, failed and denied answers always do (the ledger record keeps
// it, so replays carry it too), and so does already_done (the receipt of
// the completion it reports); a conflict does when a worker answered it.
// A rejected answer (bad input, a rate limit, a dead letter) reports
// nothing that happened and carries none; nor does an answer that is not
// final (awaiting_approval, uncertain).
func Receipted(s intent.Status) bool {
	switch s {
	case intent.StatusCompleted, intent.StatusFailed, intent.StatusDenied, intent.StatusConflict, intent.StatusAlreadyDone:
		return true
	}
	return false
}

// VerifyReceipt checks res's receipt: its signature (VerifyEvent, with
// keys), and that it records res's outcome — the same key (or its compact
// ledger key, for an operation an operator decided by that key),
// fingerprint, status (completed, for an already_done answer), attempts,
// run (intent sequence, attempt and time), and the digests of res's result
// and error. A receipt from another operation, another run of it, or of
// another outcome, does not verify. It returns the receipt's event, or an
// error matching ErrNoReceipt (res carries none), ErrReceiptMismatch,
// ErrInvalid (res's result repeats a member name, or is not JSON) or one
// of VerifyEvent's.
func VerifyReceipt(res intent.Result, keys *KeySet) (Event, error) {
	if len(res.Receipt) == 0 {
		return Event{}, fmt.Errorf("%w: the %s answer of %s carries no receipt", ErrNoReceipt, res.Status, res.Key)
	}
	ev, err := VerifyEvent(res.Receipt, keys)
	if err != nil {
		return ev, fmt.Errorf("receipt of %s: %w", res.Key, err)
	}
	var resultDigest string
	if len(res.Result) > 0 {
		if resultDigest, err = boundDigest(res.Result); err != nil {
			return ev, fmt.Errorf("receipt of %s: the answer's result: %w", res.Key, err)
		}
	}
	if err := matches(ev, res, resultDigest); err != nil {
		return ev, fmt.Errorf("%w: %s: %w", ErrReceiptMismatch, res.Key, err)
	}
	return ev, nil
}

// VerifyReceiptJSON is VerifyReceipt of an answer's JSON text as it came:
// CheckAnswerText, then VerifyReceipt of the decoded answer.
func VerifyReceiptJSON(data []byte, keys *KeySet) (Event, error) {
	if err := CheckAnswerText(data); err != nil {
		return Event{}, err
	}
	var res intent.Result
	if err := json.Unmarshal(data, &res); err != nil {
		return Event{}, fmt.Errorf("%w: answer: %w", ErrInvalid, err)
	}
	return VerifyReceipt(res, keys)
}

// CheckAnswerText reports, as ErrInvalid, an answer's JSON text that a
// decoder would read other than as written: a member name repeated in any
// object (a decoder keeps one), a lone surrogate escape or invalid UTF-8
// (it substitutes them), or text that is not JSON. Numbers beyond ±2^53
// are allowed (a result holding one is unbound).
func CheckAnswerText(data []byte) error {
	if _, err := boundDigest(data); err != nil {
		return fmt.Errorf("answer: %w", err)
	}
	return nil
}

// boundDigest is the digest a receipt binds result by: ResultDigest, or ""
// when result's one fault is a number beyond ±2^53 (it has no canonical
// form, and a receipt leaves it unbound). Any other fault — a repeated
// member name, a lone surrogate, not JSON — is ErrInvalid: such a result
// is refused, never unbound.
func boundDigest(result []byte) (string, error) {
	if d, ok := ResultDigest(result); ok {
		return d, nil
	}
	// With 0 in place of every number beyond ±2^53, what is left must
	// canonicalize.
	if _, err := intent.Canonicalize(withoutBigNumbers(result)); err != nil {
		return "", fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	return "", nil
}

// withoutBigNumbers returns data with 0 in place of every number literal
// (outside strings) that has no canonical form: beyond ±2^53, or beyond a
// float64. One pass; data itself is not changed.
func withoutBigNumbers(data []byte) []byte {
	out := make([]byte, 0, len(data))
	for i := 0; i < len(data); {
		c := data[i]
		switch {
		case c == '"': // a string, copied as it is
			j := i + 1
			for j < len(data) && data[j] != '"' {
				if data[j] == '\\' {
					j++
				}
				j++
			}
			j = min(j+1, len(data))
			out, i = append(out, data[i:j]...), j
		case c == '-' || c >= '0' && c <= '9':
			j := i + 1
			for j < len(data) && strings.IndexByte("+-.0123456789eE", data[j]) >= 0 {
				j++
			}
			lit := data[i:j]
			if _, err := intent.Canonicalize(lit); err != nil && strings.Contains(err.Error(), "beyond") {
				lit = []byte{'0'}
			}
			out, i = append(out, lit...), j
		default:
			out, i = append(out, c), i+1
		}
	}
	return out
}

// matches reports how ev does not record res's outcome (nil when it does);
// resultDigest is the digest ev must bind res's result by.
func matches(ev Event, res intent.Result, resultDigest string) error {
	wantKind, wantStatus := KindOutcome, res.Status
	switch res.Status {
	case intent.StatusConflict:
		wantKind = KindConflict
	case intent.StatusAlreadyDone:
		wantStatus = intent.StatusCompleted // the completion it reports; its error is the refusal, which no receipt binds
	}
	compact, _ := intent.LedgerKey(res.Key, intent.LayoutCompact)
	var errorDigest string
	if res.Error != nil && res.Status != intent.StatusAlreadyDone {
		errorDigest = ErrorDigest(*res.Error)
	}
	switch {
	case ev.Kind != wantKind:
		return fmt.Errorf("it is a %s event, a %s answer's is a %s event", ev.Kind, res.Status, wantKind)
	case ev.Key != res.Key && ev.Key != compact:
		return fmt.Errorf("it is of key %s", ev.Key)
	case ev.Fingerprint != res.Fingerprint:
		return fmt.Errorf("it is of fingerprint %s, the answer's is %s", ev.Fingerprint, res.Fingerprint)
	case ev.Status != wantStatus:
		return fmt.Errorf("it records status %s, the %s answer's is %s", ev.Status, res.Status, wantStatus)
	case res.Status == intent.StatusConflict && ev.RecordFingerprint != res.RecordFingerprint:
		return fmt.Errorf("it names record fingerprint %s, the answer %s", ev.RecordFingerprint, res.RecordFingerprint)
	case res.Status != intent.StatusConflict && ev.Attempts != res.Attempts:
		return fmt.Errorf("it records %d attempts, the answer %d", ev.Attempts, res.Attempts)
	case ev.IntentSeq != res.IntentSeq:
		return fmt.Errorf("it is of intent sequence %d, the answer's is %d", ev.IntentSeq, res.IntentSeq)
	case res.Status != intent.StatusConflict && ev.Attempt != res.Attempt:
		return fmt.Errorf("it is of attempt %d, the answer's is %d", ev.Attempt, res.Attempt)
	case !ev.At.Equal(res.CompletedAt):
		return fmt.Errorf("it is of %s, the answer was completed at %s", ev.At.Format(time.RFC3339Nano), res.CompletedAt.Format(time.RFC3339Nano))
	case ev.ResultDigest != resultDigest:
		return fmt.Errorf("its result digest is %q, the answer's result's is %q", ev.ResultDigest, resultDigest)
	case ev.ErrorDigest != errorDigest:
		return fmt.Errorf("its error digest is %q, the answer's error's is %q", ev.ErrorDigest, errorDigest)
	}
	return nil
}
