package audit

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
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
	// Most strings (keys, digests, names) are printable ASCII: one pass
	// tells, and they are copied as they are.
	plain := true
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= utf8.RuneSelf || c == '"' || c == '\\' {
			plain = false
			break
		}
	}
	if plain {
		b = append(b, '"')
		b = append(b, s...)
		return append(b, '"')
	}
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
	if canonical, removed, ok := quickWithout(data, names...); ok {
		return canonical, removed, nil
	}
	return slowWithout(data, names...)
}

// quickWithout is withoutMembers of data that is canonical already
// (canonicalAlready): its other members' bytes, as they are. ok is false
// for other data.
func quickWithout(data []byte, names ...string) (canonical []byte, removed map[string]json.RawMessage, ok bool) {
	if len(data) < 2 || data[0] != '{' || !canonicalAlready(data) {
		return nil, nil, false
	}
	removed = map[string]json.RawMessage{}
	if data[1] == '}' {
		return data, removed, true
	}
	out := make([]byte, 1, len(data))
	out[0] = '{'
	c := quickCanon{b: data, i: 1}
	for {
		start := c.i
		name, _ := c.name()
		c.i++ // the colon
		valueAt := c.i
		c.value(1)
		if slices.Contains(names, string(name)) {
			removed[string(name)] = data[valueAt:c.i:c.i]
		} else {
			if len(out) > 1 {
				out = append(out, ',')
			}
			out = append(out, data[start:c.i]...)
		}
		if more, _ := c.next('}'); !more {
			return append(out, '}'), removed, true
		}
	}
}

// slowWithout is withoutMembers of any data.
func slowWithout(data []byte, names ...string) (canonical []byte, removed map[string]json.RawMessage, err error) {
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

// maxQuickDepth bounds the nesting canonicalAlready follows; deeper data
// is canonicalized the long way.
const maxQuickDepth = 64

// canonicalAlready reports whether data is, as it is, what
// intent.Canonicalize makes of it, so that its digest needs no second
// encoding: no whitespace, member names of ASCII without escapes in
// strictly increasing order (for them RFC 8785's order), strings valid
// UTF-8 with RFC 8785's escapes only, integers of at most 15 digits (no
// fraction, no exponent). It is a quick check of the common case: false
// says only to canonicalize.
func canonicalAlready(data []byte) bool {
	c := quickCanon{b: data}
	return c.value(0) && c.i == len(data)
}

// quickCanon scans data for canonicalAlready.
type quickCanon struct {
	b []byte
	i int
}

func (c *quickCanon) value(depth int) bool {
	if c.i >= len(c.b) || depth > maxQuickDepth {
		return false
	}
	switch ch := c.b[c.i]; {
	case ch == '{':
		return c.object(depth)
	case ch == '[':
		return c.array(depth)
	case ch == '"':
		return c.string()
	case ch == 't':
		return c.literal("true")
	case ch == 'f':
		return c.literal("false")
	case ch == 'n':
		return c.literal("null")
	case ch == '-' || ch >= '0' && ch <= '9':
		return c.integer()
	}
	return false
}

func (c *quickCanon) literal(word string) bool {
	if !bytes.HasPrefix(c.b[c.i:], []byte(word)) {
		return false
	}
	c.i += len(word)
	return true
}

// next reports whether the container goes on (a comma, skipped) or ends
// (close, skipped); ok is false for anything else.
func (c *quickCanon) next(close byte) (more, ok bool) {
	if c.i >= len(c.b) {
		return false, false
	}
	switch c.b[c.i] {
	case ',':
		c.i++
		return true, true
	case close:
		c.i++
		return false, true
	}
	return false, false
}

func (c *quickCanon) object(depth int) bool {
	c.i++
	if c.i < len(c.b) && c.b[c.i] == '}' {
		c.i++
		return true
	}
	var prev []byte
	for {
		name, ok := c.name()
		if !ok || prev != nil && bytes.Compare(prev, name) >= 0 || c.i >= len(c.b) || c.b[c.i] != ':' {
			return false
		}
		prev = name
		c.i++
		if !c.value(depth + 1) {
			return false
		}
		more, ok := c.next('}')
		if !more {
			return ok
		}
	}
}

// name reads a member name of ASCII characters needing no escape.
func (c *quickCanon) name() ([]byte, bool) {
	if c.i >= len(c.b) || c.b[c.i] != '"' {
		return nil, false
	}
	start := c.i + 1
	for i := start; i < len(c.b); i++ {
		switch ch := c.b[i]; {
		case ch == '"':
			c.i = i + 1
			return c.b[start:i], true
		case ch < 0x20 || ch >= utf8.RuneSelf || ch == '\\':
			return nil, false
		}
	}
	return nil, false
}

func (c *quickCanon) array(depth int) bool {
	c.i++
	if c.i < len(c.b) && c.b[c.i] == ']' {
		c.i++
		return true
	}
	for {
		if !c.value(depth + 1) {
			return false
		}
		more, ok := c.next(']')
		if !more {
			return ok
		}
	}
}

// string reads a string as RFC 8785 writes it: control characters
// escaped (\b \f \n \r \t, else \u00xx in lowercase hex), '"' and '\\'
// escaped, nothing else.
func (c *quickCanon) string() bool {
	c.i++
	for c.i < len(c.b) {
		// Most of a string is a run of printable ASCII, read 4 bytes at a
		// time.
		b := c.b
		i := c.i
		for i+4 <= len(b) && plainByte[b[i]] && plainByte[b[i+1]] && plainByte[b[i+2]] && plainByte[b[i+3]] {
			i += 4
		}
		for i < len(b) && plainByte[b[i]] {
			i++
		}
		if c.i = i; i >= len(b) {
			return false
		}
		switch ch := b[i]; {
		case ch == '"':
			c.i++
			return true
		case ch < 0x20:
			return false
		case ch == '\\':
			if c.i+1 >= len(c.b) {
				return false
			}
			switch c.b[c.i+1] {
			case '"', '\\', 'b', 'f', 'n', 'r', 't':
				c.i += 2
			case 'u':
				if c.i+6 > len(c.b) || c.b[c.i+2] != '0' || c.b[c.i+3] != '0' {
					return false
				}
				hi, lo := c.b[c.i+4], c.b[c.i+5]
				var x byte
				switch {
				case hi != '0' && hi != '1':
					return false
				case lo >= '0' && lo <= '9':
					x = (hi-'0')<<4 | (lo - '0')
				case lo >= 'a' && lo <= 'f':
					x = (hi-'0')<<4 | (lo - 'a' + 10)
				default:
					return false
				}
				if x == '\b' || x == '\f' || x == '\n' || x == '\r' || x == '\t' {
					return false
				}
				c.i += 6
			default:
				return false
			}
		case ch < utf8.RuneSelf:
			c.i++
		default:
			r, n := utf8.DecodeRune(c.b[c.i:])
			if r == utf8.RuneError && n <= 1 {
				return false
			}
			c.i += n
		}
	}
	return false
}

// plainByte tells the bytes a canonical string holds as they are, alone:
// printable ASCII but '"' and '\\'.
var plainByte = func() (t [256]bool) {
	for c := 0x20; c < utf8.RuneSelf; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

// integer reads an integer of at most 15 digits without a leading zero
// (nor -0): as RFC 8785 writes it, and within ±2^53.
func (c *quickCanon) integer() bool {
	neg := c.b[c.i] == '-'
	if neg {
		c.i++
	}
	start := c.i
	for c.i < len(c.b) && c.b[c.i] >= '0' && c.b[c.i] <= '9' {
		c.i++
	}
	n := c.i - start
	switch {
	case n == 0 || n > 15:
		return false
	case c.b[start] == '0' && (n > 1 || neg):
		return false
	case c.i < len(c.b) && (c.b[c.i] == '.' || c.b[c.i] == 'e' || c.b[c.i] == 'E'):
		return false
	}
	return true
}
