package text_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/pkg/effects/internal/text"
)

func TestText(t *testing.T) {
	t.Parallel()
	for d, want := range map[time.Duration]string{168 * time.Hour: "168h", 90 * time.Second: "1m30s", 2 * time.Minute: "2m", 200 * time.Millisecond: "200ms"} {
		require.Equal(t, want, text.FormatDuration(d))
	}
	require.Equal(t, "https://h.example/p", text.URL("https://u:pw@h.example/p?token=t#f"))
	require.Equal(t, "(an invalid URL)", text.URL("http://[::1"))
	require.Equal(t, "a [redacted] b [redacted]", text.Redact("a tok-123 b s3cret", []string{"tok-123", "s3cret"}))
	require.Equal(t, 2, text.EditDistance("send_emial", "send_email"), "a transposition is two edits")
	require.Equal(t, 0, text.EditDistance("a", "a"))
}
