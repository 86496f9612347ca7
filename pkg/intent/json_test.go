package intent

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestParseRejects covers every rule of the strict parser: each rejection
// names the problem and the byte offset where it was found.
func TestParseRejects(t *testing.T) {
	t.Parallel()
	deep := strings.Repeat("[", 33) + strings.Repeat("]", 33)
	cases := []struct {
		name, in string
		offset   int
		msg      string
	}{
		{"empty input", ``, 0, "unexpected end of input, expected a value"},
		{"only whitespace", "  \n", 3, "unexpected end of input"},
		{"repeated member name", `{"a":1,"b":2,"a":3}`, 13, `member name "a" repeated`},
		{"repeated name via escape", `{"a":1,"\u0061":2}`, 7, `member name "a" repeated`},
		{"repeated name nested", `{"x":{"k":1,"k":1}}`, 12, `member name "k" repeated`},
		{"repeated name in a large object", manyMembers(20) + `,"m2":0}`, len(manyMembers(20)) + 1, `member name "m2" repeated`},
		{"repeated name past the scan", manyMembers(40) + `,"m39":0}`, len(manyMembers(40)) + 1, `member name "m39" repeated`},
		{"invalid UTF-8", "\"ab\xffc\"", 3, "invalid UTF-8 (byte 0xff)"},
		{"invalid UTF-8 in a name", "{\"\xc3\":1}", 2, "invalid UTF-8"},
		{"UTF-8 encoded surrogate", "\"\xed\xa0\x80\"", 1, "invalid UTF-8"},
		{"overlong UTF-8", "\"\xc0\xaf\"", 1, "invalid UTF-8"},
		{"lone high surrogate", `"\ud800"`, 1, `lone surrogate escape \ud800 (a high surrogate not followed by a \u low surrogate)`},
		{"high surrogate then letter", `"\ud83dx"`, 1, `lone surrogate escape \ud83d`},
		{"high surrogate then BMP escape", `"\ud800\u0041"`, 1, `followed by \u0041, not a low surrogate`},
		{"two high surrogates", `"\ud800\ud800"`, 1, `not a low surrogate`},
		{"lone low surrogate", `"\udc00"`, 1, `lone surrogate escape \udc00 (a low surrogate with no high surrogate before it)`},
		{"integer above 2^53", `9007199254740993`, 0, "beyond ±2^53"},
		{"integer below -2^53", `[-9007199254740993]`, 1, "beyond ±2^53"},
		{"big id", `{"id":12345678901234567890}`, 6, "send big identifiers as strings"},
		{"2^53 plus a fraction", `9007199254740992.5`, 0, "beyond ±2^53"},
		{"2^53 plus one in exponent form", `0.9007199254740993e16`, 0, "beyond ±2^53"},
		{"large exponent", `1e21`, 0, "beyond ±2^53"},
		{"overflow", `1e400`, 0, "beyond the range of a float64"},
		{"negative overflow", `-1.8e308`, 0, "beyond the range of a float64"},
		{"trailing garbage", `{"a":1} x`, 8, `unexpected character 'x' after the JSON value`},
		{"two values", `1 2`, 2, "after the JSON value"},
		{"nesting too deep", deep, 32, "nesting deeper than 32"},
		{"leading zero", `01`, 1, "leading zero"},
		{"plus sign", `+1`, 0, "expected a value"},
		{"bare point", `1.`, 2, "expected a digit after '.'"},
		{"empty exponent", `1e`, 2, "expected an exponent digit"},
		{"NaN literal", `NaN`, 0, "expected a value"},
		{"single quotes", `{'a':1}`, 1, "expected a member name"},
		{"trailing comma", `[1,]`, 3, "expected a value"},
		{"trailing comma in object", `{"a":1,}`, 7, "expected a member name"},
		{"missing colon", `{"a" 1}`, 5, "expected ':'"},
		{"unterminated string", `"abc`, 4, "end of input inside a string"},
		{"raw control character", "\"a\tb\"", 2, "control character 0x09 in a string must be escaped"},
		{"bad escape", `"\x"`, 1, `invalid escape sequence "\\x"`},
		{"short unicode escape", `"\u12"`, 1, `\u escape`},
		{"bad literal", `tru`, 0, `invalid literal, expected "true"`},
		{"byte order mark", "\ufeff{}", 0, "byte 0xef"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			depth := DefaultMaxDepth
			_, err := parseJSON([]byte(tc.in), depth)
			require.Error(t, err)
			require.ErrorIs(t, err, ErrInvalid)
			var se *SyntaxError
			require.True(t, errors.As(err, &se))
			require.Equal(t, tc.offset, se.Offset, "offset, error %q", err)
			require.Contains(t, err.Error(), tc.msg)
			require.True(t, strings.HasPrefix(err.Error(), "intent: invalid: at byte "), err.Error())
		})
	}
}

func TestParseDepth(t *testing.T) {
	t.Parallel()
	ok := strings.Repeat(`{"a":`, 31) + "[]" + strings.Repeat("}", 31)
	_, err := parseJSON([]byte(ok), 32)
	require.NoError(t, err)
	_, err = parseJSON([]byte("["+ok+"]"), 32)
	require.ErrorContains(t, err, "nesting deeper than 32")
}

// manyMembers is the start of an object of n members m0...m(n-1), without
// its closing brace.
func manyMembers(n int) string {
	var b strings.Builder
	b.WriteString("{")
	for i := range n {
		if i > 0 {
			b.WriteString(",")
		}
		fmt.Fprintf(&b, `"m%d":%d`, i, i)
	}
	return b.String()
}

// Objects nested in objects keep their own members, each object's in its
// order, and a parse that failed leaves nothing behind for the next.
func TestParseObjectsKeepTheirMembers(t *testing.T) {
	t.Parallel()
	_, err := parseJSON([]byte(`{"a":{"b":1,"c":{"d":2,"d":3}}}`), 32)
	require.Error(t, err)
	in := `{"z":1,"y":{"x":[{"w":2,"v":{}}],"u":3},"t":` + manyMembers(20) + `}}`
	v, err := parseJSON([]byte(in), 32)
	require.NoError(t, err)
	require.Len(t, v.members, 3)
	require.Equal(t, []string{"z", "y", "t"}, []string{v.members[0].name, v.members[1].name, v.members[2].name})
	y := v.members[1].val
	require.Len(t, y.members, 2)
	require.Equal(t, "u", y.members[1].name)
	require.Len(t, y.members[0].val.array[0].members, 2)
	require.Len(t, v.members[2].val.members, 20)
	require.Equal(t, `{"t":`+canonicalMany(20)+`,"y":{"u":3,"x":[{"v":{},"w":2}]},"z":1}`, string(appendCanonical(nil, &v)))
}

// canonicalMany is manyMembers(n) closed and in RFC 8785 order.
func canonicalMany(n int) string {
	names := make([]string, n)
	for i := range n {
		names[i] = fmt.Sprintf("m%d", i)
	}
	slices.Sort(names)
	var b strings.Builder
	b.WriteString("{")
	for i, name := range names {
		if i > 0 {
			b.WriteString(",")
		}
		fmt.Fprintf(&b, `"%s":%s`, name, name[1:])
	}
	b.WriteString("}")
	return b.String()
}
