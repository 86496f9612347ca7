package integration

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/pkg/intent"
)

// scrape reads the worker's /metrics into series → value.
func scrape(t *testing.T, addr string) map[string]float64 {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		require.NoError(t, err, line)
		out[line[:i]] = v
	}
	return out
}

// The admin endpoints after a known workload: every counter has the value
// the workload implies.
func TestMetricsAfterAKnownWorkload(t *testing.T) {
	t.Parallel()
	url := jetStream(t)
	hook := newSink(t, func(n int, w http.ResponseWriter, r *http.Request) {
		if strings.Contains(r.Header.Get("Idem-Tool"), "send_email") && n == 1 {
			http.Error(w, "busy", http.StatusServiceUnavailable) // one transient failure inside the first firing's retries
			return
		}
		fmt.Fprint(w, `{"ok":true}`)
	})
	admin := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	startWorker(t, "w1", url, writeTools(t, webhookTools(hook.URL, "30s")), "--admin-addr", admin)
	nc := connect(t, url)

	for _, path := range []string{"/healthz", "/readyz"} {
		resp, err := http.Get("http://" + admin + path)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode, path)
	}

	send := func(data string) intent.Result {
		return publishRaw(t, nc, "idem.intents.send_email", []byte(data))(15 * time.Second)
	}
	for i := range 3 { // three operations fire
		require.Equal(t, intent.StatusCompleted, send(fmt.Sprintf(`{"tool":"send_email","args":{"n":%d}}`, i)).Status)
	}
	for range 2 { // two replays reach the worker (no Nats-Msg-Id)
		require.True(t, send(`{"tool":"send_email","args":{"n":0}}`).Replayed)
	}
	require.Equal(t, intent.StatusCompleted, send(`{"tool":"send_email","key":"k-1","args":{"n":1}}`).Status, "an override key names a fourth operation")
	require.Equal(t, intent.StatusConflict, send(`{"tool":"send_email","key":"k-1","args":{"n":99}}`).Status)
	require.Equal(t, intent.StatusRejected, send(`{"tool":"send_email","args":`).Status)
	require.Equal(t, intent.StatusRejected, publishRaw(t, nc, "idem.intents.nope", []byte(`{"tool":"nope","args":{}}`))(15*time.Second).Status)

	var m map[string]float64
	require.Eventually(t, func() bool {
		m = scrape(t, admin)
		// Answers go out before the dead letters are written: wait for both.
		return m[`idemgate_dead_letters_total{tool="_unknown"}`] == 1 && m[`idemgate_dead_letters_total{tool="send_email"}`] == 1
	}, 10*time.Second, 50*time.Millisecond)
	want := map[string]float64{
		`idemgate_intents_received_total{tool="send_email"}`:                  3 + 2 + 1 + 1 + 1,
		`idemgate_intents_received_total{tool="_unknown"}`:                    1,
		`idemgate_effects_fired_total{tool="send_email"}`:                     3 + 1,
		`idemgate_replays_total{tool="send_email"}`:                           2,
		`idemgate_conflicts_total{tool="send_email"}`:                         1,
		`idemgate_bad_intents_total{code="invalid_intent",tool="send_email"}`: 1,
		`idemgate_bad_intents_total{code="unknown_tool",tool="_unknown"}`:     1,
		`idemgate_dead_letters_total{tool="send_email"}`:                      1,
		`idemgate_dead_letters_total{tool="_unknown"}`:                        1,
		`idemgate_effect_duration_seconds_count{tool="send_email"}`:           4,
		`idemgate_claim_to_complete_seconds_count{tool="send_email"}`:         4,
		`idemgate_intent_end_to_end_seconds_count{tool="send_email"}`:         3 + 2 + 1 + 1 + 1,
		`idemgate_intent_end_to_end_seconds_count{tool="_unknown"}`:           1,
		`idemgate_intents_in_flight`:                                          0,
		// The replays and the conflict are answered from the worker's
		// cache of final records, without the ledger.
		`idemgate_answer_cache_hits_total{tool="send_email"}`: 2 + 1,
		// One intent at a time: too few writes queue for a batch, so the
		// group commit sends each on its own — the claims of the four
		// operations and their four results.
		`idemgate_ledger_single_writes_total`:   4 + 4,
		`idemgate_ledger_batches_total`:         0,
		`idemgate_ledger_batch_fallbacks_total`: 0,
	}
	for series, v := range want {
		require.Equal(t, v, m[series], series)
	}
	require.Zero(t, m[`idemgate_lease_takeovers_total{tool="send_email"}`])
}

// A W3C traceparent on the intent reaches the effect (a webhook header) and
// the answer (a NATS header), in the same trace.
func TestTraceContextIsPropagated(t *testing.T) {
	t.Parallel()
	url := jetStream(t)
	got := make(chan string, 1)
	hook := newSink(t, func(n int, w http.ResponseWriter, r *http.Request) {
		got <- r.Header.Get("traceparent")
		fmt.Fprint(w, `{}`)
	})
	startWorker(t, "w1", url, writeTools(t, webhookTools(hook.URL, "30s")))
	nc := connect(t, url)
	const traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	inbox := nc.NewRespInbox()
	sub, err := nc.SubscribeSync(inbox)
	require.NoError(t, err)
	msg := nats.NewMsg("idem.intents.send_email")
	msg.Data = []byte(`{"tool":"send_email","args":{"traced":true}}`)
	msg.Header.Set(intent.HeaderReplyTo, inbox)
	msg.Header.Set("traceparent", "00-"+traceID+"-00f067aa0ba902b7-01")
	js, err := jetstreamFor(nc)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = js.PublishMsg(ctx, msg)
	require.NoError(t, err)

	select {
	case tp := <-got:
		require.True(t, strings.HasPrefix(tp, "00-"+traceID+"-"), "webhook traceparent %q", tp)
	case <-time.After(15 * time.Second):
		t.Fatal("no webhook request")
	}
	answer, err := sub.NextMsg(15 * time.Second)
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(answer.Header.Get("traceparent"), "00-"+traceID+"-"), "answer traceparent %q", answer.Header.Get("traceparent"))
}

// Spans are exported to an OTLP endpoint only when one is configured.
func TestSpansAreExportedWhenConfigured(t *testing.T) {
	t.Parallel()
	url := jetStream(t)
	var posts atomic.Int32
	collector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if r.URL.Path == "/v1/traces" && len(body) > 0 {
			posts.Add(1)
		}
		w.Header().Set("Content-Type", "application/x-protobuf")
	}))
	t.Cleanup(collector.Close)
	hook := newSink(t, nil)
	w := startWorker(t, "w1", url, writeTools(t, webhookTools(hook.URL, "30s")), "--otlp-endpoint", collector.URL)
	res := publishRaw(t, connect(t, url), "idem.intents.send_email", []byte(`{"tool":"send_email","args":{}}`))(15 * time.Second)
	require.Equal(t, intent.StatusCompleted, res.Status)
	require.NoError(t, w.terminate(20*time.Second)) // shutting down flushes the exporter
	require.Positive(t, posts.Load(), "spans reached the collector")
}
