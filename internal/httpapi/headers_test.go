package httpapi

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestIdempotencyKeyHeader(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		values    []string
		want, err string
	}{
		{nil, "", ""},
		{[]string{"order-1"}, "order-1", ""},
		{[]string{`"order-1"`}, "order-1", ""},
		{[]string{`"a \"quoted\" \\ key"`}, `a "quoted" \ key`, ""},
		{[]string{" spaced "}, "spaced", ""},
		{[]string{""}, "", "is empty"},
		{[]string{`""`}, "", "is empty"},
		{[]string{`"open`}, "", "no closing quote"},
		{[]string{`"a"b`}, "", "after the closing quote"},
		{[]string{`"a\x"`}, "", "backslash"},
		{[]string{"a", "b"}, "", "more than one"},
	} {
		h := http.Header{}
		for _, v := range c.values {
			h.Add(HeaderIdempotencyKey, v)
		}
		got, err := idempotencyKey(h)
		if c.err != "" {
			require.ErrorContains(t, err, c.err, c.values)
			continue
		}
		require.NoError(t, err, c.values)
		require.Equal(t, c.want, got)
	}
}

func TestPreferWait(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		prefer string
		want   time.Duration
		set    bool
	}{
		{"", 0, false},
		{"wait=10", 10 * time.Second, true},
		{"respond-async, wait=2.5", 2500 * time.Millisecond, true},
		{"handling=lenient; x=1, Wait = 3", 3 * time.Second, true},
		{`wait="4"`, 4 * time.Second, true},
		{"return=minimal", 0, false},
		// A preference the server cannot honour is ignored (RFC 7240).
		{"wait=-1", 0, false},
		{"wait=soon", 0, false},
		{"wait=soon, wait=5", 0, false}, // only the first counts
	} {
		h := http.Header{}
		if c.prefer != "" {
			h.Set("Prefer", c.prefer)
		}
		d, set := preferredWait(h)
		require.Equal(t, c.set, set, c.prefer)
		require.Equal(t, c.want, d, c.prefer)
	}
	require.Equal(t, time.Second, clampWait(0, time.Minute))
	require.Equal(t, time.Minute, clampWait(time.Hour, time.Minute))
}
