package intent

import (
	"bytes"
	"unicode/utf8"
)

// maxScanDepth bounds the depth of the values a CanonicalScanner reads
// (the top-level value at 0): deeper data is not taken as canonical
// (IsCanonical is false), and is canonicalized the long way.
const maxScanDepth = 64

// IsCanonical reports whether data is, as it is, what Canonicalize makes of
// it, so that it needs no second encoding. It is a quick check of the
// common case, in one pass without allocating: no whitespace, member names
// of ASCII without escapes in strictly increasing order (for them RFC
// 8785's order), strings of valid UTF-8 with RFC 8785's escapes only,
// integers of at most 15 digits (no fraction, no exponent), at most 65
// containers nested. False says only to call Canonicalize.
func IsCanonical(data []byte) bool {
	c := ScanCanonical(data, 0)
	return c.Value(0) && c.Offset() == len(data)
}

// CanonicalScanner reads JSON text that is in canonical form by
// IsCanonical's rules, value by value, without building anything: a
// caller finds an object's members with it while it checks them. Each
// method reads at the scanner's offset and moves it past what it read; a
// false result says the text there is not canonical by those rules (the
// offset is then anywhere).
type CanonicalScanner struct {
	b []byte
	i int
}

// ScanCanonical returns a scanner of data at offset at.
func ScanCanonical(data []byte, at int) CanonicalScanner {
	return CanonicalScanner{b: data, i: at}
}

// Offset is where in its data the scanner is.
func (c *CanonicalScanner) Offset() int { return c.i }

// Value reads one value nested depth deep (a top-level value is at depth
// 0, the members of a top-level object at 1); one deeper than 64 is not
// read.
func (c *CanonicalScanner) Value(depth int) bool {
	if c.i >= len(c.b) || depth > maxScanDepth {
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

func (c *CanonicalScanner) literal(word string) bool {
	if !bytes.HasPrefix(c.b[c.i:], []byte(word)) {
		return false
	}
	c.i += len(word)
	return true
}

// Next reads what follows a value in a container that close ends: more is
// true after a comma, false after close; ok is false for anything else.
func (c *CanonicalScanner) Next(close byte) (more, ok bool) {
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

// Open reads the '{' that starts an object: more is true when a member
// follows (read it with Name, Value and Next), false when the object is
// empty (its '}' is read too); ok is false for anything else.
func (c *CanonicalScanner) Open() (more, ok bool) {
	if c.i >= len(c.b) || c.b[c.i] != '{' {
		return false, false
	}
	c.i++
	if c.i < len(c.b) && c.b[c.i] == '}' {
		c.i++
		return false, true
	}
	return true, true
}

func (c *CanonicalScanner) object(depth int) bool {
	if more, ok := c.Open(); !more {
		return ok
	}
	var prev []byte
	for {
		name, ok := c.Name(prev)
		if !ok {
			return false
		}
		prev = name
		if !c.Value(depth + 1) {
			return false
		}
		more, ok := c.Next('}')
		if !more {
			return ok
		}
	}
}

// Name reads a member name of ASCII characters needing no escape, which
// must sort after prev (the member before, nil for the first), and the
// colon after it; name is its text, in the scanner's data.
func (c *CanonicalScanner) Name(prev []byte) (name []byte, ok bool) {
	if c.i >= len(c.b) || c.b[c.i] != '"' {
		return nil, false
	}
	start := c.i + 1
	for i := start; i < len(c.b); i++ {
		switch ch := c.b[i]; {
		case ch == '"':
			name = c.b[start:i]
			if prev != nil && bytes.Compare(prev, name) >= 0 || i+1 >= len(c.b) || c.b[i+1] != ':' {
				return nil, false
			}
			c.i = i + 2
			return name, true
		case ch < 0x20 || ch >= utf8.RuneSelf || ch == '\\':
			return nil, false
		}
	}
	return nil, false
}

func (c *CanonicalScanner) array(depth int) bool {
	c.i++
	if c.i < len(c.b) && c.b[c.i] == ']' {
		c.i++
		return true
	}
	for {
		if !c.Value(depth + 1) {
			return false
		}
		more, ok := c.Next(']')
		if !more {
			return ok
		}
	}
}

// string reads a string as RFC 8785 writes it (AppendCanonicalString):
// control characters escaped (\b \f \n \r \t, else \u00xx in lowercase
// hex), '"' and '\\' escaped, nothing else.
func (c *CanonicalScanner) string() bool {
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
			n := escapeLen(b[i:])
			if n == 0 {
				return false
			}
			c.i += n
		case ch < utf8.RuneSelf:
			c.i++
		default:
			r, n := utf8.DecodeRune(b[i:])
			if r == utf8.RuneError && n <= 1 {
				return false
			}
			c.i += n
		}
	}
	return false
}

// escapeLen is the length of the escape that b starts with (at its '\\')
// when it is the one appendEscapedByte writes, else 0.
func escapeLen(b []byte) int {
	if len(b) < 2 {
		return 0
	}
	switch b[1] {
	case '"', '\\', 'b', 'f', 'n', 'r', 't':
		return 2
	case 'u':
		if len(b) < 6 || b[2] != '0' || b[3] != '0' {
			return 0
		}
		hi, lo := b[4], b[5]
		var x byte
		switch {
		case hi != '0' && hi != '1':
			return 0
		case lo >= '0' && lo <= '9':
			x = (hi-'0')<<4 | (lo - '0')
		case lo >= 'a' && lo <= 'f':
			x = (hi-'0')<<4 | (lo - 'a' + 10)
		default:
			return 0
		}
		if shortEscape[x] {
			return 0
		}
		return 6
	}
	return 0
}

// shortEscape tells the control characters with a two-character escape
// (\b \f \n \r \t), which are never written \u00xx.
var shortEscape = [0x20]bool{'\b': true, '\f': true, '\n': true, '\r': true, '\t': true}

// plainByte tells the bytes a canonical string holds as they are, alone:
// printable ASCII but '"' and '\\'.
var plainByte = func() (t [256]bool) {
	for c := 0x20; c < utf8.RuneSelf; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

// integer reads an integer of at most 15 digits without a leading zero
// (nor -0): as appendNumber writes it, and within ±2^53.
func (c *CanonicalScanner) integer() bool {
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
