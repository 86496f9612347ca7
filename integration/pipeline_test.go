package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemgate/idemgate/internal/natstest"
	"github.com/nats-io/nats-server/v2/server"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/pkg/client"
	"github.com/idemgate/idemgate/pkg/intent"
)

// webhookTools is a tools file with one webhook tool aimed at url.
func webhookTools(url string, lease string) string {
	// key_args: all: the tests send all kinds of args, each object its own
	// operation.
	return fmt.Sprintf(`tools:
  send_email:
    effect: webhook
    key_args: all
    lease: %s
    webhook:
      url: %s
      timeout: 30s
      retry: {max_attempts: 4, initial_interval: 50ms, max_interval: 200ms}
`, lease, url)
}

// (a) The same intent submitted 20 times in a row fires once; 19 answers are
// replays of the same result.
func TestSequentialRepeatsFireOnce(t *testing.T) {
	t.Parallel()
	url := jetStream(t)
	hook := newSink(t, nil)
	startWorker(t, "w1", url, writeTools(t, webhookTools(hook.URL, "30s")))

	var first submitted
	for i := range 20 {
		s := submit(t, url, "--tool", "send_email", "--args", `{"to":"ada@example.com","subject":"hi"}`, "--session", "run-7", "--wait", "30s")
		require.Equal(t, intent.StatusCompleted, s.res.Status, "submission %d: %s %s", i, s.stdout, s.stderr)
		if i == 0 {
			first = s
			require.Equal(t, 0, s.code, "first submission fires: exit 0")
			require.False(t, s.res.Replayed)
			continue
		}
		require.Equal(t, 3, s.code, "submission %d is a replay: exit 3", i)
		require.True(t, s.res.Replayed)
		require.Equal(t, first.res.Key, s.res.Key)
		require.JSONEq(t, string(first.res.Result), string(s.res.Result))
	}
	require.Equal(t, 1, hook.count(), "the sink is hit once")
	require.Equal(t, first.res.Key, hook.all()[0].Key, "the effect carries the key")
}

// (b) 50 concurrent copies without Nats-Msg-Id, spread over 3 worker
// processes, fire once; every copy gets the one result.
func TestConcurrentCopiesAcrossWorkersFireOnce(t *testing.T) {
	t.Parallel()
	url := jetStream(t)
	hook := newSink(t, func(n int, w http.ResponseWriter, r *http.Request) {
		time.Sleep(300 * time.Millisecond) // keep the first in flight while copies arrive
		fmt.Fprintf(w, `{"ticket":"T-%d"}`, n)
	})
	tools := writeTools(t, webhookTools(hook.URL, "30s"))
	for i := range 3 {
		startWorker(t, fmt.Sprintf("w%d", i+1), url, tools, "--concurrency", "32")
	}
	nc := connect(t, url)
	data := []byte(`{"tool":"send_email","args":{"to":"bob@example.com","subject":"copies"}}`)
	waits := make([]func(time.Duration) intent.Result, 50)
	var wg sync.WaitGroup
	for i := range waits {
		wg.Add(1)
		go func() {
			defer wg.Done()
			waits[i] = publishRaw(t, nc, "idem.intents.send_email", data)
		}()
	}
	wg.Wait()
	fired := 0
	for _, wait := range waits {
		res := wait(30 * time.Second)
		require.Equal(t, intent.StatusCompleted, res.Status, "%+v", res)
		require.JSONEq(t, `{"ticket":"T-1"}`, string(res.Result))
		if !res.Replayed {
			fired++
		}
	}
	require.Equal(t, 1, fired, "exactly one answer is the firing")
	require.Equal(t, 1, hook.count(), "the sink is hit once")
}

// (c) The same override key with other args is a conflict: answered, never
// fired — both when publish dedup hides the copy from the workers (submit
// compares fingerprints) and when a worker sees it.
func TestSameKeyOtherArgsConflicts(t *testing.T) {
	t.Parallel()
	url := jetStream(t)
	hook := newSink(t, nil)
	startWorker(t, "w1", url, writeTools(t, webhookTools(hook.URL, "30s")))

	s := submit(t, url, "--tool", "send_email", "--key", "order-98765", "--args", `{"to":"a@example.com","amount":10}`, "--wait", "30s")
	require.Equal(t, 0, s.code, s.stderr)
	require.Equal(t, intent.StatusCompleted, s.res.Status)

	// Inside the duplicate window: JetStream drops the publish; submit watches
	// the ledger and finds another fingerprint.
	s2 := submit(t, url, "--tool", "send_email", "--key", "order-98765", "--args", `{"to":"a@example.com","amount":20}`, "--wait", "30s")
	require.Equal(t, 4, s2.code, "conflict exits 4: %s %s", s2.stdout, s2.stderr)
	require.Equal(t, intent.StatusConflict, s2.res.Status)
	require.Equal(t, intent.CodeConflict, s2.res.Error.Code)
	require.Equal(t, s.res.Key, s2.res.Key)

	// Without Nats-Msg-Id the copy reaches a worker, which answers conflict.
	nc := connect(t, url)
	res := publishRaw(t, nc, "idem.intents.send_email", []byte(`{"tool":"send_email","key":"order-98765","args":{"to":"a@example.com","amount":30}}`))(30 * time.Second)
	require.Equal(t, intent.StatusConflict, res.Status)
	require.Equal(t, intent.CodeConflict, res.Error.Code)
	require.False(t, res.Replayed, "a conflict is this call's own outcome, not a replay")

	require.Equal(t, 1, hook.count(), "never fired for the conflicting args")
}

// (d) A sink that answers 503 twice, then 200: one logical firing, three
// requests, every one with the same key.
func TestTransientFailuresRetryWithTheSameKey(t *testing.T) {
	t.Parallel()
	url := jetStream(t)
	hook := newSink(t, func(n int, w http.ResponseWriter, r *http.Request) {
		if n <= 2 {
			http.Error(w, "busy", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprint(w, `{"id":"msg-1"}`)
	})
	startWorker(t, "w1", url, writeTools(t, webhookTools(hook.URL, "30s")))

	s := submit(t, url, "--tool", "send_email", "--args", `{"to":"c@example.com"}`, "--wait", "30s")
	require.Equal(t, 0, s.code, s.stderr)
	require.Equal(t, intent.StatusCompleted, s.res.Status)
	require.Equal(t, 3, s.res.Attempts, "attempts counts every invocation")
	hits := hook.all()
	require.Len(t, hits, 3)
	for _, h := range hits {
		require.Equal(t, s.res.Key, h.Key, "every attempt carries the key")
	}
	again := submit(t, url, "--tool", "send_email", "--args", `{"to":"c@example.com"}`, "--wait", "30s")
	require.Equal(t, 3, again.code)
	require.Equal(t, 3, hook.count(), "one logical firing")
}

// (e) A worker killed with SIGKILL mid-effect: after its lease expires another
// worker takes over; the sink sees the same key both times; the caller gets
// one final result.
func TestKilledHolderIsTakenOver(t *testing.T) {
	t.Parallel()
	url := jetStream(t)
	release := make(chan struct{})
	hook := newSink(t, func(n int, w http.ResponseWriter, r *http.Request) {
		if n == 1 {
			select { // hold the first firing until its worker is dead
			case <-release:
			case <-r.Context().Done():
			}
			return
		}
		fmt.Fprint(w, `{"sent":"second"}`)
	})
	tools := writeTools(t, webhookTools(hook.URL, "2s"))
	workers := map[string]*proc{
		"w1": startWorker(t, "w1", url, tools, "--ack-wait", "2s"),
		"w2": startWorker(t, "w2", url, tools, "--ack-wait", "2s"),
	}

	done := make(chan submitted, 1)
	go func() {
		done <- submit(t, url, "--tool", "send_email", "--args", `{"to":"d@example.com"}`, "--wait", "60s")
	}()
	first := hook.waitHit(t, 20*time.Second)

	nc := connect(t, url)
	cl, err := client.New(nc)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rec, err := cl.Get(ctx, first.Key)
	require.NoError(t, err)
	require.Equal(t, intent.StatusPending, rec.Status)
	holder := workers[rec.Holder]
	require.NotNil(t, holder, "holder %q is one of the workers", rec.Holder)
	holder.kill()
	close(release)

	second := hook.waitHit(t, 30*time.Second)
	require.Equal(t, first.Key, second.Key, "the takeover forwards the same key")
	s := <-done
	require.Equal(t, 0, s.code, "%s %s", s.stdout, s.stderr)
	require.Equal(t, intent.StatusCompleted, s.res.Status)
	require.JSONEq(t, `{"sent":"second"}`, string(s.res.Result))

	rec, err = cl.Get(ctx, first.Key)
	require.NoError(t, err)
	require.Equal(t, 2, rec.Attempt, "the record shows the takeover")
	require.NotEqual(t, holder.name, rec.Holder)
}

// (f) A duplicate that arrives while the first is in flight gets the first's
// result: through the worker (no Nats-Msg-Id) and through the client (a
// publish duplicate watched on the ledger).
func TestInFlightDuplicateGetsTheFirstResult(t *testing.T) {
	t.Parallel()
	url := jetStream(t)
	release := make(chan struct{})
	hook := newSink(t, func(n int, w http.ResponseWriter, r *http.Request) {
		<-release
		fmt.Fprintf(w, `{"n":%d}`, n)
	})
	w := startWorker(t, "w1", url, writeTools(t, webhookTools(hook.URL, "30s")))

	args := `{"to":"e@example.com","subject":"in flight"}`
	done := make(chan submitted, 2)
	go func() { done <- submit(t, url, "--tool", "send_email", "--args", args, "--wait", "30s") }()
	hook.waitHit(t, 20*time.Second)

	go func() { done <- submit(t, url, "--tool", "send_email", "--args", args, "--wait", "30s") }()
	nc := connect(t, url)
	viaWorker := publishRaw(t, nc, "idem.intents.send_email", []byte(`{"tool":"send_email","args":`+args+`}`))
	// Once the worker's copy waits on the holder, let the first finish.
	require.Eventually(t, func() bool { return strings.Contains(w.log.String(), "waiting for the holder") },
		10*time.Second, 10*time.Millisecond)
	close(release)

	res := viaWorker(30 * time.Second)
	require.Equal(t, intent.StatusCompleted, res.Status)
	require.True(t, res.Replayed)
	require.JSONEq(t, `{"n":1}`, string(res.Result))
	codes := map[int]int{}
	for range 2 {
		s := <-done
		require.Equal(t, intent.StatusCompleted, s.res.Status, s.stderr)
		require.JSONEq(t, `{"n":1}`, string(s.res.Result))
		codes[s.code]++
	}
	require.Equal(t, map[int]int{0: 1, 3: 1}, codes, "one fired, one replayed")
	require.Equal(t, 1, hook.count())
}

// (g) Bad input is answered with a clear error, terminated (never
// redelivered), and the worker goes on serving.
func TestBadInputIsAnsweredAndTerminated(t *testing.T) {
	t.Parallel()
	url := jetStream(t)
	hook := newSink(t, nil)
	startWorker(t, "w1", url, writeTools(t, webhookTools(hook.URL, "30s")), "--max-intent-bytes", "2048")
	nc := connect(t, url)

	big := `{"tool":"send_email","args":{"body":"` + strings.Repeat("x", 4096) + `"}}`
	cases := []struct {
		name, subject, data, code string
	}{
		{"malformed JSON", "idem.intents.send_email", `{"tool":"send_email","args":`, intent.CodeInvalidIntent},
		{"unknown tool", "idem.intents.launch_rocket", `{"tool":"launch_rocket","args":{}}`, intent.CodeUnknownTool},
		{"args not an object", "idem.intents.send_email", `{"tool":"send_email","args":[1,2]}`, intent.CodeInvalidIntent},
		{"unknown field", "idem.intents.send_email", `{"tool":"send_email","args":{},"sesion":"typo"}`, intent.CodeInvalidIntent},
		{"oversized", "idem.intents.send_email", big, intent.CodeTooLarge},
		{"tool does not match subject", "idem.intents.send_email", `{"tool":"other","args":{}}`, intent.CodeToolMismatch},
		{"duplicate field", "idem.intents.send_email", `{"tool":"send_email","args":{},"args":{}}`, intent.CodeInvalidIntent},
		{"empty key override", "idem.intents.send_email", `{"tool":"send_email","args":{},"key":""}`, intent.CodeInvalidIntent},
	}
	for _, c := range cases {
		res := publishRaw(t, nc, c.subject, []byte(c.data))(15 * time.Second)
		require.Equal(t, intent.StatusRejected, res.Status, c.name)
		require.NotNil(t, res.Error, c.name)
		require.Equal(t, c.code, res.Error.Code, "%s: %s", c.name, res.Error.Message)
		require.NotEmpty(t, res.Error.Message, c.name)
	}

	s := submit(t, url, "--tool", "send_email", "--args", `{"to":"f@example.com"}`, "--wait", "30s")
	require.Equal(t, 0, s.code, "the worker still serves: %s", s.stderr)
	require.Equal(t, 1, hook.count())

	// Nothing is left to redeliver: the work stream is empty and the consumer
	// has nothing pending or redelivered.
	js, err := jetstreamFor(nc)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.Eventually(t, func() bool {
		cons, err := js.Consumer(ctx, "IDEM_INTENTS", "IDEM_WORKERS")
		require.NoError(t, err)
		info, err := cons.Info(ctx)
		require.NoError(t, err)
		st, err := js.Stream(ctx, "IDEM_INTENTS")
		require.NoError(t, err)
		sinfo, err := st.Info(ctx)
		require.NoError(t, err)
		return info.NumAckPending == 0 && info.NumRedelivered == 0 && info.NumPending == 0 && sinfo.State.Msgs == 0
	}, 10*time.Second, 50*time.Millisecond)
}

// SIGTERM drains: the effect in flight finishes and is answered, then the
// worker exits cleanly.
func TestSIGTERMDrainsEffectsInFlight(t *testing.T) {
	t.Parallel()
	url := jetStream(t)
	release := make(chan struct{})
	hook := newSink(t, func(n int, w http.ResponseWriter, r *http.Request) {
		<-release
		fmt.Fprint(w, `{"drained":true}`)
	})
	w := startWorker(t, "w1", url, writeTools(t, webhookTools(hook.URL, "30s")))
	done := make(chan submitted, 1)
	go func() {
		done <- submit(t, url, "--tool", "send_email", "--args", `{"to":"g@example.com"}`, "--wait", "30s")
	}()
	hook.waitHit(t, 20*time.Second)
	_ = w.cmd.Process.Signal(sigterm)
	require.Eventually(t, func() bool { return strings.Contains(w.log.String(), "worker draining") },
		10*time.Second, 10*time.Millisecond)
	close(release)
	require.NoError(t, w.terminate(20*time.Second), w.log.String())
	s := <-done
	require.Equal(t, 0, s.code, s.stderr)
	require.JSONEq(t, `{"drained":true}`, string(s.res.Result))
}

// The default run: a worker with its own embedded JetStream, reachable by
// other processes on its listen address.
func TestEmbeddedJetStreamServesOtherProcesses(t *testing.T) {
	t.Parallel()
	hook := newSink(t, nil)
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	startWorker(t, "embedded", "", writeTools(t, webhookTools(hook.URL, "30s")),
		"--store-dir", t.TempDir(), "--listen", addr)
	url := "nats://" + addr
	s := submit(t, url, "--tool", "send_email", "--args", `{"to":"h@example.com"}`, "--wait", "30s")
	require.Equal(t, 0, s.code, s.stderr)
	again := submit(t, url, "--tool", "send_email", "--args", `{"to":"h@example.com"}`, "--wait", "30s")
	require.Equal(t, 3, again.code, again.stderr)
	require.Equal(t, 1, hook.count())

	get := submit(t, url, "get", s.res.Key)
	require.Equal(t, 0, get.code, get.stderr)
	var rec map[string]any
	require.NoError(t, json.Unmarshal([]byte(get.stdout), &rec))
	require.Equal(t, "completed", rec["status"])
	require.Equal(t, "embedded", rec["holder"])

	js, err := jetstreamFor(connect(t, url))
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = js.KeyValue(ctx, "IDEM_LEDGER")
	require.NoError(t, err)
	_, err = js.Stream(ctx, "IDEM_INTENTS")
	require.NotErrorIs(t, err, jetstream.ErrStreamNotFound)
	require.True(t, ledgerAtomic(t, js), "the embedded store syncs every write: the ledger's writes are group-committed")
}

// An embedded store that syncs lazily gets the ledger's writes one by one
// (group commit would only add its cost), unless --ledger-batch says
// otherwise.
func TestEmbeddedLazyStoreWritesOneByOne(t *testing.T) {
	t.Parallel()
	hook := newSink(t, nil)
	tools := writeTools(t, webhookTools(hook.URL, "30s"))
	for _, tc := range []struct {
		name   string
		extra  []string
		atomic bool
	}{
		{"lazy", []string{"--sync", "lazy"}, false},
		{"lazy-batched", []string{"--sync", "lazy", "--ledger-batch", "100"}, true},
		{"always-unbatched", []string{"--ledger-batch", "0"}, false},
	} {
		addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
		w := startWorker(t, tc.name, "", tools, append([]string{"--store-dir", t.TempDir(), "--listen", addr}, tc.extra...)...)
		js, err := jetstreamFor(connect(t, "nats://"+addr))
		require.NoError(t, err)
		require.Equal(t, tc.atomic, ledgerAtomic(t, js), tc.name)
		s := submit(t, "nats://"+addr, "--tool", "send_email", "--args", `{"to":"`+tc.name+`@example.com"}`, "--wait", "30s")
		require.Equal(t, 0, s.code, s.stderr)
		w.kill()
	}
}

// ledgerAtomic reports whether the ledger's stream accepts atomic batches:
// the worker turned group commit on.
func ledgerAtomic(t *testing.T, js jetstream.JetStream) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := js.Stream(ctx, "KV_IDEM_LEDGER")
	require.NoError(t, err)
	return st.CachedInfo().Config.AllowAtomicPublish
}

// A worker started before its JetStream server waits for it, then serves.
func TestWorkerStartsBeforeJetStream(t *testing.T) {
	skipShort(t, "a worker started before its JetStream server")
	t.Parallel()
	port := freePort(t)
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	hook := newSink(t, nil)
	p := launchWorker(t, "early", []string{"--tools", writeTools(t, webhookTools(hook.URL, "30s")), "--nats-url", url,
		"--holder", "early", "--webhook-allow", "127.0.0.0/8"}, nil)
	p.waitLog(t, "JetStream not available yet", 20*time.Second)
	natstest.RunServer(t, func(o *server.Options) { o.Port = port })
	p.waitLog(t, "worker consuming", 30*time.Second)
	s := submit(t, url, "--tool", "send_email", "--args", `{"to":"late@example.com"}`, "--wait", "30s")
	require.Equal(t, 0, s.code, s.stderr)
}
