package intent

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"unicode/utf16"
	"unicode/utf8"
)

// maxSafeInteger is 2^53: every integer of at most this magnitude has an
// exact float64 (IEEE 754 double), and so survives canonicalization.
const maxSafeInteger = 1 << 53

// kind is the type of a JSON value.
type kind uint8

const (
	kindNull kind = iota
	kindBool
	kindNumber
	kindString
	kindArray
	kindObject
	// kindRaw is a value already in canonical form (raw), never parsed: the
	// args of a decoded envelope inside a key's material.
	kindRaw
)

func (k kind) String() string {
	switch k {
	case kindNull:
		return "null"
	case kindBool:
		return "a boolean"
	case kindNumber:
		return "a number"
	case kindString:
		return "a string"
	case kindArray:
		return "an array"
	default:
		return "an object"
	}
}

// value is a parsed JSON value. Numbers are float64 (as in ECMAScript and
// RFC 8785); strings are valid UTF-8; object members keep their input order
// and have unique names.
type value struct {
	kind    kind
	boolean bool
	number  float64
	str     string
	array   []value
	members []member
	raw     []byte // kindRaw
}

// member is one name/value pair of an object.
type member struct {
	name string
	val  value
}

// parser is a strict RFC 8259 parser with the protocol's extra rules: no
// repeated member names, valid UTF-8 only, no lone surrogate escapes, no
// numbers beyond ±2^53 or beyond float64, and a nesting limit.
type parser struct {
	data     []byte
	pos      int
	maxDepth int
	// anyMagnitude turns off the ±2^53 rule, to check plain RFC 8785
	// samples in tests.
	anyMagnitude bool
	// members is a stack of the members of the objects being parsed, each
	// object's copied out once complete: one allocation per object.
	members []member
	// deepest is the most members the stack held in this parse: release
	// clears that much.
	deepest int
}

// parsers keeps parsers for their member stacks.
var parsers = sync.Pool{New: func() any { return new(parser) }}

// release puts p back in parsers, holding nothing of what it parsed.
func (p *parser) release() {
	if cap(p.members) > 1024 {
		p.members = nil
	} else {
		clear(p.members[:p.deepest])
	}
	*p = parser{members: p.members[:0]}
	parsers.Put(p)
}

// dupAfter is the member count past which an object's names are checked
// for a repeat by a map rather than by a scan of those before.
const dupAfter = 16

// parseJSON parses data as exactly one JSON text, with containers nested at
// most maxDepth deep (the outermost object or array is depth 1).
func parseJSON(data []byte, maxDepth int) (value, error) {
	return parseJSONAt(data, maxDepth, 0)
}

// parseJSONAt is parseJSON for a text nested depth deep in another (the
// args, at depth 1 in their envelope): its outermost container is depth+1.
func parseJSONAt(data []byte, maxDepth, depth int) (value, error) {
	p := parsers.Get().(*parser)
	p.data, p.pos, p.maxDepth = data, 0, maxDepth
	defer p.release()
	p.skipSpace()
	v, err := p.value(depth)
	if err != nil {
		return value{}, err
	}
	p.skipSpace()
	if p.pos < len(p.data) {
		return value{}, p.errorf("unexpected %s after the JSON value", p.describe())
	}
	return v, nil
}

func (p *parser) errorf(format string, args ...any) error {
	return &SyntaxError{Offset: p.pos, Msg: fmt.Sprintf(format, args...)}
}

// describe names the byte at the current position for an error message.
func (p *parser) describe() string {
	if p.pos >= len(p.data) {
		return "end of input"
	}
	c := p.data[p.pos]
	if c >= 0x20 && c < 0x7f {
		return fmt.Sprintf("character %q", c)
	}
	return fmt.Sprintf("byte 0x%02x", c)
}

func (p *parser) skipSpace() {
	for p.pos < len(p.data) {
		switch p.data[p.pos] {
		case ' ', '\t', '\n', '\r':
			p.pos++
		default:
			return
		}
	}
}

func (p *parser) value(depth int) (value, error) {
	if p.pos >= len(p.data) {
		return value{}, p.errorf("unexpected end of input, expected a value")
	}
	switch c := p.data[p.pos]; {
	case c == '{':
		return p.object(depth + 1)
	case c == '[':
		return p.array(depth + 1)
	case c == '"':
		s, err := p.string()
		return value{kind: kindString, str: s}, err
	case c == '-' || (c >= '0' && c <= '9'):
		return p.number()
	case c == 't':
		return value{kind: kindBool, boolean: true}, p.literal("true")
	case c == 'f':
		return value{kind: kindBool}, p.literal("false")
	case c == 'n':
		return value{kind: kindNull}, p.literal("null")
	default:
		return value{}, p.errorf("unexpected %s, expected a value", p.describe())
	}
}

func (p *parser) literal(word string) error {
	if !strings.HasPrefix(string(p.data[p.pos:min(len(p.data), p.pos+len(word))]), word) {
		return p.errorf("invalid literal, expected %q", word)
	}
	p.pos += len(word)
	return nil
}

func (p *parser) object(depth int) (value, error) {
	if depth > p.maxDepth {
		return value{}, p.errorf("nesting deeper than %d", p.maxDepth)
	}
	p.pos++ // '{'
	p.skipSpace()
	if p.pos < len(p.data) && p.data[p.pos] == '}' {
		p.pos++
		return value{kind: kindObject, members: []member{}}, nil
	}
	start := len(p.members)
	defer func() { p.members = p.members[:start] }()
	var seen map[string]struct{}
	for {
		if p.pos >= len(p.data) || p.data[p.pos] != '"' {
			return value{}, p.errorf("unexpected %s, expected a member name", p.describe())
		}
		at := p.pos
		name, err := p.string()
		if err != nil {
			return value{}, err
		}
		if p.repeated(start, &seen, name) {
			return value{}, &SyntaxError{Offset: at, Msg: fmt.Sprintf("member name %q repeated", name)}
		}
		p.skipSpace()
		if p.pos >= len(p.data) || p.data[p.pos] != ':' {
			return value{}, p.errorf("unexpected %s, expected ':' after a member name", p.describe())
		}
		p.pos++
		p.skipSpace()
		val, err := p.value(depth)
		if err != nil {
			return value{}, err
		}
		p.members = append(p.members, member{name: name, val: val})
		p.deepest = max(p.deepest, len(p.members))
		p.skipSpace()
		if p.pos >= len(p.data) {
			return value{}, p.errorf("unexpected end of input, expected ',' or '}'")
		}
		switch p.data[p.pos] {
		case ',':
			p.pos++
			p.skipSpace()
		case '}':
			p.pos++
			return value{kind: kindObject, members: slices.Clone(p.members[start:])}, nil
		default:
			return value{}, p.errorf("unexpected %s, expected ',' or '}'", p.describe())
		}
	}
}

// repeated reports whether the object whose members start at start on the
// stack already has a member name; seen is its map of names once it has
// more than dupAfter.
func (p *parser) repeated(start int, seen *map[string]struct{}, name string) bool {
	before := p.members[start:]
	if len(before) < dupAfter {
		for i := range before {
			if before[i].name == name {
				return true
			}
		}
		return false
	}
	if *seen == nil {
		*seen = make(map[string]struct{}, 2*len(before))
		for i := range before {
			(*seen)[before[i].name] = struct{}{}
		}
	}
	if _, dup := (*seen)[name]; dup {
		return true
	}
	(*seen)[name] = struct{}{}
	return false
}

func (p *parser) array(depth int) (value, error) {
	if depth > p.maxDepth {
		return value{}, p.errorf("nesting deeper than %d", p.maxDepth)
	}
	p.pos++ // '['
	v := value{kind: kindArray, array: []value{}}
	p.skipSpace()
	if p.pos < len(p.data) && p.data[p.pos] == ']' {
		p.pos++
		return v, nil
	}
	for {
		elem, err := p.value(depth)
		if err != nil {
			return value{}, err
		}
		v.array = append(v.array, elem)
		p.skipSpace()
		if p.pos >= len(p.data) {
			return value{}, p.errorf("unexpected end of input, expected ',' or ']'")
		}
		switch p.data[p.pos] {
		case ',':
			p.pos++
			p.skipSpace()
		case ']':
			p.pos++
			return v, nil
		default:
			return value{}, p.errorf("unexpected %s, expected ',' or ']'", p.describe())
		}
	}
}

// string parses a string literal at p.pos (which is '"') and returns its
// contents, unescaped.
func (p *parser) string() (string, error) {
	p.pos++ // opening quote
	var b strings.Builder
	start := p.pos
	for {
		if p.pos >= len(p.data) {
			return "", p.errorf("unexpected end of input inside a string")
		}
		c := p.data[p.pos]
		switch {
		case c == '"':
			b.Write(p.data[start:p.pos])
			p.pos++
			return b.String(), nil
		case c == '\\':
			b.Write(p.data[start:p.pos])
			if err := p.escape(&b); err != nil {
				return "", err
			}
			start = p.pos
		case c < 0x20:
			return "", p.errorf("control character 0x%02x in a string must be escaped", c)
		case c < utf8.RuneSelf:
			p.pos++
		default:
			r, size := utf8.DecodeRune(p.data[p.pos:])
			if r == utf8.RuneError && size <= 1 {
				return "", p.errorf("invalid UTF-8 (byte 0x%02x)", c)
			}
			p.pos += size
		}
	}
}

// escape parses one escape sequence at p.pos (which is '\') into b.
func (p *parser) escape(b *strings.Builder) error {
	at := p.pos
	if p.pos+1 >= len(p.data) {
		return p.errorf("unexpected end of input in an escape sequence")
	}
	c := p.data[p.pos+1]
	p.pos += 2
	switch c {
	case '"', '\\', '/':
		b.WriteByte(c)
	case 'b':
		b.WriteByte('\b')
	case 'f':
		b.WriteByte('\f')
	case 'n':
		b.WriteByte('\n')
	case 'r':
		b.WriteByte('\r')
	case 't':
		b.WriteByte('\t')
	case 'u':
		r, err := p.hex4(at)
		if err != nil {
			return err
		}
		switch {
		case utf16.IsSurrogate(r) && r >= 0xdc00:
			return &SyntaxError{Offset: at, Msg: fmt.Sprintf(`lone surrogate escape \u%04x (a low surrogate with no high surrogate before it)`, r)}
		case utf16.IsSurrogate(r):
			lowAt := p.pos
			if p.pos+1 >= len(p.data) || p.data[p.pos] != '\\' || p.data[p.pos+1] != 'u' {
				return &SyntaxError{Offset: at, Msg: fmt.Sprintf(`lone surrogate escape \u%04x (a high surrogate not followed by a \u low surrogate)`, r)}
			}
			p.pos += 2
			r2, err := p.hex4(lowAt)
			if err != nil {
				return err
			}
			if r2 < 0xdc00 || r2 > 0xdfff {
				return &SyntaxError{Offset: at, Msg: fmt.Sprintf(`lone surrogate escape \u%04x (followed by \u%04x, not a low surrogate)`, r, r2)}
			}
			r = utf16.DecodeRune(r, r2)
		}
		b.WriteRune(r)
	default:
		p.pos = at
		return p.errorf("invalid escape sequence %q", "\\"+string(rune(c)))
	}
	return nil
}

// hex4 parses the four hex digits of a \u escape that started at at.
func (p *parser) hex4(at int) (rune, error) {
	if p.pos+4 > len(p.data) {
		return 0, &SyntaxError{Offset: at, Msg: `truncated \u escape, expected four hex digits`}
	}
	var r rune
	for _, c := range p.data[p.pos : p.pos+4] {
		var d byte
		switch {
		case c >= '0' && c <= '9':
			d = c - '0'
		case c >= 'a' && c <= 'f':
			d = c - 'a' + 10
		case c >= 'A' && c <= 'F':
			d = c - 'A' + 10
		default:
			return 0, &SyntaxError{Offset: at, Msg: `invalid \u escape, expected four hex digits`}
		}
		r = r<<4 | rune(d)
	}
	p.pos += 4
	return r, nil
}

// number parses a number at p.pos per the RFC 8259 grammar
// -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)? and rejects one that
// overflows float64 or whose magnitude exceeds 2^53.
func (p *parser) number() (value, error) {
	start := p.pos
	if p.data[p.pos] == '-' {
		p.pos++
	}
	switch {
	case p.pos < len(p.data) && p.data[p.pos] == '0':
		p.pos++
		if p.pos < len(p.data) && isDigit(p.data[p.pos]) {
			return value{}, p.errorf("invalid number: leading zero")
		}
	case p.pos < len(p.data) && isDigit(p.data[p.pos]):
		p.digits()
	default:
		return value{}, p.errorf("invalid number: expected a digit, found %s", p.describe())
	}
	if p.pos < len(p.data) && p.data[p.pos] == '.' {
		p.pos++
		if p.pos >= len(p.data) || !isDigit(p.data[p.pos]) {
			return value{}, p.errorf("invalid number: expected a digit after '.', found %s", p.describe())
		}
		p.digits()
	}
	if p.pos < len(p.data) && (p.data[p.pos] == 'e' || p.data[p.pos] == 'E') {
		p.pos++
		if p.pos < len(p.data) && (p.data[p.pos] == '+' || p.data[p.pos] == '-') {
			p.pos++
		}
		if p.pos >= len(p.data) || !isDigit(p.data[p.pos]) {
			return value{}, p.errorf("invalid number: expected an exponent digit, found %s", p.describe())
		}
		p.digits()
	}
	lit := string(p.data[start:p.pos])
	f, err := strconv.ParseFloat(lit, 64)
	if err != nil || math.IsInf(f, 0) {
		return value{}, &SyntaxError{Offset: start, Msg: fmt.Sprintf("number %s is beyond the range of a float64", clip(lit))}
	}
	if a := math.Abs(f); !p.anyMagnitude && (a > maxSafeInteger || (a == maxSafeInteger && exceedsSafe(lit))) {
		return value{}, &SyntaxError{Offset: start, Msg: fmt.Sprintf("number %s is beyond ±2^53 (9007199254740992) and cannot be kept exactly; send big identifiers as strings", clip(lit))}
	}
	return value{kind: kindNumber, number: f}, nil
}

func (p *parser) digits() {
	for p.pos < len(p.data) && isDigit(p.data[p.pos]) {
		p.pos++
	}
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// clip shortens a long literal for an error message.
func clip(s string) string {
	if len(s) > 40 {
		return s[:37] + "..."
	}
	return s
}

// exceedsSafe reports whether the exact decimal value of the well-formed
// number literal lit has a magnitude above 2^53. It is consulted only when lit
// rounds to ±2^53, where rounding may hide a value just above it (such as
// 9007199254740993).
func exceedsSafe(lit string) bool {
	lit = strings.TrimPrefix(lit, "-")
	mant, exp, _ := strings.Cut(strings.ToLower(lit), "e")
	intPart, frac, _ := strings.Cut(mant, ".")
	digits := intPart + frac
	// value = 0.digits × 10^point
	point := len(intPart)
	if exp != "" {
		e, err := strconv.Atoi(exp)
		if err != nil {
			return true // an exponent this long cannot round to 2^53
		}
		point += e
	}
	trimmed := strings.TrimLeft(digits, "0")
	point -= len(digits) - len(trimmed)
	digits = strings.TrimRight(trimmed, "0")
	const safe = "9007199254740992" // 2^53 = 0.9007199254740992 × 10^16
	switch {
	case point != 16:
		return point > 16
	default:
		// Same decimal exponent: compare digit strings; a longer string
		// with safe as its prefix is larger.
		return digits > safe
	}
}
