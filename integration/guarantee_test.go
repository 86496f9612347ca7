package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/internal/natstest"
	"github.com/idemgate/idemgate/pkg/intent"
)

// The tests of this file each close one way the two promises — at most once
// per key, every caller gets the recorded answer — used to break in
// ordinary conditions.

// A tool at its max_in_flight cap delays its intents; it never spends their
// deliveries nor drops them. With 3 deliveries allowed and a one-at-a-time
// tool whose every call takes a while, 5 operations sent at once all
// complete, one after the other.
func TestBackPressureDelaysNeverLoses(t *testing.T) {
	t.Parallel()
	url := jetStream(t)
	var running, most atomic.Int32
	hook := newSink(t, func(n int, w http.ResponseWriter, r *http.Request) {
		now := running.Add(1)
		defer running.Add(-1)
		for {
			m := most.Load()
			if now <= m || most.CompareAndSwap(m, now) {
				break
			}
		}
		time.Sleep(700 * time.Millisecond)
		fmt.Fprintf(w, `{"n":%d}`, n)
	})
	startWorker(t, "w1", url, writeTools(t, fmt.Sprintf(`tools:
  one_at_a_time:
    effect: webhook
    key_args: [n]
    max_in_flight: 1
    webhook: {url: %s, timeout: 30s}
`, hook.URL)), "--max-deliver", "3", "--retry-delay", "100ms", "--max-retry-delay", "100ms")
	const ops = 5
	results := make(chan submitted, ops)
	for i := range ops {
		go func() {
			results <- submit(t, url, "--tool", "one_at_a_time", "--args", fmt.Sprintf(`{"n":%d}`, i), "--wait", "60s")
		}()
	}
	for range ops {
		s := <-results
		require.Equal(t, 0, s.code, "every capped operation completes: %s %s", s.stdout, s.stderr)
	}
	require.Equal(t, ops, hook.count())
	require.EqualValues(t, 1, most.Load(), "the cap held")
}

// An intent answered rate_limited left no ledger record: its retry with the
// same key, a publish duplicate inside the dedup window, is published again
// under a fresh message id and served.
func TestRateLimitedOperationCanBeRetried(t *testing.T) {
	t.Parallel()
	url := jetStream(t)
	hook := newSink(t, nil)
	startWorker(t, "w1", url, writeTools(t, webhookTools(hook.URL, "30s")), "--session-rate", "0.5", "--session-burst", "1")
	first := submit(t, url, "--tool", "send_email", "--args", `{"to":"a@example.com"}`, "--session", "s1", "--wait", "30s")
	require.Equal(t, 0, first.code, first.stderr)
	limited := submit(t, url, "--tool", "send_email", "--args", `{"to":"b@example.com"}`, "--session", "s1", "--wait", "30s")
	require.Equal(t, intent.StatusRejected, limited.res.Status, limited.stdout+limited.stderr)
	require.Equal(t, intent.CodeRateLimited, limited.res.Error.Code)

	time.Sleep(2100 * time.Millisecond) // the session's rate allows one more
	retry := submit(t, url, "--tool", "send_email", "--args", `{"to":"b@example.com"}`, "--session", "s1", "--wait", "30s")
	require.Equal(t, 0, retry.code, "the retry is served: %s %s", retry.stdout, retry.stderr)
	require.Equal(t, limited.res.Key, retry.res.Key)
	require.Equal(t, 2, hook.count())
}

// An intent whose last delivery's worker died is dead-lettered: its caller
// is answered (not left waiting), and a retry of the operation under the
// same key — a publish duplicate — takes the abandoned claim over and fires.
func TestDeadLetteredIntentIsAnsweredAndRetryable(t *testing.T) {
	t.Parallel()
	url := jetStream(t)
	var calls atomic.Int32
	hook := newSink(t, func(n int, w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) <= 2 {
			<-r.Context().Done() // the first two holders are killed mid-call
			return
		}
		fmt.Fprintf(w, `{"n":%d}`, n)
	})
	tools, flags, answer := lastDeliveryScene(t, url, hook.URL, 7)
	w1 := startWorker(t, "w1", url, tools, flags...)
	h := hook.waitHit(t, 30*time.Second)
	w1.kill()
	// Two workers: one gets the last delivery and is killed mid-call; the
	// other gets the delivery after it and dead-letters it.
	workers := map[string]*proc{"w2": startWorker(t, "w2", url, tools, flags...), "w3": startWorker(t, "w3", url, tools, flags...)}
	hook.waitHit(t, 30*time.Second)
	var holder string
	require.Eventually(t, func() bool {
		var rec struct{ Holder string }
		_ = json.Unmarshal([]byte(submit(t, url, "get", h.Key).stdout), &rec)
		holder = rec.Holder
		return workers[holder] != nil
	}, 10*time.Second, 50*time.Millisecond)
	workers[holder].kill()
	s := <-answer
	require.Equal(t, intent.StatusRejected, s.res.Status, "the caller is answered: %s %s", s.stdout, s.stderr)
	require.Equal(t, intent.CodeDeadLettered, s.res.Error.Code)

	retry := submit(t, url, "--tool", "charge", "--args", `{"order":7}`, "--wait", "60s")
	require.Equal(t, 0, retry.code, "the retry fires: %s %s", retry.stdout, retry.stderr)
	require.Equal(t, 3, hook.count())
}

// An intent whose last delivery's worker died while no other worker ran is
// dead-lettered by the next worker to start: nothing depends on a worker
// hearing of it at the moment the delivery ran out.
func TestLastDeliveryLostWithNoWorkerRunningIsDeadLettered(t *testing.T) {
	t.Parallel()
	url := jetStream(t)
	hook := newSink(t, func(n int, w http.ResponseWriter, r *http.Request) {
		<-r.Context().Done() // every holder is killed mid-call
	})
	tools, flags, answer := lastDeliveryScene(t, url, hook.URL, 17)
	for _, name := range []string{"w1", "w2"} { // deliveries 1 and 2, the last
		w := startWorker(t, name, url, tools, flags...)
		hook.waitHit(t, 30*time.Second)
		w.kill()
	}
	time.Sleep(3 * time.Second) // the last delivery's ack wait runs out with no worker up
	startWorker(t, "w3", url, tools, flags...)
	s := <-answer
	require.Equal(t, intent.StatusRejected, s.res.Status, "the caller is answered: %s %s", s.stdout, s.stderr)
	require.Equal(t, intent.CodeDeadLettered, s.res.Error.Code)
	require.Equal(t, 2, hook.count(), "w3 did not fire it")
}

// lastDeliveryScene is the set-up of the tests of an intent whose holders
// die: a tools file with the tool charge (a webhook to hookURL, 1 s lease),
// worker flags for two deliveries of 1 s each, and the answer of a submit of
// charge {"order":order} waiting up to a minute, running meanwhile.
func lastDeliveryScene(t *testing.T, url, hookURL string, order int) (tools string, flags []string, answer <-chan submitted) {
	t.Helper()
	tools = writeTools(t, fmt.Sprintf(`tools:
  charge:
    effect: webhook
    key_args: [order]
    lease: 1s
    webhook: {url: %s, timeout: 60s}
`, hookURL))
	ch := make(chan submitted, 1)
	go func() {
		ch <- submit(t, url, "--tool", "charge", "--args", fmt.Sprintf(`{"order":%d}`, order), "--wait", "60s")
	}()
	return tools, []string{"--ack-wait", "1s", "--max-deliver", "2"}, ch
}

// A holder whose ledger is unreachable for longer than a minute after its
// effect fired keeps its result and records it once the ledger is back: the
// operation fires once, and its caller gets the result.
func TestLongLedgerOutageDoesNotFireTwice(t *testing.T) {
	skipShort(t, "a ledger outage of over a minute")
	t.Parallel()
	port := freePort(t)
	store := t.TempDir()
	opts := func(o *server.Options) { o.Port, o.StoreDir = port, store }
	srv := natstest.RunServer(t, opts)
	url := srv.ClientURL()
	down := make(chan struct{})
	var once sync.Once
	hook := newSink(t, func(n int, w http.ResponseWriter, r *http.Request) {
		once.Do(func() {
			srv.Shutdown() // the ledger goes away while the effect runs
			srv.WaitForShutdown()
			close(down)
		})
		fmt.Fprintf(w, `{"n":%d}`, n)
	})
	startWorker(t, "w1", url, writeTools(t, fmt.Sprintf(`tools:
  charge:
    effect: webhook
    key_args: [order]
    lease: 2s
    webhook: {url: %s, timeout: 30s}
`, hook.URL)), "--ack-wait", "2s")
	answer := make(chan submitted, 1)
	go func() {
		answer <- submit(t, url, "--tool", "charge", "--args", `{"order":8}`, "--wait", "3m")
	}()
	<-down
	time.Sleep(75 * time.Second) // longer than a holder ever gave up recording
	natstest.RunServer(t, opts)
	s := <-answer
	require.Equal(t, 0, s.code, "the caller gets the result: %s %s", s.stdout, s.stderr)
	time.Sleep(5 * time.Second) // a second firing, if any, would come within two leases
	require.Equal(t, 1, hook.count(), "fired once")
}

// Unresolved records never expire: an operation awaiting approval is still
// awaiting it past the ledger's TTL, while a completed one is forgotten.
func TestUnresolvedRecordsOutliveTheTTL(t *testing.T) {
	t.Parallel()
	url := jetStream(t)
	hook := newSink(t, nil)
	startWorker(t, "w1", url, writeTools(t, fmt.Sprintf(`tools:
  refund: {effect: webhook, key_args: [order], approval: required, webhook: {url: %[1]s}}
  notify: {effect: webhook, key_args: [order], webhook: {url: %[1]s}}
`, hook.URL)), "--ledger-ttl", "3s", "--dup-window", "1s", "--answer-cache", "0")
	parked := submit(t, url, "--tool", "refund", "--args", `{"order":9}`, "--wait", "30s")
	require.Equal(t, intent.StatusAwaitingApproval, parked.res.Status, parked.stdout+parked.stderr)
	done := submit(t, url, "--tool", "notify", "--args", `{"order":9}`, "--wait", "30s")
	require.Equal(t, 0, done.code, done.stderr)

	require.Eventually(t, func() bool {
		return submit(t, url, "get", done.res.Key).code == 1
	}, 30*time.Second, 250*time.Millisecond, "a completed record expires after the TTL")
	g := submit(t, url, "get", parked.res.Key)
	require.Equal(t, 0, g.code, "an operation awaiting approval is kept: %s", g.stderr)
	require.Contains(t, g.stdout, `"status": "awaiting_approval"`)
	again := submit(t, url, "--tool", "refund", "--args", `{"order":9}`, "--wait", "30s")
	require.Equal(t, intent.StatusAwaitingApproval, again.res.Status, "a retry does not fire it: %s", again.stdout)
	require.Equal(t, 1, hook.count(), "only notify fired")
}

// A dead letter of a window tool, replayed after its window passed, keeps
// the key its original derived: the key comes from the intent's original
// time, not the replay's.
func TestDeadLetterReplayKeepsAWindowKey(t *testing.T) {
	t.Parallel()
	url := jetStream(t)
	hook := newSink(t, nil)
	// The first worker does not know the tool: the intent is dead-lettered.
	w1 := startWorker(t, "w1", url, writeTools(t, webhookTools(hook.URL, "30s")))
	nc := connect(t, url)
	for time.Now().UnixMilli()%2000 > 500 { // just after a window boundary
		time.Sleep(20 * time.Millisecond)
	}
	published := time.Now()
	env := `{"tool":"weekly","args":{"user":42}}`
	rejected := publishRaw(t, nc, "idem.intents.weekly", []byte(env))(15 * time.Second)
	require.Equal(t, intent.CodeUnknownTool, rejected.Error.Code)
	require.NoError(t, w1.terminate(20*time.Second))

	startWorker(t, "w2", url, writeTools(t, fmt.Sprintf(`tools:
  weekly: {effect: webhook, key_args: all, window: 2s, webhook: {url: %s}}
`, hook.URL)))
	time.Sleep(time.Until(published.Add(2500 * time.Millisecond))) // the window passed
	var seq string
	require.Eventually(t, func() bool {
		for _, l := range lines(submit(t, url, "dlq", "list").stdout) {
			var d map[string]any
			require.NoError(t, json.Unmarshal([]byte(l), &d))
			if d["subject"] == "idem.intents.weekly" {
				seq = fmt.Sprint(d["seq"])
			}
		}
		return seq != ""
	}, 10*time.Second, 100*time.Millisecond)
	require.Equal(t, 0, submit(t, url, "dlq", "replay", seq).code)
	h := hook.waitHit(t, 15*time.Second)

	decoded, err := intent.Decode([]byte(env), intent.Limits{})
	require.NoError(t, err)
	want, err := intent.Derive(decoded, intent.KeySpec{Window: 2 * time.Second}, published)
	require.NoError(t, err)
	require.Equal(t, want.Key, h.Key, "the replay is keyed by the original's window")
}

// A caller accepts only the answer to its own operation: an answer for
// another operation sent to its reply subject (a forged Idem-Reply-To) is
// dropped.
func TestForeignAnswerIsDropped(t *testing.T) {
	t.Parallel()
	url := jetStream(t)
	release := make(chan struct{})
	hook := newSink(t, func(n int, w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/slow") {
			<-release
		}
		fmt.Fprintf(w, `{"path":%q}`, r.URL.Path)
	})
	startWorker(t, "w1", url, writeTools(t, fmt.Sprintf(`tools:
  slow: {effect: webhook, key_args: [n], webhook: {url: %[1]s/slow}}
  fast: {effect: webhook, key_args: [n], webhook: {url: %[1]s/fast}}
`, hook.URL)))
	nc := connect(t, url)
	seen := make(chan *nats.Msg, 1)
	sub, err := nc.ChanSubscribe("idem.intents.slow", seen) // what an eavesdropper sees
	require.NoError(t, err)
	defer func() { _ = sub.Unsubscribe() }()
	victim := make(chan submitted, 1)
	go func() { victim <- submit(t, url, "--tool", "slow", "--args", `{"n":1}`, "--wait", "60s") }()
	inbox := (<-seen).Header.Get(intent.HeaderReplyTo)
	require.NotEmpty(t, inbox)
	forged := nats.NewMsg("idem.intents.fast")
	forged.Data = []byte(`{"tool":"fast","args":{"n":2}}`)
	forged.Header.Set(intent.HeaderReplyTo, inbox)
	js, err := jetstreamFor(nc)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = js.PublishMsg(ctx, forged)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return hook.count() == 2 }, 15*time.Second, 20*time.Millisecond, "the forged intent fired")
	time.Sleep(500 * time.Millisecond) // its answer reached the victim's inbox
	close(release)
	s := <-victim
	require.Equal(t, 0, s.code, s.stdout+s.stderr)
	require.JSONEq(t, `{"path":"/slow"}`, string(s.res.Result), "the victim got its own answer")
}

// replayed is true exactly when the answer reports an outcome another call
// caused: the call that parks an operation for approval, and the same call
// once the approved operation fired, are not replays; a second call is.
// Rejections and conflicts are answers about the call itself. Answers that
// are not final carry no completed_at.
func TestReplayedMeansAnotherCallCausedIt(t *testing.T) {
	t.Parallel()
	url := jetStream(t)
	hook := newSink(t, nil)
	startWorker(t, "w1", url, writeTools(t, fmt.Sprintf(`tools:
  refund: {effect: webhook, key_args: [order], approval: required, webhook: {url: %[1]s}}
  send_email: {effect: webhook, key_args: [to], webhook: {url: %[1]s}}
`, hook.URL)))
	own := submit(t, url, "--tool", "refund", "--args", `{"order":2}`, "--wait", "30s")
	require.Equal(t, intent.StatusAwaitingApproval, own.res.Status, own.stdout+own.stderr)
	require.False(t, own.res.Replayed, "the call that parks an operation is not a replay")
	final := make(chan submitted, 1)
	go func() {
		final <- submit(t, url, "--tool", "refund", "--args", `{"order":1}`, "--wait", "60s", "--wait-final")
	}()
	var key string
	require.Eventually(t, func() bool {
		k := submit(t, url, "key", "--tool", "refund", "--args", `{"order":1}`)
		key = k.res.Key
		return strings.Contains(submit(t, url, "get", key).stdout, "awaiting_approval")
	}, 15*time.Second, 100*time.Millisecond)
	parked := submit(t, url, "--tool", "refund", "--args", `{"order":1}`, "--wait", "30s")
	require.Equal(t, intent.StatusAwaitingApproval, parked.res.Status)
	require.True(t, parked.res.Replayed, "a second call awaiting the same approval is a replay")
	require.NotContains(t, parked.stdout, "completed_at", "not final: no completion time")
	require.Equal(t, 0, submit(t, url, "approve", key, "--by", "ops", "--yes").code)
	f := <-final
	require.Equal(t, 0, f.code, "the call whose operation fired is not a replay: %s", f.stdout)
	require.False(t, f.res.Replayed)

	first := submit(t, url, "--tool", "send_email", "--args", `{"to":"a@b.c","body":"hi"}`, "--wait", "30s")
	require.Equal(t, 0, first.code)
	other := submit(t, url, "--tool", "send_email", "--args", `{"to":"a@b.c","body":"hello"}`, "--wait", "30s")
	require.Equal(t, 4, other.code, other.stdout)
	require.False(t, other.res.Replayed, "a conflict reports this call's own outcome")
	require.Equal(t, first.res.Fingerprint, other.res.RecordFingerprint)

	nc := connect(t, url)
	bad := publishRaw(t, nc, "idem.intents.send_email", []byte(`{"tool":"send_email","args":{}}`))(15 * time.Second)
	require.Equal(t, intent.StatusRejected, bad.Status)
	require.False(t, bad.Replayed, "a rejection reports this call's own outcome")
}

// A webhook to an IPv6 address that embeds or relays to an IPv4 one is
// refused like the IPv4 address it reaches: a loopback sink behind each such
// form is never reached, and the operation fails with the reason — even
// with loopback allowed, as every test worker has it.
func TestEmbeddedIPv4DestinationsAreRefused(t *testing.T) {
	t.Parallel()
	url := jetStream(t)
	hook := newSink(t, nil)
	port := hook.Listener.Addr().(*net.TCPAddr).Port
	forms := map[string]string{
		"compatible": "::7f00:1",
		"siit":       "::ffff:0:7f00:1",
		"nat64":      "64:ff9b::7f00:1",
		"sixtofour":  "2002:7f00:1::1",
		"teredo":     "2001:0:7f00:1::1",
	}
	var tools strings.Builder
	tools.WriteString("tools:\n")
	for name, addr := range forms {
		fmt.Fprintf(&tools, "  %s: {effect: webhook, key_args: [n], webhook: {url: \"http://[%s]:%d/\", retry: {max_attempts: 1}}}\n", name, addr, port)
	}
	startWorker(t, "w1", url, writeTools(t, tools.String()), "--max-deliver", "2", "--retry-delay", "100ms")
	for name, addr := range forms {
		s := submit(t, url, "--tool", name, "--args", `{"n":1}`, "--wait", "30s")
		require.Equal(t, intent.StatusFailed, s.res.Status, "%s (%s): %s %s", name, addr, s.stdout, s.stderr)
		require.Contains(t, s.res.Error.Message, "not allowed", name)
	}
	require.Zero(t, hook.count())
}
