package intent

import (
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"math"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestCanonicalizeRFC8785 checks the examples of RFC 8785 itself.
func TestCanonicalizeRFC8785(t *testing.T) {
	t.Parallel()
	cases := []struct{ name, in, want string }{
		{
			name: "section 3.2.2 sample",
			in: `{
  "numbers": [333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001],
  "string": "\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/",
  "literals": [null, true, false]
}`,
			want: `{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],"string":"€$\u000f\nA'B\"\\\\\"/"}`,
		},
		{
			name: "section 3.2.3 sorting by UTF-16 code units",
			in: `{
  "\u20ac": "Euro Sign",
  "\r": "Carriage Return",
  "\ufb33": "Hebrew Letter Dalet With Dagesh",
  "1": "One",
  "\ud83d\ude00": "Emoji: Grinning Face",
  "\u0080": "Control",
  "\u00f6": "Latin Small Letter O With Diaeresis"
}`,
			want: "{\"\\r\":\"Carriage Return\",\"1\":\"One\",\"\u0080\":\"Control\",\"ö\":\"Latin Small Letter O With Diaeresis\"," +
				"\"€\":\"Euro Sign\",\"😀\":\"Emoji: Grinning Face\",\"\uFB33\":\"Hebrew Letter Dalet With Dagesh\"}",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			// The protocol rejects 1E30 (beyond ±2^53); RFC 8785 itself
			// does not, so the sample is checked with that rule off.
			p := &parser{data: []byte(tc.in), maxDepth: maxCanonicalDepth, anyMagnitude: true}
			v, err := p.value(0)
			require.NoError(t, err)
			require.Equal(t, tc.want, string(appendCanonical(nil, &v)))
		})
	}
}

func TestCanonicalizeRules(t *testing.T) {
	t.Parallel()
	cases := []struct{ name, in, want string }{
		{"whitespace dropped", " { \"a\" : [ 1 , 2 ] }\r\n\t", `{"a":[1,2]}`},
		{"nested objects sorted", `{"b":{"d":1,"c":2},"a":[{"z":0,"y":0}]}`, `{"a":[{"y":0,"z":0}],"b":{"c":2,"d":1}}`},
		{"arrays keep order", `[3,1,2]`, `[3,1,2]`},
		{"scalars at top level", `"x"`, `"x"`},
		{"empty containers", `{"a":{},"b":[]}`, `{"a":{},"b":[]}`},
		{"control characters", `"\u0000\u0001\b\f\n\r\t\u001f\u007f"`, "\"\\u0000\\u0001\\b\\f\\n\\r\\t\\u001f\x7f\""},
		{"quote and backslash", `"\"\\"`, `"\"\\"`},
		{"solidus unescaped", `"\/"`, `"/"`},
		{"line separator literal", `"\u2028\u2029"`, "\"\u2028\u2029\""},
		{"non-BMP from escapes", `"\ud83d\ude00"`, `"😀"`},
		{"non-BMP literal", `"😀"`, `"😀"`},
		{"uppercase hex escapes", `"\u00E9\u00e9"`, `"éé"`},
		{"prefix sorts first", `{"ab":1,"a":2}`, `{"a":2,"ab":1}`},
		{"UTF-16 order differs from UTF-8 order", `{"\ufb33":1,"\ud83d\ude00":2}`, "{\"😀\":2,\"\uFB33\":1}"},
		{"same high surrogate", `{"\ud83d\ude01":1,"\ud83d\ude00":2}`, `{"😀":2,"😁":1}`},
		{"integer spelled as float", `[1.0,1.50,-0,-0.0,0e10]`, `[1,1.5,0,0,0]`},
		{"exponents", `[1e-7,1E-6,123e-20,5e-7,1e2]`, `[1e-7,0.000001,1.23e-18,5e-7,100]`},
		{"safe integers", `[9007199254740991,-9007199254740992,9007199254740992.0]`, `[9007199254740991,-9007199254740992,9007199254740992]`},
		{"underflow is zero", `1e-400`, `0`},
		{"literals", `[true,false,null]`, `[true,false,null]`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := Canonicalize([]byte(tc.in))
			require.NoError(t, err)
			require.Equal(t, tc.want, string(got))
		})
	}
}

// TestNumberFormat checks the ECMAScript number layout, with the samples of
// RFC 8785 appendix B (IEEE 754 bit patterns) and a few more.
func TestNumberFormat(t *testing.T) {
	t.Parallel()
	bits := []struct{ hex, want string }{
		{"0000000000000000", "0"},
		{"8000000000000000", "0"},
		{"0000000000000001", "5e-324"},
		{"8000000000000001", "-5e-324"},
		{"7fefffffffffffff", "1.7976931348623157e+308"},
		{"ffefffffffffffff", "-1.7976931348623157e+308"},
		{"4340000000000000", "9007199254740992"},
		{"c340000000000000", "-9007199254740992"},
		{"4430000000000000", "295147905179352830000"},
		{"44b52d02c7e14af5", "9.999999999999997e+22"},
		{"44b52d02c7e14af6", "1e+23"},
		{"44b52d02c7e14af7", "1.0000000000000001e+23"},
		{"444b1ae4d6e2ef4e", "999999999999999700000"},
		{"444b1ae4d6e2ef4f", "999999999999999900000"},
		{"444b1ae4d6e2ef50", "1e+21"},
		{"3eb0c6f7a0b5ed8c", "9.999999999999997e-7"},
		{"3eb0c6f7a0b5ed8d", "0.000001"},
		{"41b3de4355555553", "333333333.3333332"},
		{"41b3de4355555554", "333333333.33333325"},
		{"41b3de4355555555", "333333333.3333333"},
		{"41b3de4355555556", "333333333.3333334"},
		{"41b3de4355555557", "333333333.33333343"},
		{"becbf647612f3696", "-0.0000033333333333333333"},
		{"43143ff3c1cb0959", "1424953923781206.2"},
	}
	for _, tc := range bits {
		raw, err := hex.DecodeString(tc.hex)
		require.NoError(t, err)
		f := math.Float64frombits(binary.BigEndian.Uint64(raw))
		require.Equal(t, tc.want, string(appendNumber(nil, f)), "bits %s", tc.hex)
	}
	more := []struct {
		f    float64
		want string
	}{
		{1.0, "1"},
		{1e21, "1e+21"},
		{1e20, "100000000000000000000"},
		{1.2345678901234568e20, "123456789012345680000"},
		{1e-7, "1e-7"},
		{1.5e-7, "1.5e-7"},
		{0.000001, "0.000001"},
		{math.Copysign(0, -1), "0"},
		{0.1, "0.1"},
		{-1.5, "-1.5"},
		{123.456, "123.456"},
		{1e30, "1e+30"},
	}
	for _, tc := range more {
		require.Equal(t, tc.want, string(appendNumber(nil, tc.f)), "%v", tc.f)
	}
}

func TestCompareUTF16(t *testing.T) {
	t.Parallel()
	ordered := []string{"", "\r", "1", "a", "ab", "b", "\u0080", "ö", "€", "\U0001F600", "\U0001F601", "\U0010FFFF", "\uE000", "\uFB33", "\uFFFF"}
	for i := range ordered {
		for j := range ordered {
			got := compareUTF16(ordered[i], ordered[j])
			switch {
			case i < j:
				require.Negative(t, got, "%q < %q", ordered[i], ordered[j])
			case i > j:
				require.Positive(t, got, "%q > %q", ordered[i], ordered[j])
			default:
				require.Zero(t, got)
			}
		}
	}
}

// The quick check takes data for canonical only when the canonicalizer
// leaves it as it is, and it takes the common results.
func TestIsCanonical(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		data string
		want bool
	}{
		{`{}`, true},
		{`[]`, true},
		{`{"a":1,"b":[true,false,null,-12,0,"x"],"c":{"d":"é☃𝄞 \"q\" \\ \n\t\u001f\u0000"}}`, true},
		{`{"echo":{"n":123456789012345,"pad":"xxxx"}}`, true},
		{`"plain"`, true},
		{`0`, true},
		{`{"b":1,"a":2}`, false},    // order
		{`{"a":1,"a":1}`, false},    // repeated
		{`{"a": 1}`, false},         // whitespace
		{` {}`, false},              // whitespace
		{`{} `, false},              // whitespace
		{`1.5`, false},              // not an integer: the long way
		{`1e3`, false},              // exponent
		{`-0`, false},               // canonical: 0
		{`01`, false},               // leading zero
		{`1234567890123456`, false}, // 16 digits
		{`"\u0041"`, false},         // needless escape
		{`"\/"`, false},             // needless escape
		{`"\u000a"`, false},         // \n
		{`"\u001F"`, false},         // uppercase hex
		{`"\ud800"`, false},         // lone surrogate
		{"\"\xff\"", false},         // invalid UTF-8
		{"\"\x01\"", false},         // raw control character
		{`{"é":1}`, false},          // non-ASCII name: the long way
		{`{"a\"":1}`, false},        // escaped name: the long way
		{`[1,]`, false},             // not JSON
		{`{"a":1`, false},           // truncated
		{`"abc`, false},             // truncated
		{`tru`, false},              // truncated
		{`"\u0100"`, false},         // needless escape of a non-control character
		{"\"\xed\xa0\x80\"", false}, // UTF-8 of a surrogate
		{strings.Repeat("[", 65) + strings.Repeat("]", 65), true},
		{strings.Repeat("[", 66) + strings.Repeat("]", 66), false}, // deeper than the scanner goes: the long way
	} {
		got := IsCanonical([]byte(c.data))
		require.Equalf(t, c.want, got, "%s", c.data)
		if got {
			canon, err := Canonicalize([]byte(c.data))
			require.NoError(t, err, c.data)
			require.Equal(t, string(canon), c.data)
		}
	}
}

// Whatever the quick check takes is what the canonicalizer makes of it.
func FuzzIsCanonical(f *testing.F) {
	f.Add([]byte(`{"a":1,"b":[true,false,null,-12,0,"x"],"c":{"d":"é \"q\" \\ \n\u001f"}}`))
	f.Add([]byte(`{"b":1,"a":2}`))
	f.Add([]byte(`[1.5,1e3,-0,"\u0041"]`))
	for _, s := range jsonSeeds {
		f.Add([]byte(s))
	}
	var vectors []struct{ Envelope, Material string }
	if data, err := os.ReadFile(vectorsFile); err == nil && json.Unmarshal(data, &vectors) == nil {
		for _, v := range vectors {
			f.Add([]byte(v.Envelope))
			f.Add([]byte(v.Material))
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if !IsCanonical(data) {
			return
		}
		canon, err := Canonicalize(data)
		if err != nil {
			t.Fatalf("taken as canonical, but the canonicalizer refuses it: %q: %v", data, err)
		}
		if string(canon) != string(data) {
			t.Fatalf("taken as canonical: %q, but its canonical form is %q", data, canon)
		}
	})
}

// The canonical string encoding: RFC 8785's escapes, everything else
// literal, and invalid UTF-8 (which has no canonical form) as U+FFFD, one
// for each run of invalid bytes.
func TestAppendCanonicalString(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ in, want string }{
		{"", `""`},
		{"plain ascii", `"plain ascii"`},
		{"\"\\/", `"\"\\/"`},
		{"\x00\x01\b\f\n\r\t\x1f\x7f", "\"\\u0000\\u0001\\b\\f\\n\\r\\t\\u001f\x7f\""},
		{"é😀\u2028\u2029<&>", "\"é😀\u2028\u2029<&>\""},
		{"a\xffb", "\"a\uFFFDb\""},
		{"a\xff\xfeb\xed\xa0\x80", "\"a\uFFFDb\uFFFD\""},
		{"\xc3\n", "\"\uFFFD\\n\""},
	} {
		got := AppendCanonicalString([]byte("x"), c.in)
		require.Equal(t, "x"+c.want, string(got), "%q", c.in)
		canon, err := Canonicalize(got[1:])
		require.NoError(t, err, "%q", c.in)
		require.Equal(t, c.want, string(canon), "%q", c.in)
		require.True(t, IsCanonical(got[1:]), "%q", c.in)
	}
}
