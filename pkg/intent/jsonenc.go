package intent

import (
	"encoding/json"
	"fmt"
	"strconv"
	"time"
	"unicode/utf8"
)

// Encoders of the answer and of ledger records without reflection: the same
// bytes as encoding/json writes (HTML-safe strings, RFC 3339 times), except
// that embedded raw JSON (a result, a kept intent) is copied as it is
// instead of compacted — it is checked to be valid JSON, as encoding/json
// checks it.

// AppendJSONString appends s as a JSON string, escaped as encoding/json
// escapes it: quotes, backslashes and control characters, <, > and &,
// U+2028 and U+2029; invalid UTF-8 becomes U+FFFD.
func AppendJSONString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' && c != '<' && c != '>' && c != '&' {
				i++
				continue
			}
			dst = appendEscapedByte(append(dst, s[start:i]...), c)
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
		case r == '\u2028' || r == '\u2029':
			dst = append(dst, s[start:i]...)
			dst = append(dst, '\\', 'u', '2', '0', '2', hexDigits[r&0xF])
		default:
			i += size
			continue
		}
		i += size
		start = i
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

const hexDigits = "0123456789abcdef"

// appendEscapedByte appends the JSON escape of the ASCII byte c, as both
// encoding/json and RFC 8785 write it: \" \\ \b \f \n \r \t, else
// \u00xx in lower-case hex (a control character, or encoding/json's <, >
// and &).
func appendEscapedByte(dst []byte, c byte) []byte {
	switch c {
	case '"', '\\':
		return append(dst, '\\', c)
	case '\b':
		return append(dst, '\\', 'b')
	case '\f':
		return append(dst, '\\', 'f')
	case '\n':
		return append(dst, '\\', 'n')
	case '\r':
		return append(dst, '\\', 'r')
	case '\t':
		return append(dst, '\\', 't')
	}
	return append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xF])
}

// AppendJSONTime appends t as encoding/json does (time.Time.MarshalJSON):
// RFC 3339 with nanoseconds, quoted; a year outside 0000-9999 is an error.
func AppendJSONTime(dst []byte, t time.Time) ([]byte, error) {
	if y := t.Year(); y < 0 || y > 9999 {
		return dst, fmt.Errorf("%w: time %s: year outside 0000-9999", ErrInvalid, t)
	}
	dst = append(dst, '"')
	dst = t.AppendFormat(dst, time.RFC3339Nano)
	return append(dst, '"'), nil
}

// AppendJSONRaw appends raw, which must be valid JSON, as it is; empty raw
// is null.
func AppendJSONRaw(dst []byte, raw json.RawMessage) ([]byte, error) {
	if len(raw) == 0 {
		return append(dst, "null"...), nil
	}
	if !json.Valid(raw) {
		return dst, fmt.Errorf("%w: raw JSON value is not valid JSON", ErrInvalid)
	}
	return append(dst, raw...), nil
}

// AppendJSONSigned appends raw, a JSON object made and signed elsewhere (a
// receipt), as it is. It is checked only to be an object, by its first and
// last bytes: a full check would cost as much again as the answer's, and
// what its signature covers is checked by whoever verifies it.
func AppendJSONSigned(dst []byte, raw json.RawMessage) ([]byte, error) {
	if len(raw) < 2 || raw[0] != '{' || raw[len(raw)-1] != '}' {
		return dst, fmt.Errorf("%w: signed JSON value is not an object", ErrInvalid)
	}
	return append(dst, raw...), nil
}

// AppendJSONMember appends "name": (a plain ASCII name) for the next member
// of the object dst is writing: a comma first unless dst ends with '{'.
func AppendJSONMember(dst []byte, name string) []byte {
	if dst[len(dst)-1] != '{' {
		dst = append(dst, ',')
	}
	dst = append(dst, '"')
	dst = append(dst, name...)
	return append(dst, '"', ':')
}

// AppendJSON appends the answer as JSON: the same members, in the same order
// and with the same omissions, as encoding/json writes for Result; Result
// is copied as it is (it must be valid JSON).
func (r Result) AppendJSON(dst []byte) ([]byte, error) {
	var err error
	dst = append(dst, '{')
	dst = AppendJSONString(AppendJSONMember(dst, "key"), r.Key)
	dst = AppendJSONString(AppendJSONMember(dst, "tool"), r.Tool)
	dst = AppendJSONString(AppendJSONMember(dst, "status"), string(r.Status))
	dst = strconv.AppendBool(AppendJSONMember(dst, "replayed"), r.Replayed)
	if r.Fingerprint != "" {
		dst = AppendJSONString(AppendJSONMember(dst, "fingerprint"), r.Fingerprint)
	}
	if r.RecordFingerprint != "" {
		dst = AppendJSONString(AppendJSONMember(dst, "record_fingerprint"), r.RecordFingerprint)
	}
	dst = strconv.AppendInt(AppendJSONMember(dst, "attempts"), int64(r.Attempts), 10)
	if r.IntentSeq != 0 {
		dst = strconv.AppendUint(AppendJSONMember(dst, "intent_seq"), r.IntentSeq, 10)
	}
	if r.Attempt != 0 {
		dst = strconv.AppendInt(AppendJSONMember(dst, "attempt"), int64(r.Attempt), 10)
	}
	if len(r.Result) > 0 {
		if dst, err = AppendJSONRaw(AppendJSONMember(dst, "result"), r.Result); err != nil {
			return nil, fmt.Errorf("answer result: %w", err)
		}
	}
	if r.Error != nil {
		dst = r.Error.AppendJSON(AppendJSONMember(dst, "error"))
	}
	if r.CallID != "" {
		dst = AppendJSONString(AppendJSONMember(dst, "call_id"), r.CallID)
	}
	if !r.CompletedAt.IsZero() {
		if dst, err = AppendJSONTime(AppendJSONMember(dst, "completed_at"), r.CompletedAt); err != nil {
			return nil, fmt.Errorf("answer completed_at: %w", err)
		}
	}
	if len(r.Receipt) > 0 {
		if dst, err = AppendJSONSigned(AppendJSONMember(dst, "receipt"), r.Receipt); err != nil {
			return nil, fmt.Errorf("answer receipt: %w", err)
		}
	}
	if !r.RetryAt.IsZero() {
		if dst, err = AppendJSONTime(AppendJSONMember(dst, "retry_at"), r.RetryAt); err != nil {
			return nil, fmt.Errorf("answer retry_at: %w", err)
		}
	}
	return append(dst, '}'), nil
}

// AppendJSON appends the error as JSON, as encoding/json writes it.
func (e Error) AppendJSON(dst []byte) []byte {
	dst = append(dst, '{')
	dst = AppendJSONString(AppendJSONMember(dst, "code"), e.Code)
	dst = AppendJSONString(AppendJSONMember(dst, "message"), e.Message)
	return append(dst, '}')
}
