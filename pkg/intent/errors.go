package intent

import (
	"errors"
	"fmt"
)

// Sentinel errors. Every error this package returns wraps exactly one of them,
// with context, so errors.Is matches it and Code maps it to an answer's
// error code.
var (
	// ErrInvalid: the input is not a valid intent (malformed JSON, a broken
	// protocol rule, a missing or mistyped field).
	ErrInvalid = errors.New("intent: invalid")
	// ErrTooLarge: the intent is over the size limit (Limits.MaxBytes).
	ErrTooLarge = errors.New("intent: too large")
	// ErrToolMismatch: the envelope's tool is not the subject's last token.
	ErrToolMismatch = errors.New("intent: tool does not match subject")
	// ErrInvalidSpec: a KeySpec cannot derive keys (for example a window that
	// is not a whole number of seconds). It is a configuration error; a worker
	// checks its specs with KeySpec.Validate at start-up.
	ErrInvalidSpec = errors.New("intent: invalid key spec")
)

// Code maps an error from this package to the error code of an answer:
// CodeTooLarge for ErrTooLarge, CodeToolMismatch for ErrToolMismatch and
// CodeInvalidIntent for everything else. Code(nil) is "".
func Code(err error) string {
	switch {
	case err == nil:
		return ""
	case errors.Is(err, ErrTooLarge):
		return CodeTooLarge
	case errors.Is(err, ErrToolMismatch):
		return CodeToolMismatch
	default:
		return CodeInvalidIntent
	}
}

// SyntaxError is a JSON text this package refuses: malformed JSON, or JSON
// that breaks one of the protocol's rules (a repeated member name, invalid
// UTF-8, a lone surrogate escape, a number beyond ±2^53, nesting too deep).
// It wraps ErrInvalid.
type SyntaxError struct {
	Offset int    // byte offset in the input where the problem was found
	Msg    string // what is wrong
}

// Error reports the problem and its byte offset.
func (e *SyntaxError) Error() string {
	return fmt.Sprintf("%s: at byte %d: %s", ErrInvalid, e.Offset, e.Msg)
}

// Unwrap returns ErrInvalid.
func (e *SyntaxError) Unwrap() error { return ErrInvalid }
