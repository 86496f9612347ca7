package audit

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/idemgate/idemgate/pkg/intent"
)

// encoder writes the members of a JSON object in canonical form, its
// caller calling it in the order of the members' names; a zero value is
// left out.
type encoder struct {
	b    []byte
	more bool // a member was written
}

func (w *encoder) name(name string) {
	if w.more {
		w.b = append(w.b, ',')
	}
	w.more = true
	w.b = append(w.b, '"')
	w.b = append(w.b, name...)
	w.b = append(w.b, '"', ':')
}

func (w *encoder) str(name, v string) {
	if v != "" {
		w.name(name)
		w.b = appendString(w.b, v)
	}
}

func (w *encoder) int(name string, v int64) {
	if v != 0 {
		w.name(name)
		w.b = strconv.AppendInt(w.b, v, 10)
	}
}

func (w *encoder) uint(name string, v uint64) {
	if v != 0 {
		w.name(name)
		w.b = strconv.AppendUint(w.b, v, 10)
	}
}

// time writes t as RFC 3339 in UTC with nanoseconds.
func (w *encoder) time(name string, t time.Time) {
	if !t.IsZero() {
		w.name(name)
		w.b = append(w.b, '"')
		w.b = t.UTC().AppendFormat(w.b, time.RFC3339Nano)
		w.b = append(w.b, '"')
	}
}

// raw writes canonical JSON as it is.
func (w *encoder) raw(name string, canonical []byte) {
	if len(canonical) > 0 {
		w.name(name)
		w.b = append(w.b, canonical...)
	}
}

// appendString appends s as an RFC 8785 string: only '"', '\\' and the
// control characters are escaped (\b \f \n \r \t, else \u00xx); invalid
// UTF-8 becomes U+FFFD, so that every string has a canonical form.
func appendString(b []byte, s string) []byte {
	if !utf8.ValidString(s) {
		s = strings.ToValidUTF8(s, "\uFFFD")
	}
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' {
			continue
		}
		b = append(b, s[start:i]...)
		switch c {
		case '"', '\\':
			b = append(b, '\\', c)
		case '\b':
			b = append(b, '\\', 'b')
		case '\f':
			b = append(b, '\\', 'f')
		case '\n':
			b = append(b, '\\', 'n')
		case '\r':
			b = append(b, '\\', 'r')
		case '\t':
			b = append(b, '\\', 't')
		default:
			const hex = "0123456789abcdef"
			b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xF])
		}
		start = i + 1
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

// withoutMembers returns the canonical form of the JSON object data
// without the members names, and those members' values (by name; absent
// ones are not in it). data is checked as intent.Canonicalize checks it: a
// repeated member name, invalid UTF-8 or a number beyond ±2^53 is refused.
func withoutMembers(data []byte, names ...string) (canonical []byte, removed map[string]json.RawMessage, err error) {
	if _, err := intent.Canonicalize(data); err != nil {
		return nil, nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	var members map[string]json.RawMessage
	if err := json.Unmarshal(data, &members); err != nil || members == nil {
		return nil, nil, fmt.Errorf("%w: not a JSON object", ErrInvalid)
	}
	removed = map[string]json.RawMessage{}
	for _, name := range names {
		if v, ok := members[name]; ok {
			removed[name] = v
			delete(members, name)
		}
	}
	rest, err := json.Marshal(members)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	canonical, err = intent.Canonicalize(rest)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	return canonical, removed, nil
}
