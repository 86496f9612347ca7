package integration

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/pkg/intent"
)

// The client rules of docs/protocol.md section 7, as the TypeScript client
// follows them, against real workers.

// The retry rule: an intent whose Nats-Msg-Id was used by a message that
// ended without a ledger record (here a malformed one, rejected and
// dead-lettered) is a publish duplicate with no record. The client
// publishes it again with a fresh Nats-Msg-Id after the reply grace, and
// the operation fires: by this call, so not a replay.
func TestTSRepublishesADuplicateWithNoRecord(t *testing.T) {
	t.Parallel()
	dir := tsClient(t)
	url := jetStream(t)
	hook := newSink(t, nil)
	startWorker(t, "w1", url, writeTools(t, tsTools(hook.URL)))
	args := `{"to":"ada@example.com","subject":"Welcome"}`
	k := tsRunRaw(t, dir, "key", "-q", "--servers", url, "--tool", "send_email", "--args", args)
	require.Equal(t, 0, k.code, k.stderr)
	key := strings.TrimSpace(k.stdout)

	// A malformed intent takes the key's Nats-Msg-Id and ends rejected,
	// with no record.
	nc := connect(t, url)
	inbox := nc.NewRespInbox()
	sub, err := nc.SubscribeSync(inbox)
	require.NoError(t, err)
	js, err := jetstreamFor(nc)
	require.NoError(t, err)
	msg := nats.NewMsg("idem.intents.send_email")
	msg.Data = []byte(`{"tool":"send_email","args":{},"priority":"high"}`)
	msg.Header.Set(intent.HeaderReplyTo, inbox)
	msg.Header.Set("Nats-Msg-Id", key)
	_, err = js.PublishMsg(t.Context(), msg)
	require.NoError(t, err)
	m, err := sub.NextMsg(30 * time.Second)
	require.NoError(t, err)
	require.Contains(t, string(m.Data), `"rejected"`)

	start := time.Now()
	ts := tsSubmit(t, dir, url, "--tool", "send_email", "--args", args, "--wait", "20s")
	require.Equal(t, 0, ts.code, "the republished intent fires, by this call: %s %s", ts.stdout, ts.stderr)
	require.Equal(t, key, ts.res.Key)
	require.Equal(t, intent.StatusCompleted, ts.res.Status)
	require.False(t, ts.res.Replayed)
	require.GreaterOrEqual(t, time.Since(start), 3*time.Second, "after the reply grace")
	require.Equal(t, 1, hook.count())
}

// Every intent carries the client's key and fingerprint (Idem-Key,
// Idem-Fingerprint); an answer pushed to the client's inbox for another
// operation, or for the same key with other arguments, is dropped: the
// client returns its own operation's answer.
func TestTSDropsAnswersOfOtherOperations(t *testing.T) {
	t.Parallel()
	dir := tsClient(t)
	url := jetStream(t)
	release := make(chan struct{})
	hook := newSink(t, func(n int, w http.ResponseWriter, r *http.Request) {
		<-release // the forged answers arrive first
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"sent":true}`)
	})
	startWorker(t, "w1", url, writeTools(t, tsTools(hook.URL)))

	// An agent that learns the victim's inbox (here: by listening to the
	// intent subjects) names it as the reply subject of forged answers.
	nc := connect(t, url)
	seen := make(chan *nats.Msg, 1)
	spy, err := nc.Subscribe("idem.intents.>", func(m *nats.Msg) {
		select {
		case seen <- m:
		default:
		}
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = spy.Unsubscribe() })
	require.NoError(t, nc.Flush())

	done := make(chan submitted, 1)
	go func() {
		done <- tsSubmit(t, dir, url, "--tool", "send_email", "--args", `{"to":"ada@example.com","subject":"Welcome"}`, "--wait", "60s")
	}()
	var m *nats.Msg
	select {
	case m = <-seen:
	case <-time.After(30 * time.Second):
		t.Fatal("the TypeScript client published nothing")
	}
	key, fp := m.Header.Get("Idem-Key"), m.Header.Get("Idem-Fingerprint")
	require.True(t, strings.HasPrefix(key, "send_email."), "Idem-Key: %q", key)
	require.Len(t, fp, 64, "Idem-Fingerprint")
	require.Equal(t, key, m.Header.Get("Nats-Msg-Id"))
	inbox := m.Header.Get(intent.HeaderReplyTo)
	forge := func(res intent.Result) {
		data, err := json.Marshal(res)
		require.NoError(t, err)
		require.NoError(t, nc.Publish(inbox, data))
	}
	forge(intent.Result{Key: "send_email." + strings.Repeat("0", 64), Tool: "send_email", Status: intent.StatusCompleted, Result: json.RawMessage(`{"forged":1}`)})
	forge(intent.Result{Key: key, Tool: "send_email", Status: intent.StatusCompleted, Fingerprint: strings.Repeat("e", 64), Result: json.RawMessage(`{"forged":2}`)})
	require.NoError(t, nc.Publish(inbox, []byte("not json")))
	require.NoError(t, nc.Flush())
	hook.waitHit(t, 30*time.Second)
	close(release)

	ts := <-done
	require.Equal(t, 0, ts.code, "%s %s", ts.stdout, ts.stderr)
	require.Equal(t, key, ts.res.Key)
	require.Equal(t, fp, ts.res.Fingerprint)
	require.JSONEq(t, `{"sent":true}`, string(ts.res.Result), "the real answer, not a forged one")
}

// The TypeScript command line's tools and dlq: the catalogue, and a dead
// letter listed and replayed (a malformed intent, fixed by nothing: it is
// rejected again, and dead-lettered again).
func TestTSToolsAndDeadLetters(t *testing.T) {
	t.Parallel()
	dir := tsClient(t)
	url := jetStream(t)
	hook := newSink(t, nil)
	startWorker(t, "w1", url, writeTools(t, tsTools(hook.URL)))

	tools := tsRunRaw(t, dir, "tools", "--servers", url)
	require.Equal(t, 0, tools.code, tools.stderr)
	require.Contains(t, tools.stdout, `"name": "weekly_digest"`)
	require.Contains(t, tools.stdout, `"window_seconds": 604800`)

	nc := connect(t, url)
	wait := publishRaw(t, nc, "idem.intents.send_email", []byte(`{"tool":"send_email","args":{},"priority":"high"}`))
	require.Equal(t, intent.StatusRejected, wait(30*time.Second).Status)

	var listed tsDeadLetter
	require.Eventually(t, func() bool {
		l := tsRunRaw(t, dir, "dlq", "list", "--servers", url)
		if l.code != 0 || strings.TrimSpace(l.stdout) == "" {
			return false
		}
		require.NoError(t, json.Unmarshal([]byte(lines(l.stdout)[0]), &listed), l.stdout)
		return true
	}, 30*time.Second, 100*time.Millisecond, "the dead letter is listed")
	require.Equal(t, "idem.intents.send_email", listed.Subject)
	require.Contains(t, listed.Reason, "priority")
	require.Equal(t, "send_email", listed.Data["tool"])

	goList := submit(t, url, "dlq", "list")
	require.Contains(t, goList.stdout, fmt.Sprintf(`"seq":%d`, listed.Seq), "the Go and TypeScript command lines agree")

	replay := tsRunRaw(t, dir, "dlq", "replay", fmt.Sprint(listed.Seq), "--servers", url)
	require.Equal(t, 0, replay.code, replay.stderr)
	require.Contains(t, replay.stdout, fmt.Sprintf(`"replayed": %d`, listed.Seq))
	require.Eventually(t, func() bool {
		l := tsRunRaw(t, dir, "dlq", "list", "--servers", url)
		return l.code == 0 && strings.Contains(l.stdout, "priority") && !strings.Contains(l.stdout, fmt.Sprintf(`"seq":%d,`, listed.Seq))
	}, 30*time.Second, 100*time.Millisecond, "replayed: removed, and dead-lettered again under a new seq")
	bad := tsRunRaw(t, dir, "dlq", "replay", "x", "--servers", url)
	require.Equal(t, 1, bad.code)
}

// The TypeScript key command, like submit key: the spec from the
// catalogue, --spec, or --default-spec; without a server and without a
// spec it fails instead of guessing; -q prints the key alone.
func TestTSKeyNeedsASpec(t *testing.T) {
	t.Parallel()
	dir := tsClient(t)
	noServer := "nats://127.0.0.1:1"
	args := []string{"--tool", "send_email", "--args", `{"to":"a@example.com","subject":"Hi","body":"x"}`}
	guess := tsRunRaw(t, dir, append([]string{"key", "--servers", noServer}, args...)...)
	require.Equal(t, 1, guess.code, guess.stdout)
	require.Contains(t, guess.stderr, "--default-spec")
	def := tsRunRaw(t, dir, append([]string{"key", "-q", "--default-spec"}, args...)...)
	require.Equal(t, 0, def.code, def.stderr)

	url := jetStream(t)
	hook := newSink(t, nil)
	startWorker(t, "w1", url, writeTools(t, tsTools(hook.URL)))
	cat := tsRunRaw(t, dir, append([]string{"key", "-q", "--servers", url}, args...)...)
	require.Equal(t, 0, cat.code, cat.stderr)
	spec := tsRunRaw(t, dir, append([]string{"key", "-q", "--spec", `{"key_args":["to","subject"],"volatile_args":["body"]}`}, args...)...)
	require.Equal(t, cat.stdout, spec.stdout)
	require.NotEqual(t, def.stdout, cat.stdout, "the catalogue's key args make another key")
	goKey := submit(t, url, append([]string{"key", "-q"}, args...)...)
	require.Equal(t, goKey.stdout, cat.stdout, "the Go and TypeScript command lines derive one key")
}

// tsDeadLetter is one line of cli.js dlq list.
type tsDeadLetter struct {
	Seq     uint64         `json:"seq"`
	Subject string         `json:"subject"`
	Reason  string         `json:"reason"`
	Data    map[string]any `json:"data"`
}

// tsRunRaw runs dist/cli.js with args; its output is not decoded.
func tsRunRaw(t *testing.T, dir string, args ...string) submitted {
	t.Helper()
	cmd := exec.Command("node", append([]string{filepath.Join(dir, "dist", "cli.js")}, args...)...)
	return runClient(t, cmd)
}
