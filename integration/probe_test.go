package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/pkg/dedup"
	"github.com/idemgate/idemgate/pkg/effects"
	"github.com/idemgate/idemgate/pkg/intent"
)

// probeBundle is a worker whose tools probe the real sink, and the ledger
// the test plays a vanished holder on.
type probeBundle struct {
	url    string
	sink   *realSink
	tools  string
	ledger *dedup.Ledger
}

// setupProbes starts the sink and a worker with a refund tool per probe
// behaviour (the sink's answer by key; always unknown; never an answer),
// each held as uncertain when a probe cannot tell (on_abandoned: hold).
func setupProbes(t *testing.T, extra ...string) *probeBundle {
	t.Helper()
	b := &probeBundle{url: jetStream(t), sink: startRealSink(t)}
	tool := func(name, query, timeout string) string {
		return fmt.Sprintf(`  %s:
    effect: webhook
    key_args: [order]
    lease: 1s
    on_abandoned: hold
    webhook: {url: %s/refunds}
    probe: {url: "%s/probe?key={key}%s", timeout: %s, done: {status: 200}, not_done: {status: 404}}
`, name, b.sink.url, b.sink.url, query, timeout)
	}
	b.tools = writeTools(t, "tools:\n"+tool("refund", "", "30s")+tool("refund_unknown", "&mode=unknown", "30s")+tool("refund_hang", "&mode=hang", "1s"))
	startWorker(t, "w1", b.url, b.tools, append([]string{"--ack-wait", "2s"}, extra...)...)
	js, err := jetstream.New(connect(t, b.url))
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b.ledger, err = dedup.Open(ctx, js, dedup.BucketConfig{Bucket: "IDEM_LEDGER"}, dedup.Bind())
	require.NoError(t, err)
	return b
}

// abandon claims the operation of tool and args as a holder that then
// vanishes (its lease of a second runs out, nothing is recorded); fired
// says whether its request reached the downstream first. It returns the
// operation's key and the vanished holder's lease.
func (b *probeBundle) abandon(t *testing.T, tool, args string, fired bool) (string, *dedup.Lease) {
	t.Helper()
	k := submit(t, b.url, "key", "--tools", b.tools, "--tool", tool, "--args", args)
	require.Equal(t, 0, k.code, k.stderr)
	var id struct{ Key, Fingerprint string }
	require.NoError(t, json.Unmarshal([]byte(k.stdout), &id))
	c, err := b.ledger.Claim(t.Context(), dedup.ClaimRequest{Key: id.Key, Tool: tool, Fingerprint: id.Fingerprint, Holder: "vanished", Lease: time.Second})
	require.NoError(t, err)
	require.Equal(t, dedup.Acquired, c.Outcome)
	if fired {
		req, err := http.NewRequest(http.MethodPost, b.sink.url+"/refunds", strings.NewReader(args))
		require.NoError(t, err)
		req.Header.Set(effects.HeaderIdempotencyKey, id.Key)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		_ = resp.Body.Close()
	}
	return id.Key, c.Lease
}

// record is the ledger record of key as submit get prints it.
func (b *probeBundle) record(t *testing.T, key string) dedup.Record {
	t.Helper()
	g := submit(t, b.url, "get", key)
	require.Equal(t, 0, g.code, g.stderr)
	var rec dedup.Record
	require.NoError(t, json.Unmarshal([]byte(g.stdout), &rec), g.stdout)
	return rec
}

// A takeover asks the downstream first: done settles the operation with
// the downstream's answer and sends nothing; not done fires it once (even
// with on_abandoned: hold); unknown, and a probe that hangs, hold it as
// uncertain, within the probe's time bound.
func TestProbeBeforeTakeover(t *testing.T) {
	t.Parallel()
	b := setupProbes(t)

	t.Run("Done", func(t *testing.T) {
		t.Parallel()
		args := `{"order":"o-done","cents":500}`
		key, _ := b.abandon(t, "refund", args, true)
		res := submit(t, b.url, "--tool", "refund", "--args", args, "--wait", "60s")
		require.Equal(t, intent.StatusCompleted, res.res.Status, res.stdout+res.stderr)
		var answer struct {
			Key        string
			Deliveries int
		}
		require.NoError(t, json.Unmarshal(res.res.Result, &answer))
		require.Equal(t, key, answer.Key, "the result is what the downstream answered the vanished holder")
		require.Equal(t, 1, answer.Deliveries)
		require.True(t, res.res.Replayed, "the vanished holder's call caused it")
		require.Equal(t, 1, b.sink.firings(t, key), "settled without a second request")
		rec := b.record(t, key)
		require.NotNil(t, rec.Probe)
		require.Equal(t, "done", rec.Probe.Verdict)
		require.Equal(t, "200 OK", rec.Probe.Status)
		require.Contains(t, rec.Probe.Request, "GET "+b.sink.url+"/probe?key=")
		require.Equal(t, 1, rec.Attempts, "the vanished holder's request counts")
	})
	t.Run("NotDone", func(t *testing.T) {
		t.Parallel()
		args := `{"order":"o-new","cents":500}`
		key, _ := b.abandon(t, "refund", args, false)
		res := submit(t, b.url, "--tool", "refund", "--args", args, "--wait", "60s")
		require.Equal(t, intent.StatusCompleted, res.res.Status, res.stdout+res.stderr)
		require.Equal(t, 1, b.sink.firings(t, key), "fired once")
		rec := b.record(t, key)
		require.NotNil(t, rec.Probe)
		require.Equal(t, "not_done", rec.Probe.Verdict)
		require.Equal(t, "404 Not Found", rec.Probe.Status)
	})
	t.Run("Unknown", func(t *testing.T) {
		t.Parallel()
		args := `{"order":"o-unknown","cents":500}`
		key, _ := b.abandon(t, "refund_unknown", args, true)
		res := submit(t, b.url, "--tool", "refund_unknown", "--args", args, "--wait", "60s")
		require.Equal(t, intent.StatusUncertain, res.res.Status, res.stdout+res.stderr)
		require.Equal(t, 1, b.sink.firings(t, key), "held, not fired again")
		rec := b.record(t, key)
		require.NotNil(t, rec.Probe)
		require.Equal(t, "unknown", rec.Probe.Verdict)
		require.Equal(t, "503 Service Unavailable", rec.Probe.Status)
		require.Contains(t, rec.Probe.Body, "cannot tell now")
	})
	t.Run("Hang", func(t *testing.T) {
		t.Parallel()
		args := `{"order":"o-hang","cents":500}`
		key, _ := b.abandon(t, "refund_hang", args, false)
		// Were the probe not bounded, no answer would come within the wait.
		res := submit(t, b.url, "--tool", "refund_hang", "--args", args, "--wait", "30s")
		require.Equal(t, intent.StatusUncertain, res.res.Status, res.stdout+res.stderr)
		require.Zero(t, b.sink.firings(t, key), "held, not fired")
		rec := b.record(t, key)
		require.NotNil(t, rec.Probe)
		require.Equal(t, "unknown", rec.Probe.Verdict)
		require.Equal(t, "no answer within 1s", rec.Probe.Status, "the probe is bounded by its timeout")
	})
}

// hold makes the vanished holder's operation uncertain, as a worker with
// on_abandoned: hold and no probe would.
func hold(t *testing.T, l *dedup.Lease) {
	t.Helper()
	_, err := l.Hold(t.Context(), "the holder vanished mid-effect")
	require.NoError(t, err)
}

// An operator probes an uncertain operation on demand, with submit probe
// and over HTTP: done completes it with the downstream's answer, not done
// leaves it uncertain with the new evidence; only operators may.
func TestProbeOnOperatorRequest(t *testing.T) {
	t.Parallel()
	b := setupProbes(t, "--ledger-scan", "0") // no periodic probes here
	g := startGateway(t, b.url)

	key, l := b.abandon(t, "refund", `{"order":"o-op-1"}`, true)
	hold(t, l)
	res := submit(t, b.url, "probe", key, "--by", "ops")
	require.Equal(t, 0, res.code, res.stdout+res.stderr)
	require.Equal(t, intent.StatusCompleted, res.res.Status)
	var answer struct{ Key string }
	require.NoError(t, json.Unmarshal(res.res.Result, &answer))
	require.Equal(t, key, answer.Key, "completed with what the downstream answered")
	require.Equal(t, 1, b.sink.firings(t, key))
	require.Equal(t, "done", b.record(t, key).Probe.Verdict)
	again := submit(t, b.url, "probe", key)
	require.Equal(t, 5, again.code, "a completed operation is not probed")
	require.Equal(t, intent.CodeWrongState, again.res.Error.Code)

	key2, l2 := b.abandon(t, "refund", `{"order":"o-op-2"}`, false)
	hold(t, l2)
	requireProblem(t, g.do(t, http.MethodPost, "/v1/operations/"+key2+"/probe", agentA, ""), http.StatusForbidden, "forbidden")
	r := g.do(t, http.MethodPost, "/v1/operations/"+key2+"/probe", operator, "")
	require.Equal(t, http.StatusOK, r.status, r.raw)
	require.Equal(t, string(intent.StatusUncertain), r.str("status"), "not done: still the operator's to resolve")
	rec := g.do(t, http.MethodGet, "/v1/operations/"+key2, operator, "")
	require.Equal(t, http.StatusOK, rec.status, rec.raw)
	probe, _ := rec.body["probe"].(map[string]any)
	require.Equal(t, "not_done", probe["verdict"], rec.raw)
	require.Equal(t, "404 Not Found", probe["status"])
	require.Zero(t, b.sink.firings(t, key2), "a probe fires nothing")
}

// The ledger scan probes uncertain records: one whose downstream has done
// the operation meanwhile is completed, and its waiting caller answered.
func TestProbeUncertainPeriodically(t *testing.T) {
	t.Parallel()
	b := setupProbes(t, "--ledger-scan", "1s")
	args := `{"order":"o-scan"}`
	key, l := b.abandon(t, "refund", args, false)
	hold(t, l)
	// An operator's probe: not done yet (the record keeps the key it asked
	// about, which a scan of a compact ledger needs).
	first := submit(t, b.url, "probe", key)
	require.Equal(t, intent.StatusUncertain, first.res.Status, first.stdout+first.stderr)
	// The downstream learns of it late (a queue, a manual entry): the next
	// scan's probe finds it done.
	req, err := http.NewRequest(http.MethodPost, b.sink.url+"/refunds", strings.NewReader(args))
	require.NoError(t, err)
	req.Header.Set(effects.HeaderIdempotencyKey, key)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	_ = resp.Body.Close()
	w := submit(t, b.url, "watch", key, "--wait", "60s")
	require.Equal(t, intent.StatusCompleted, w.res.Status, w.stdout+w.stderr)
	rec := b.record(t, key)
	require.Equal(t, "done", rec.Probe.Verdict)
	require.Equal(t, 1, b.sink.firings(t, key))
}
