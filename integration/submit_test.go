package integration

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/pkg/intent"
)

// submit --jsonl sends many envelopes, prints one answer per line and a
// progress line, and the repeats among them fire nothing.
func TestSubmitJSONLines(t *testing.T) {
	t.Parallel()
	url := jetStream(t)
	hook := newSink(t, nil)
	startWorker(t, "w1", url, writeTools(t, webhookTools(hook.URL, "30s")))

	var b strings.Builder
	for i := range 30 {
		fmt.Fprintf(&b, `{"tool":"send_email","args":{"to":"user%d@example.com"},"call_id":"call_%d"}`+"\n", i%10, i)
	}
	file := filepath.Join(t.TempDir(), "intents.jsonl")
	require.NoError(t, os.WriteFile(file, []byte(b.String()), 0o644))

	s := submit(t, url, "--jsonl", file, "--concurrency", "8", "--wait", "30s")
	require.Equal(t, 0, s.code, s.stderr)
	require.Contains(t, s.stderr, "sent 30/30 answered 30")
	answers := lines(s.stdout)
	require.Len(t, answers, 30)
	fired := map[string]int{}
	for _, l := range answers {
		var res intent.Result
		require.NoError(t, json.Unmarshal([]byte(l), &res))
		require.Equal(t, intent.StatusCompleted, res.Status, l)
		if !res.Replayed {
			fired[res.Key]++
		}
	}
	require.Len(t, fired, 10, "ten operations fired")
	for key, n := range fired {
		require.Equal(t, 1, n, "%s fired once", key)
	}
	require.Equal(t, 10, hook.count())
}

// A tool keyed by a time window: the client learns the window from the
// workers' catalogue, so created_at decides the key; the same args in the
// same week are one operation, in the next week another.
func TestWindowKeysFromTheCatalogue(t *testing.T) {
	t.Parallel()
	url := jetStream(t)
	hook := newSink(t, nil)
	startWorker(t, "w1", url, writeTools(t, fmt.Sprintf(`tools:
  weekly_digest:
    effect: webhook
    key_args: [user]
    window: 168h
    webhook: {url: %s}
`, hook.URL)))

	tools := submit(t, url, "tools")
	require.Equal(t, 0, tools.code, tools.stderr)
	require.Contains(t, tools.stdout, `"window_seconds": 604800`)

	send := func(at string) submitted {
		return submit(t, url, "--tool", "weekly_digest", "--args", `{"user":42}`, "--created-at", at, "--wait", "30s")
	}
	monday := send("2026-11-02T09:00:00Z")
	require.Equal(t, 0, monday.code, monday.stderr)
	sameWeek := send("2026-11-04T18:30:00Z")
	require.Equal(t, 3, sameWeek.code, sameWeek.stderr)
	require.Equal(t, monday.res.Key, sameWeek.res.Key)
	nextWeek := send("2026-11-12T09:00:00Z")
	require.Equal(t, 0, nextWeek.code, nextWeek.stderr)
	require.NotEqual(t, monday.res.Key, nextWeek.res.Key)
	require.Equal(t, 2, hook.count())
}

// submit key prints the key without publishing, with the key spec given or
// from the workers' catalogue; without either it fails rather than guess.
// Bad input is refused locally with a clear message and exit 1.
func TestSubmitKeyAndLocalValidation(t *testing.T) {
	t.Parallel()
	noServer := "nats://127.0.0.1:1"
	k1 := submit(t, noServer, "key", "--tool", "send_email", "--args", `{"b":1,"a":[1.0,"x"]}`, "--default-spec")
	require.Equal(t, 0, k1.code, k1.stderr)
	k2 := submit(t, noServer, "key", "--tool", "send_email", "--args", `{ "a" : [1, "x"], "b" : 1 }`, "--default-spec")
	require.Equal(t, k1.stdout, k2.stdout, "key order, whitespace and number form do not matter")
	require.Contains(t, k1.stdout, `"spec": "default"`)
	require.Contains(t, k1.stdout, `"key": "send_email.`)

	guess := submit(t, noServer, "key", "--tool", "send_email", "--args", `{"to":"a@example.com"}`)
	require.Equal(t, 1, guess.code, "no server and no spec: no key is guessed: %s", guess.stdout)
	require.Empty(t, guess.stdout)
	require.Contains(t, guess.stderr, "--spec")
	require.Contains(t, guess.stderr, "--default-spec")

	bad := submit(t, noServer, "--tool", "send_email", "--args", `[1]`)
	require.Equal(t, 1, bad.code)
	require.Contains(t, bad.stderr, "args")
	noTool := submit(t, noServer, "--args", `{}`)
	require.Equal(t, 1, noTool.code)
	require.Contains(t, noTool.stderr, "--tool")
}
