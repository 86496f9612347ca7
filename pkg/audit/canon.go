package audit

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/idemgate/idemgate/pkg/intent"
)

// object builds the RFC 8785 form of a JSON object whose member names are
// ASCII (every name this package writes): members sorted by name, values in
// canonical form. It writes what intent.Canonicalize writes for the same
// object, without parsing it.
type object struct {
	buf     []byte // every value, one after another
	members []span
}

// span is one member: its name and where its value lies in buf.
type span struct {
	name       string
	start, end int
}

func (o *object) add(name string, start int) {
	o.members = append(o.members, span{name: name, start: start, end: len(o.buf)})
}

// str adds a string member; an empty string is left out.
func (o *object) str(name, v string) {
	if v == "" {
		return
	}
	start := len(o.buf)
	o.buf = appendString(o.buf, v)
	o.add(name, start)
}

// num adds an integer member; zero is left out.
func (o *object) num(name string, v int64) {
	if v == 0 {
		return
	}
	start := len(o.buf)
	o.buf = strconv.AppendInt(o.buf, v, 10)
	o.add(name, start)
}

// unum adds an unsigned integer member; zero is left out.
func (o *object) unum(name string, v uint64) {
	if v == 0 {
		return
	}
	start := len(o.buf)
	o.buf = strconv.AppendUint(o.buf, v, 10)
	o.add(name, start)
}

// time adds a time member as RFC 3339 in UTC with nanoseconds; the zero
// time is left out.
func (o *object) time(name string, t time.Time) {
	if t.IsZero() {
		return
	}
	start := len(o.buf)
	o.buf = append(o.buf, '"')
	o.buf = t.UTC().AppendFormat(o.buf, time.RFC3339Nano)
	o.buf = append(o.buf, '"')
	o.add(name, start)
}

// raw adds a member whose value is canonical JSON already; empty is left
// out.
func (o *object) raw(name string, canonical []byte) {
	if len(canonical) == 0 {
		return
	}
	start := len(o.buf)
	o.buf = append(o.buf, canonical...)
	o.add(name, start)
}

// appendTo appends the object in canonical form to b.
func (o *object) appendTo(b []byte) []byte {
	slices.SortFunc(o.members, func(x, y span) int { return strings.Compare(x.name, y.name) })
	b = append(b, '{')
	for i, m := range o.members {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, '"')
		b = append(b, m.name...)
		b = append(b, '"', ':')
		b = append(b, o.buf[m.start:m.end]...)
	}
	return append(b, '}')
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

// withoutMember returns the canonical form of the JSON object data without
// its member name, and that member's value (nil when it has none). data is
// checked as intent.Canonicalize checks it: a repeated member name, invalid
// UTF-8 or a number beyond ±2^53 is refused.
func withoutMember(data []byte, name string) (canonical []byte, value json.RawMessage, err error) {
	if _, err := intent.Canonicalize(data); err != nil {
		return nil, nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	var members map[string]json.RawMessage
	if err := json.Unmarshal(data, &members); err != nil || members == nil {
		return nil, nil, fmt.Errorf("%w: not a JSON object", ErrInvalid)
	}
	value = members[name]
	delete(members, name)
	rest, err := json.Marshal(members)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	canonical, err = intent.Canonicalize(rest)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	return canonical, value, nil
}
