package reply_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/pkg/effects/internal/reply"
)

func TestResult(t *testing.T) {
	t.Parallel()
	for body, want := range map[string]string{
		"":                  `null`,
		" {\"a\": [1, 2]} ": `{"a":[1,2]}`,
		"plain <text>":      `"plain <text>"`,
		"\xff":              "\"\uFFFD\"",
	} {
		require.Equal(t, want, string(reply.Result([]byte(body))), body)
	}
	long := strings.Repeat("x", reply.MaxResult+1)
	require.Equal(t, `"`+long[:reply.MaxResult]+`"`, string(reply.Result([]byte(long))), "cut, and so a string")
}

func TestQuote(t *testing.T) {
	t.Parallel()
	require.Equal(t, "busy", reply.Quote([]byte("  busy\n")))
	q := reply.Quote([]byte(strings.Repeat("y", reply.QuoteLimit+10)))
	require.Equal(t, strings.Repeat("y", reply.QuoteLimit)+"…", q)
}
