package toolsfile

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestRetentionParse(t *testing.T) {
	t.Parallel()
	reg, err := Parse([]byte(`tools:
  short: {effect: noop, key_args: all, retention: 1h}
  weekly: {effect: noop, key_args: all, window: 168h, retention: 192h}
  plain: {effect: noop, key_args: all}
`))
	require.NoError(t, err)
	for name, want := range map[string]time.Duration{"short": time.Hour, "weekly": 192 * time.Hour, "plain": 0} {
		tool, ok := reg.Lookup(name)
		require.True(t, ok, name)
		require.Equal(t, want, tool.Policy.Retention, name)
	}
}

func TestRetentionErrors(t *testing.T) {
	t.Parallel()
	cases := []struct{ name, tool, want string }{
		{"not a duration", `{effect: noop, retention: soon}`, `tools.yaml:2: t.retention: "soon" is not a duration`},
		{"under a second", `{effect: noop, retention: 500ms}`, `tools.yaml:2: t.retention: must be at least 1s`},
		{"fraction", `{effect: noop, retention: 1500ms}`, `tools.yaml:2: t.retention: 1.5s is not a whole number of seconds`},
		{"read", `{effect: noop, class: read, retention: 1h}`, `tools.yaml:2: t.retention: a tool without the ledger keeps no record`},
		{"shorter than the window", `{effect: noop, window: 168h, retention: 24h}`,
			`tools.yaml:2: t.retention: 24h is shorter than the tool's window (168h)`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse([]byte("tools:\n  t: " + c.tool + "\n"))
			require.ErrorContains(t, err, c.want)
		})
	}
}
