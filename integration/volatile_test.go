package integration

import (
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// demoTools is the demo tools file with its webhooks pointed at url instead
// of the demo sink's 127.0.0.1:8787.
func demoTools(t *testing.T, url string) string {
	t.Helper()
	data, err := os.ReadFile("../deployments/demo/tools.yaml")
	require.NoError(t, err)
	return writeTools(t, strings.ReplaceAll(string(data), "http://127.0.0.1:8787", url))
}

// The demo's create_ticket declares requested_at volatile and has no key
// args: two calls that differ only in requested_at (09:00, then 09:05) are
// one operation. The second is replayed, and one ticket is created.
func TestVolatileArgsLeaveTheKey(t *testing.T) {
	t.Parallel()
	url := jetStream(t)
	hook := newSink(t, nil)
	startWorker(t, "w1", url, demoTools(t, hook.URL))

	first := submit(t, url, "--tool", "create_ticket", "--session", "run-7",
		"--args", `{"title":"Disk full on db-1","requested_at":"2026-11-30T09:00:00Z"}`, "--wait", "30s")
	require.Equal(t, 0, first.code, first.stdout+first.stderr)
	again := submit(t, url, "--tool", "create_ticket", "--session", "run-7",
		"--args", `{"title":"Disk full on db-1","requested_at":"2026-11-30T09:05:00Z"}`, "--wait", "30s")
	require.Equal(t, 3, again.code, "the retry five minutes later is replayed: %s %s", again.stdout, again.stderr)
	require.Equal(t, first.res.Key, again.res.Key)
	require.Equal(t, first.res.Fingerprint, again.res.Fingerprint)
	require.Equal(t, 1, hook.count(), "one ticket")

	other := submit(t, url, "--tool", "create_ticket", "--session", "run-7",
		"--args", `{"title":"Disk full on db-2","requested_at":"2026-11-30T09:00:00Z"}`, "--wait", "30s")
	require.Equal(t, 0, other.code, "another title is another ticket: %s", other.stderr)
	require.Equal(t, 2, hook.count())
}
