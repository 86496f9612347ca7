package intent

import (
	"cmp"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// MaxCanonicalDepth is the nesting limit of Canonicalize and of Derive's
// check of a hand-built envelope, far above any intent's (Limits.MaxDepth)
// so that whatever Decode accepts canonicalizes.
const MaxCanonicalDepth = 1000

const maxCanonicalDepth = MaxCanonicalDepth

// Canonicalize returns the RFC 8785 (JSON Canonicalization Scheme) form of the
// JSON text data: object members sorted by the UTF-16 code units of their
// names, no insignificant whitespace, strings with the minimal escapes and
// numbers written as ECMAScript writes them (1.0 → 1, 1e-7 → 1e-7, -0 → 0).
//
// It applies the protocol's strict rules: a repeated member name, invalid
// UTF-8, a lone surrogate escape, a number that overflows float64 or whose
// magnitude is above 2^53, trailing data and nesting deeper than 1000 are
// rejected with a *SyntaxError (which wraps ErrInvalid) giving the byte
// offset.
func Canonicalize(data []byte) ([]byte, error) {
	v, err := parseJSON(data, maxCanonicalDepth)
	if err != nil {
		return nil, err
	}
	return appendCanonical(nil, &v), nil
}

// appendCanonical appends the RFC 8785 encoding of v to b.
func appendCanonical(b []byte, v *value) []byte {
	switch v.kind {
	case kindNull:
		return append(b, "null"...)
	case kindBool:
		return strconv.AppendBool(b, v.boolean)
	case kindNumber:
		return appendNumber(b, v.number)
	case kindString:
		return appendString(b, v.str)
	case kindRaw:
		return append(b, v.raw...)
	case kindArray:
		b = append(b, '[')
		for i := range v.array {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendCanonical(b, &v.array[i])
		}
		return append(b, ']')
	default:
		members := v.members
		if !slices.IsSortedFunc(members, byName) {
			members = slices.Clone(members)
			slices.SortFunc(members, byName)
		}
		b = append(b, '{')
		for i := range members {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendString(b, members[i].name)
			b = append(b, ':')
			b = appendCanonical(b, &members[i].val)
		}
		return append(b, '}')
	}
}

// byName orders members as RFC 8785 does.
func byName(x, y member) int { return compareUTF16(x.name, y.name) }

// compareUTF16 orders two valid UTF-8 strings by their UTF-16 code units,
// as RFC 8785 sorts member names. It differs from byte (code point) order
// only between a supplementary character (U+10000 and up, a surrogate pair
// starting 0xD800-0xDBFF) and a BMP character from U+E000 to U+FFFF: in
// UTF-16 the supplementary one sorts first.
func compareUTF16(a, b string) int {
	for a != "" && b != "" {
		ra, na := utf8.DecodeRuneInString(a)
		rb, nb := utf8.DecodeRuneInString(b)
		if ra != rb {
			if ua, ub := firstUnit(ra), firstUnit(rb); ua != ub {
				return cmp.Compare(ua, ub)
			}
			// Both supplementary with the same high surrogate: their low
			// surrogates are ordered as the characters are.
			return cmp.Compare(ra, rb)
		}
		a, b = a[na:], b[nb:]
	}
	return cmp.Compare(len(a), len(b))
}

// firstUnit is the first UTF-16 code unit of r.
func firstUnit(r rune) rune {
	if r >= 0x10000 {
		return 0xd800 + (r-0x10000)>>10
	}
	return r
}

// AppendCanonicalString appends s as an RFC 8785 string literal: only '"',
// '\\' and the control characters U+0000-U+001F are escaped, the latter as
// \b \f \n \r \t or \u00xx (lowercase hex); every other character is
// literal UTF-8. Invalid UTF-8 in s becomes U+FFFD (one for each run of
// invalid bytes), so that every string has a canonical form.
func AppendCanonicalString(b []byte, s string) []byte {
	// Most strings (keys, digests, names) are printable ASCII: one pass
	// tells, and they are copied as they are.
	i := 0
	for i < len(s) && plainByte[s[i]] {
		i++
	}
	if i == len(s) {
		b = append(b, '"')
		b = append(b, s...)
		return append(b, '"')
	}
	if !utf8.ValidString(s[i:]) {
		s = strings.ToValidUTF8(s, "\uFFFD")
	}
	return appendString(b, s)
}

// appendString is AppendCanonicalString of s, valid UTF-8 (as the parser
// leaves every string).
func appendString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' {
			continue
		}
		b = appendEscapedByte(append(b, s[start:i]...), c)
		start = i + 1
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

// appendNumber appends f as ECMAScript's Number.prototype.toString writes it
// (ECMA-262, Number::toString), which RFC 8785 adopts. f must be finite.
func appendNumber(b []byte, f float64) []byte {
	if f == 0 { // 0 and -0
		return append(b, '0')
	}
	if f < 0 {
		b = append(b, '-')
		f = -f
	}
	// The shortest digits that round-trip: "d.ddde±x". ECMAScript's k is
	// len(digits), its n is the exponent plus one: f = 0.digits × 10^n.
	e := strconv.FormatFloat(f, 'e', -1, 64)
	mant, exp, _ := strings.Cut(e, "e")
	digits := strings.Replace(mant, ".", "", 1)
	x, _ := strconv.Atoi(exp)
	k, n := len(digits), x+1
	switch {
	case k <= n && n <= 21: // integer: digits then n-k zeros
		b = append(b, digits...)
		for range n - k {
			b = append(b, '0')
		}
	case 0 < n && n <= 21: // decimal point inside the digits
		b = append(b, digits[:n]...)
		b = append(b, '.')
		b = append(b, digits[n:]...)
	case -6 < n && n <= 0: // 0.000ddd
		b = append(b, '0', '.')
		for range -n {
			b = append(b, '0')
		}
		b = append(b, digits...)
	default: // exponent form: d[.ddd]e±(n-1)
		b = append(b, digits[0])
		if k > 1 {
			b = append(b, '.')
			b = append(b, digits[1:]...)
		}
		b = append(b, 'e')
		if n-1 >= 0 {
			b = append(b, '+')
		}
		b = strconv.AppendInt(b, int64(n-1), 10)
	}
	return b
}
