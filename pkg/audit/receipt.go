package audit

import (
	"fmt"

	"github.com/idemgate/idemgate/pkg/intent"
)

// Receipted reports whether an answer of status s carries a receipt:
// completed, failed and denied answers always do (the ledger record keeps
// it, so replays carry it too), a conflict does when a worker answered it.
// A rejected answer (bad input, a rate limit, a dead letter) reports
// nothing that happened and carries none; nor does an answer that is not
// final (awaiting_approval, uncertain).
func Receipted(s intent.Status) bool {
	switch s {
	case intent.StatusCompleted, intent.StatusFailed, intent.StatusDenied, intent.StatusConflict:
		return true
	}
	return false
}

// VerifyReceipt checks res's receipt: its signature (VerifyEvent, with
// keys), and that it records res's outcome — the same key (or its compact
// ledger key, for an operation an operator decided by that key),
// fingerprint, status and attempts, and the digests of res's result and
// error. A receipt from another operation, or of another outcome, does not
// verify. It returns the receipt's event, or an error matching ErrNoReceipt
// (res carries none), ErrReceiptMismatch or one of VerifyEvent's.
func VerifyReceipt(res intent.Result, keys *KeySet) (Event, error) {
	if len(res.Receipt) == 0 {
		return Event{}, fmt.Errorf("%w: the %s answer of %s carries no receipt", ErrNoReceipt, res.Status, res.Key)
	}
	ev, err := VerifyEvent(res.Receipt, keys)
	if err != nil {
		return ev, fmt.Errorf("receipt of %s: %w", res.Key, err)
	}
	if err := matches(ev, res); err != nil {
		return ev, fmt.Errorf("%w: %s: %w", ErrReceiptMismatch, res.Key, err)
	}
	return ev, nil
}

// matches reports how ev does not record res's outcome (nil when it does).
func matches(ev Event, res intent.Result) error {
	wantKind := KindOutcome
	if res.Status == intent.StatusConflict {
		wantKind = KindConflict
	}
	compact, _ := intent.LedgerKey(res.Key, intent.LayoutCompact)
	var resultDigest string
	if len(res.Result) > 0 {
		resultDigest, _ = ResultDigest(res.Result) // "" when it has no canonical form: unbound
	}
	var errorDigest string
	if res.Error != nil {
		errorDigest = ErrorDigest(*res.Error)
	}
	switch {
	case ev.Kind != wantKind:
		return fmt.Errorf("it is a %s event, a %s answer's is a %s event", ev.Kind, res.Status, wantKind)
	case ev.Key != res.Key && ev.Key != compact:
		return fmt.Errorf("it is of key %s", ev.Key)
	case ev.Fingerprint != res.Fingerprint:
		return fmt.Errorf("it is of fingerprint %s, the answer's is %s", ev.Fingerprint, res.Fingerprint)
	case ev.Status != res.Status:
		return fmt.Errorf("it records status %s, the answer's is %s", ev.Status, res.Status)
	case res.Status == intent.StatusConflict && ev.RecordFingerprint != res.RecordFingerprint:
		return fmt.Errorf("it names record fingerprint %s, the answer %s", ev.RecordFingerprint, res.RecordFingerprint)
	case res.Status != intent.StatusConflict && ev.Attempts != res.Attempts:
		return fmt.Errorf("it records %d attempts, the answer %d", ev.Attempts, res.Attempts)
	case ev.ResultDigest != resultDigest:
		return fmt.Errorf("its result digest is %q, the answer's result's is %q", ev.ResultDigest, resultDigest)
	case ev.ErrorDigest != errorDigest:
		return fmt.Errorf("its error digest is %q, the answer's error's is %q", ev.ErrorDigest, errorDigest)
	}
	return nil
}
