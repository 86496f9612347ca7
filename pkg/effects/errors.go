package effects

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/idemgate/idemgate/pkg/intent"
)

// ErrPermanent is matched by errors.Is for every *PermanentError.
var ErrPermanent = errors.New("effects: permanent failure")

// ErrExhausted is matched by errors.Is when an effect gave up after its last
// retry. It is transient: the operation may be tried again later.
var ErrExhausted = errors.New("effects: retries exhausted")

// PermanentError is an effect failure that retrying cannot fix (a webhook's
// 400, a rejected address). The worker records it as the operation's failed
// result and replays it to every caller; the effect is not fired again for
// the key.
type PermanentError struct {
	// Code is the error code recorded in the answer; intent.CodeEffectFailed
	// when empty.
	Code string
	// Message says what failed, for the caller.
	Message string
	// Err is the underlying error, if any.
	Err error
}

// Permanent returns a *PermanentError with code (intent.CodeEffectFailed when
// empty) and message msg.
func Permanent(code, msg string) error {
	return &PermanentError{Code: codeOrDefault(code), Message: msg}
}

// Permanentf is Permanent with a formatted message. A %w verb in format makes
// the wrapped error the PermanentError's Err.
func Permanentf(code, format string, args ...any) error {
	err := fmt.Errorf(format, args...)
	return &PermanentError{Code: codeOrDefault(code), Message: err.Error(), Err: errors.Unwrap(err)}
}

// IsPermanent reports whether err is, or wraps, a *PermanentError, and
// returns it.
func IsPermanent(err error) (*PermanentError, bool) {
	var pe *PermanentError
	if errors.As(err, &pe) {
		return pe, true
	}
	return nil, false
}

// Error returns "<code>: <message>", followed by the underlying error when it
// is not already part of the message.
func (e *PermanentError) Error() string {
	s := codeOrDefault(e.Code) + ": " + e.Message
	if e.Err != nil && !strings.Contains(e.Message, e.Err.Error()) {
		s += ": " + e.Err.Error()
	}
	return s
}

// Unwrap returns the underlying error.
func (e *PermanentError) Unwrap() error { return e.Err }

// Is reports whether target is ErrPermanent.
func (e *PermanentError) Is(target error) bool { return target == ErrPermanent }

// SettingError is one invalid setting of an effect: a constructor of a
// built-in kind (webhook.New, for one) returns one for each invalid field,
// joined, and the tools-file parser reports each at its field's line.
type SettingError struct {
	Kind    string // the effect's kind: "webhook"
	Field   string // the field as the tools file names it: "url", "retry.max_attempts"
	Problem string // what is wrong: "is missing"
	Hint    string // how to fix it: "write e.g. http://127.0.0.1:8080/hooks/email"
}

// Error returns "<kind>: <field>: <problem> (<hint>)".
func (e *SettingError) Error() string {
	s := e.Field + ": " + e.Problem
	if e.Kind != "" {
		s = e.Kind + ": " + s
	}
	if e.Hint != "" {
		s += " (" + e.Hint + ")"
	}
	return s
}

// MaxErrorMessage is the longest error message IntentError records, in
// bytes: a longer one is cut at a character boundary and ends in "…". Errors
// are recorded in the ledger and sent to every caller, so their size is
// bounded whatever a downstream answered.
const MaxErrorMessage = 1 << 10

// IntentError returns the error as recorded in an answer, its message cut
// to MaxErrorMessage bytes.
func (e *PermanentError) IntentError() intent.Error {
	return intent.Error{Code: codeOrDefault(e.Code), Message: TruncateMessage(e.Message, MaxErrorMessage)}
}

// TruncateMessage returns s cut to at most n bytes at a character boundary,
// ending in "…" when it was cut, and with invalid UTF-8 replaced.
func TruncateMessage(s string, n int) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	if len(s) <= n {
		return s
	}
	const ellipsis = "…"
	cut := max(n-len(ellipsis), 0)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + ellipsis
}

func codeOrDefault(code string) string {
	if code == "" {
		return intent.CodeEffectFailed
	}
	return code
}
