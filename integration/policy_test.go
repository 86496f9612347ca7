package integration

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/pkg/intent"
)

// Each class behaves as declared: reads and idempotent tools without the
// ledger fire every time and leave no record; idempotent tools with the
// ledger replay; unsafe tools refuse an intent without a derivable key. The
// catalogue reports each class and whether it is safe to retry.
func TestToolClasses(t *testing.T) {
	t.Parallel()
	url := jetStream(t)
	hook := newSink(t, nil)
	startWorker(t, "w1", url, writeTools(t, fmt.Sprintf(`tools:
  get_order:    {effect: webhook, class: read, webhook: {url: %[1]s/read}}
  set_status:   {effect: webhook, class: idempotent, webhook: {url: %[1]s/set}}
  set_flag:     {effect: webhook, class: idempotent, ledger: false, webhook: {url: %[1]s/flag}}
  charge:       {effect: webhook, class: unsafe, key_args: [order_id], webhook: {url: %[1]s/charge}}
`, hook.URL)))

	for range 2 {
		s := submit(t, url, "--tool", "get_order", "--args", `{"id":1}`, "--wait", "30s")
		require.Equal(t, 0, s.code, s.stderr)
	}
	read := submit(t, url, "get", submit(t, url, "key", "--tool", "get_order", "--args", `{"id":1}`).res.Key)
	require.Equal(t, 1, read.code, "a read leaves no ledger record")
	require.Contains(t, read.stderr, "no such key")

	for i := range 2 {
		s := submit(t, url, "--tool", "set_flag", "--args", `{"on":true}`, "--wait", "30s")
		require.Equal(t, 0, s.code, "without the ledger every call fires (%d): %s", i, s.stderr)
	}
	first := submit(t, url, "--tool", "set_status", "--args", `{"status":"shipped"}`, "--wait", "30s")
	require.Equal(t, 0, first.code, first.stderr)
	again := submit(t, url, "--tool", "set_status", "--args", `{"status":"shipped"}`, "--wait", "30s")
	require.Equal(t, 3, again.code, "the ledger replays an idempotent write")

	nc := connect(t, url)
	refused := publishRaw(t, nc, "idem.intents.charge", []byte(`{"tool":"charge","args":{"amount":10}}`))(15 * time.Second)
	require.Equal(t, intent.StatusRejected, refused.Status)
	require.Contains(t, refused.Error.Message, `key arg "order_id" is missing`)
	withKey := submit(t, url, "--tool", "charge", "--args", `{"amount":10}`, "--key", "charge-order-7", "--wait", "30s")
	require.Equal(t, 0, withKey.code, "an explicit key names the operation: %s", withKey.stderr)

	require.Equal(t, 2+2+1+1, hook.count())

	tools := submit(t, url, "tools")
	var cat intent.Catalog
	require.NoError(t, json.Unmarshal([]byte(tools.stdout), &cat))
	classes := map[string]string{}
	for _, tl := range cat.Tools {
		classes[tl.Name] = fmt.Sprintf("%s retry=%t ledger=%t", tl.Class, tl.SafeToRetry, tl.Ledger)
	}
	require.Equal(t, map[string]string{
		"get_order":  "read retry=true ledger=false",
		"set_status": "idempotent retry=true ledger=true",
		"set_flag":   "idempotent retry=true ledger=false",
		"charge":     "unsafe retry=false ledger=true",
	}, classes)
}

// A tool behind the approval gate: callers are answered awaiting_approval,
// nothing fires; two concurrent approvals seen by three workers fire once;
// the caller waiting for the final answer gets it; an approval for other
// arguments is refused; a denied operation never fires.
func TestApprovalGate(t *testing.T) {
	t.Parallel()
	url := jetStream(t)
	hook := newSink(t, nil)
	tools := writeTools(t, fmt.Sprintf(`tools:
  refund:
    effect: webhook
    key_args: [order]
    approval: required
    approval_ttl: 10m
    webhook: {url: %s}
`, hook.URL))
	for i := range 3 {
		startWorker(t, fmt.Sprintf("w%d", i+1), url, tools)
	}
	args := `{"order":"98765","amount":40}`
	parked := submit(t, url, "--tool", "refund", "--args", args, "--wait", "30s")
	require.Equal(t, 6, parked.code, "awaiting approval exits 6: %s %s", parked.stdout, parked.stderr)
	require.Equal(t, intent.StatusAwaitingApproval, parked.res.Status)
	dup := submit(t, url, "--tool", "refund", "--args", args, "--wait", "30s")
	require.Equal(t, intent.StatusAwaitingApproval, dup.res.Status)
	require.Equal(t, 0, hook.count(), "nothing fires before approval")

	final := make(chan submitted, 1)
	go func() {
		final <- submit(t, url, "--tool", "refund", "--args", args, "--wait", "60s", "--wait-final")
	}()

	wrong := submit(t, url, "approve", parked.res.Key, "--fingerprint", strings.Repeat("0", 64), "--by", "ops")
	require.Equal(t, intent.StatusRejected, wrong.res.Status, wrong.stdout+wrong.stderr)
	require.Equal(t, intent.CodeConflict, wrong.res.Error.Code)

	var wg sync.WaitGroup
	approvals := make([]submitted, 2)
	for i := range approvals {
		wg.Add(1)
		go func() {
			defer wg.Done()
			approvals[i] = submit(t, url, "approve", parked.res.Key, "--fingerprint", parked.res.Fingerprint, "--by", "ops", "--reason", "customer called")
		}()
	}
	wg.Wait()
	for _, a := range approvals {
		require.Equal(t, intent.StatusCompleted, a.res.Status, a.stdout+a.stderr)
		require.Equal(t, 0, a.code)
	}
	require.Equal(t, 1, hook.count(), "two approvals, three workers: one firing")
	require.Equal(t, parked.res.Key, hook.all()[0].Key)

	f := <-final
	require.Equal(t, intent.StatusCompleted, f.res.Status, f.stdout+f.stderr)
	require.True(t, f.res.Replayed)

	rec := submit(t, url, "get", parked.res.Key)
	require.Contains(t, rec.stdout, `"op": "approve"`)
	require.Contains(t, rec.stdout, `"by": "ops"`)

	other := submit(t, url, "--tool", "refund", "--args", `{"order":"11111","amount":5}`, "--wait", "30s")
	require.Equal(t, intent.StatusAwaitingApproval, other.res.Status)
	denied := submit(t, url, "deny", other.res.Key, "--by", "ops", "--reason", "fraud suspected")
	require.Equal(t, 0, denied.code, "a denial that took effect exits 0: %s %s", denied.stdout, denied.stderr)
	require.Equal(t, intent.StatusDenied, denied.res.Status)
	require.Equal(t, intent.CodeDenied, denied.res.Error.Code)
	late := submit(t, url, "approve", other.res.Key)
	require.Equal(t, intent.CodeWrongState, late.res.Error.Code, "a denied operation cannot be approved")
	require.Equal(t, 5, late.code, "a decision that does not apply exits 5")
	again := submit(t, url, "--tool", "refund", "--args", `{"order":"11111","amount":5}`, "--wait", "30s")
	require.Equal(t, intent.StatusDenied, again.res.Status)
	require.Equal(t, 1, hook.count(), "a denied operation never fires")
}

// on_abandoned: hold — a holder killed mid-effect leaves the operation
// uncertain instead of firing it again; an operator resolves it and the
// waiting caller gets that answer.
func TestAbandonedHoldAndResolve(t *testing.T) {
	t.Parallel()
	url := jetStream(t)
	release := make(chan struct{})
	hook := newSink(t, func(n int, w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
	defer close(release)
	tools := writeTools(t, fmt.Sprintf(`tools:
  wire_money:
    effect: webhook
    key_args: [to, cents]
    lease: 1s
    on_abandoned: hold
    webhook: {url: %s, timeout: 60s}
`, hook.URL))
	workers := map[string]*proc{
		"w1": startWorker(t, "w1", url, tools, "--ack-wait", "1s"),
		"w2": startWorker(t, "w2", url, tools, "--ack-wait", "1s"),
	}
	final := make(chan submitted, 1)
	go func() {
		final <- submit(t, url, "--tool", "wire_money", "--args", `{"to":"acct-1","cents":500}`, "--wait", "60s", "--wait-final")
	}()
	h := hook.waitHit(t, 20*time.Second)
	var holder string
	require.Eventually(t, func() bool {
		g := submit(t, url, "get", h.Key)
		var rec struct{ Holder string }
		_ = json.Unmarshal([]byte(g.stdout), &rec)
		holder = rec.Holder
		return holder != ""
	}, 10*time.Second, 50*time.Millisecond)
	workers[holder].kill()

	require.Eventually(t, func() bool {
		return strings.Contains(submit(t, url, "get", h.Key).stdout, `"status": "uncertain"`)
	}, 30*time.Second, 100*time.Millisecond, "the survivor holds the operation as uncertain")
	require.Equal(t, 1, hook.count(), "never fired again on its own")

	wrong := submit(t, url, "resolve", h.Key, "--outcome", "maybe")
	require.Equal(t, 1, wrong.code)
	require.Contains(t, wrong.stderr, "use succeeded or failed")
	res := submit(t, url, "resolve", h.Key, "--outcome", "succeeded", "--result", `{"confirmation":"BANK-77"}`, "--by", "ops", "--reason", "bank statement shows it")
	require.Equal(t, 0, res.code, res.stdout+res.stderr)
	require.Equal(t, intent.StatusCompleted, res.res.Status)

	f := <-final
	require.Equal(t, intent.StatusCompleted, f.res.Status, f.stdout+f.stderr)
	require.JSONEq(t, `{"confirmation":"BANK-77"}`, string(f.res.Result))
	require.Equal(t, 1, hook.count())
}

// Dead letters: bad input lands in IDEM_DLQ with its reason, subject and
// delivery count; nothing is lost (every message in is answered or dead-
// lettered); a dead letter replayed after the fix is served.
func TestDeadLetters(t *testing.T) {
	t.Parallel()
	url := jetStream(t)
	hook := newSink(t, nil)
	w := startWorker(t, "w1", url, writeTools(t, webhookTools(hook.URL, "30s")))
	nc := connect(t, url)

	good, bad := 0, 0
	var waits []func(time.Duration) intent.Result
	for i := range 12 {
		var data string
		subject := "idem.intents.send_email"
		switch i % 4 {
		case 0:
			data = `{"tool":"send_email","args":`
			bad++
		case 1:
			subject, data = "idem.intents.new_tool", `{"tool":"new_tool","args":{"n":`+fmt.Sprint(i)+`}}`
			bad++
		default:
			data = fmt.Sprintf(`{"tool":"send_email","args":{"n":%d}}`, i)
			good++
		}
		waits = append(waits, publishRaw(t, nc, subject, []byte(data)))
	}
	answered := map[intent.Status]int{}
	for _, wait := range waits {
		answered[wait(15*time.Second).Status]++
	}
	require.Equal(t, map[intent.Status]int{intent.StatusCompleted: good, intent.StatusRejected: bad}, answered)

	var letters []map[string]any
	require.Eventually(t, func() bool {
		list := submit(t, url, "dlq", "list")
		letters = nil
		for _, l := range lines(list.stdout) {
			var d map[string]any
			require.NoError(t, json.Unmarshal([]byte(l), &d))
			letters = append(letters, d)
		}
		return len(letters) == bad
	}, 10*time.Second, 100*time.Millisecond)
	var newTool map[string]any
	for _, d := range letters {
		require.NotEmpty(t, d["reason"])
		require.EqualValues(t, 1, d["delivered"])
		if d["subject"] == "idem.intents.new_tool" {
			newTool = d
			require.Contains(t, d["reason"], "unknown_tool")
		}
	}
	require.NotNil(t, newTool)

	// The work stream holds nothing: in = answered + dead-lettered.
	js, err := jetstreamFor(nc)
	require.NoError(t, err)
	st, err := js.Stream(t.Context(), "IDEM_INTENTS")
	require.NoError(t, err)
	info, err := st.Info(t.Context())
	require.NoError(t, err)
	require.EqualValues(t, 0, info.State.Msgs)
	require.EqualValues(t, good+bad, info.State.LastSeq)

	// Configure the missing tool, replay the dead letter: it is served.
	require.NoError(t, w.terminate(20*time.Second))
	startWorker(t, "w2", url, writeTools(t, fmt.Sprintf(`tools:
  send_email: {effect: webhook, key_args: all, webhook: {url: %[1]s}}
  new_tool: {effect: webhook, key_args: [n], webhook: {url: %[1]s}}
`, hook.URL)))
	seq := fmt.Sprint(newTool["seq"])
	replay := submit(t, url, "dlq", "replay", seq)
	require.Equal(t, 0, replay.code, replay.stderr)
	require.Eventually(t, func() bool { return hook.count() == good+1 }, 15*time.Second, 50*time.Millisecond)
	list := submit(t, url, "dlq", "list")
	require.Len(t, lines(list.stdout), bad-1, "the replayed dead letter left the stream")
}
