package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os/exec"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/pkg/intent"
)

// The operator console (docs/console.md) in a real browser, against real
// binaries: a worker on a real JetStream, the front door serving the
// console, the demo sink (cmd/sink) counting what fires.

// consoleEnv is a JetStream, the demo sink, a worker with a refund tool
// behind the approval gate (and whatever tools more gives), and a front
// door that reads the worker's metrics every second.
type consoleEnv struct {
	nats   string
	sink   *realSink
	gw     *gateway
	worker *proc
}

func newConsoleEnv(t *testing.T, more string) *consoleEnv {
	t.Helper()
	e := &consoleEnv{nats: jetStream(t), sink: startRealSink(t)}
	admin := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	tools := writeTools(t, fmt.Sprintf(`tools:
  refund:
    description: Refund an order.
    effect: webhook
    key_args: [order_id]
    approval: required
    webhook: {url: %[1]s/refunds}
  send_email:
    description: Send an email.
    effect: webhook
    key_args: [to, subject]
    webhook: {url: %[1]s/email}
%[2]s`, e.sink.url, more))
	e.worker = startWorker(t, "w1", e.nats, tools, "--admin-addr", admin)
	e.gw = startGateway(t, e.nats, "--worker-metrics", "http://"+admin+"/metrics", "--worker-metrics-every", "1s")
	return e
}

// tab opens a browser tab on the front door, logged in as token (a name of
// the gateway's test tokens).
func (e *consoleEnv) tab(t *testing.T, token string) *tab {
	t.Helper()
	b := openTab(t, e.gw.direct)
	b.login(e.gw.tokens[token])
	return b
}

// waitingCaller runs submit for a refund that waits past the approval for
// the final answer, as an agent would; the answer arrives on the channel.
func waitingCaller(t *testing.T, natsURL, args string) <-chan submitted {
	t.Helper()
	out := make(chan submitted, 1)
	cmd := exec.Command(bin("submit"), "--tool", "refund", "--args", args, "--session", "team-a/run-1", "--wait-final", "--nats-url", natsURL)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	require.NoError(t, cmd.Start())
	go func() {
		err := cmd.Wait()
		s := submitted{stdout: stdout.String(), stderr: stderr.String()}
		if ee, ok := err.(*exec.ExitError); ok {
			s.code = ee.ExitCode()
		}
		_ = json.Unmarshal(stdout.Bytes(), &s.res)
		out <- s
	}()
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	return out
}

// item is the selector of the queue's entry for key.
func item(key string) string { return fmt.Sprintf(`li.item[data-key=%q]`, key) }

// An intent behind the approval gate appears in an open queue without a
// reload, with the arguments it would fire with; one click approves it, it
// fires once (the sink counts) and the caller that waited gets its result.
// A second tab, drawn before the approval and cut off from live updates,
// approves the same operation again: nothing fires again, and the page says
// so. The record, the search and the overview show what happened.
func TestConsoleApprovalFiresOnce(t *testing.T) {
	t.Parallel()
	e := newConsoleEnv(t, "")
	login := openTab(t, e.gw.direct)
	login.open("/console/login")
	login.shot("login")

	live := e.tab(t, operator)
	live.open("/console/")
	live.do(chromedp.WaitVisible(chromedp.CSS(`#live-status.on`)), chromedp.WaitVisible(chromedp.CSS(`#queue-empty`)))

	answer := waitingCaller(t, e.nats, `{"order_id":"A-1001","amount_cents":2500,"reason":"damaged in transit"}`)
	live.do(chromedp.WaitVisible(chromedp.CSS(`li.item[data-status="awaiting_approval"]`)))
	key := live.attr(`li.item`, "data-key")
	require.Contains(t, live.text(item(key)+` pre.args`), `"amount_cents": 2500`, "the arguments being approved are on screen")
	live.waitText(`[data-count="awaiting_approval"]`, "1")
	live.shot("queue")

	stale := e.tab(t, operator)
	stale.blockEvents()
	stale.open("/console/")
	stale.do(chromedp.WaitVisible(chromedp.CSS(item(key))))

	live.do(chromedp.SendKeys(chromedp.CSS(item(key)+` input[name="reason"]`), "receipt checked"),
		chromedp.Click(chromedp.CSS(item(key)+` button.approve`)),
		chromedp.WaitVisible(chromedp.CSS(`#flashes .flash`)))
	require.Contains(t, live.text(`#flashes .flash`), "fired once and completed")
	live.do(chromedp.WaitVisible(chromedp.CSS(`#queue-empty`)))
	live.shot("approved")

	got := <-answer
	require.Equal(t, 0, got.code, "submit: %s %s", got.stdout, got.stderr)
	require.Equal(t, intent.StatusCompleted, got.res.Status, got.stdout)
	require.False(t, got.res.Replayed, "the caller whose call parked the operation is not answered as a replay")
	var fired struct {
		Accepted   bool `json:"accepted"`
		Deliveries int  `json:"deliveries"`
	}
	require.NoError(t, json.Unmarshal(got.res.Result, &fired), got.stdout)
	require.True(t, fired.Accepted, "the caller got the sink's answer: %s", got.res.Result)
	require.Equal(t, 1, fired.Deliveries, got.stdout)
	require.Equal(t, 1, e.sink.requests(t), "the approved refund fired once")

	// The stale tab still shows the operation as awaiting approval.
	stale.do(chromedp.Click(chromedp.CSS(item(key)+` button.approve`)), chromedp.WaitVisible(chromedp.CSS(`#flashes .flash`)))
	require.Contains(t, stale.text(`#flashes .flash`), "Already decided")
	require.Equal(t, 1, e.sink.requests(t), "a second approval fires nothing")
	rec := e.gw.do(t, http.MethodGet, "/v1/operations/"+key, operator, "")
	require.Equal(t, "completed", rec.str("status"), rec.raw)
	require.EqualValues(t, 1, rec.body["attempts"], rec.raw)

	// The record page, found by the operation's full key: everything known,
	// and the commands that do the same.
	live.open("/console/search?key=" + got.res.Key)
	require.Contains(t, live.text(`h1`), got.res.Key)
	live.open("/console/op/" + key)
	require.Contains(t, live.text(`#decision`), "receipt checked")
	require.Contains(t, live.text(`#decision`), operator)
	require.Contains(t, live.text(`#outcome`), `"accepted": true`)
	require.Contains(t, live.text(`#commands`), "bin/submit get "+key)
	require.Contains(t, live.text(`#commands`), "/v1/operations/"+key)
	live.shot("record")

	live.open("/console/search?tool=refund&status=completed&since=1h")
	require.Equal(t, 1, live.count(`table.results tbody tr`))
	live.shot("search")

	// Forget it from its page: the record is gone, so it may run again.
	live.open("/console/op/" + key)
	live.do(chromedp.Click(chromedp.CSS(`#forget button`)), chromedp.WaitVisible(chromedp.CSS(`#flashes .flash`)))
	require.Contains(t, live.text(`#flashes .flash`), "Forgotten")
	gone := e.gw.do(t, http.MethodGet, "/v1/operations/"+key, operator, "")
	require.Equal(t, http.StatusOK, gone.status, gone.raw)
	require.Equal(t, string(intent.StatusForgotten), gone.str("status"), "the forgotten record: %s", gone.raw)

	// Traffic for the overview: emails sent, repeated (replays), one
	// reusing a key with other arguments (a conflict); a refund left
	// waiting. A repeat inside the intent stream's duplicate window is
	// answered from the ledger by its client, reaching no worker, so the
	// workers' counters may not see it: the test counts on the firings.
	for i := range 4 {
		args := fmt.Sprintf(`{"to":"user-%d@example.com","subject":"Your order shipped","body":"Hello"}`, i)
		require.Equal(t, http.StatusOK, e.gw.call(t, agentA, "send_email", args).status)
		again := e.gw.call(t, agentA, "send_email", args)
		require.Equal(t, "true", again.header.Get("Idempotent-Replayed"), again.raw)
	}
	requireProblem(t, e.gw.call(t, agentA, "send_email", `{"to":"user-0@example.com","subject":"Your order shipped","body":"Hi again"}`),
		http.StatusUnprocessableEntity, intent.CodeConflict)
	waiting := e.gw.call(t, agentB, "refund", `{"order_id":"A-1002","amount_cents":990}`, "Prefer", "wait=30")
	require.Equal(t, http.StatusAccepted, waiting.status, waiting.raw)

	// The overview charts the workers' counters: wait for the read that saw
	// them (the front door reads them every second).
	for {
		live.open("/console/overview")
		rates, err := chromedp.Run(live.ctx, chromedp.Evaluate[map[string][]string](`Object.fromEntries(
			[...document.querySelectorAll('table.rates tbody tr')].map(r => [r.querySelector('th').textContent,
				[...r.querySelectorAll('figcaption')].map(f => f.textContent)]))`))
		require.NoError(t, err)
		// Per tool: fired, replayed, conflicts, failures, takeovers.
		if email := rates["send_email"]; len(email) == 5 && email[0] == "4" && len(rates["refund"]) == 5 {
			break
		}
		select {
		case <-t.Context().Done():
			t.Fatalf("the overview never charted the traffic: %v", rates)
		case <-time.After(200 * time.Millisecond):
		}
	}
	require.Contains(t, live.text(`table.ages`), "awaiting approval")
	live.shot("overview")

	// An unresolved operation is forgotten from its page only "anyway".
	wkey := ledgerKey(t, waiting.str("key"))
	live.open("/console/op/" + wkey)
	live.do(chromedp.SendKeys(chromedp.CSS(`#forget-reason`), "asked twice"),
		chromedp.Click(chromedp.CSS(`#forget button`)), chromedp.WaitVisible(chromedp.CSS(`#flashes .flash`)))
	require.Contains(t, live.text(`#flashes .flash`), "Refused")
	require.Equal(t, http.StatusOK, e.gw.do(t, http.MethodGet, "/v1/operations/"+wkey, operator, "").status, "still there")
	live.open("/console/op/" + wkey)
	live.do(chromedp.Click(chromedp.CSS(`#forget input[name="force"]`)),
		chromedp.Click(chromedp.CSS(`#forget button`)), chromedp.WaitVisible(chromedp.CSS(`#flashes .flash`)))
	require.Contains(t, live.text(`#flashes .flash`), "Forgotten")
	forgotten := e.gw.do(t, http.MethodGet, "/v1/operations/"+wkey, operator, "")
	require.Equal(t, string(intent.StatusForgotten), forgotten.str("status"), forgotten.raw)
}

// A page that shows old arguments cannot approve new ones: the key is
// forgotten and used again with other arguments; the page drawn before
// (cut off from live updates) still shows the old ones, and its approval
// is refused by their fingerprint — nothing fires. A live page shows the
// new arguments by itself, and approving those fires once.
func TestConsoleStaleArgumentsNotApproved(t *testing.T) {
	t.Parallel()
	e := newConsoleEnv(t, "")
	g := e.gw
	first := g.call(t, agentA, "refund", `{"order_id":"B-7","amount_cents":1000}`, "Prefer", "wait=30")
	require.Equal(t, http.StatusAccepted, first.status, first.raw)
	key := ledgerKey(t, first.str("key")) // as the ledger lists it, and the queue shows it

	live := e.tab(t, operatorA)
	live.open("/console/")
	live.do(chromedp.WaitVisible(chromedp.CSS(`#live-status.on`)))
	stale := e.tab(t, operatorA)
	stale.blockEvents()
	stale.open("/console/")
	require.Contains(t, stale.text(item(key)+` pre.args`), `"amount_cents": 1000`)

	forgot := g.do(t, http.MethodDelete, "/v1/operations/"+key+"?force=true", operator, "")
	require.Equal(t, http.StatusOK, forgot.status, forgot.raw)
	second := g.call(t, agentA, "refund", `{"order_id":"B-7","amount_cents":99999}`, "Prefer", "wait=30")
	require.Equal(t, http.StatusAccepted, second.status, second.raw)
	require.Equal(t, key, ledgerKey(t, second.str("key")), "the same operation, other arguments")

	live.waitContains(item(key)+` pre.args`, `"amount_cents": 99999`)

	require.Contains(t, stale.text(item(key)+` pre.args`), `"amount_cents": 1000`, "the stale page still shows the old arguments")
	stale.do(chromedp.Click(chromedp.CSS(item(key)+` button.approve`)), chromedp.WaitVisible(chromedp.CSS(`#flashes .flash`)))
	require.Contains(t, stale.text(`#flashes .flash`), "no longer the ones this page showed")
	require.Equal(t, "flash error", stale.attr(`#flashes .flash`, "class"))
	stale.shot("stale-refused")
	rec := g.do(t, http.MethodGet, "/v1/operations/"+key, operator, "")
	require.Equal(t, "awaiting_approval", rec.str("status"), rec.raw)
	require.Equal(t, 0, e.sink.requests(t), "nothing fired")

	live.do(chromedp.Click(chromedp.CSS(item(key)+` button.approve`)), chromedp.WaitVisible(chromedp.CSS(`#flashes .flash`)))
	require.Contains(t, live.text(`#flashes .flash`), "fired once")
	require.Equal(t, 1, e.sink.requests(t), "the arguments shown fired, once")
}

// An uncertain operation (its holder died mid-effect, the tool holds it for
// a person) is resolved from the page, with the keyboard alone: the callers
// then get the outcome recorded, and it never fires again.
func TestConsoleResolvesUncertain(t *testing.T) {
	t.Parallel()
	url := jetStream(t)
	hook, release := httpSink(t)
	tools := writeTools(t, fmt.Sprintf(`tools:
  wire_money:
    effect: webhook
    key_args: [to, cents]
    lease: 1s
    on_abandoned: hold
    webhook: {url: %s/slow, timeout: 60s}
`, hook.URL))
	workers := map[string]*proc{
		"w1": startWorker(t, "w1", url, tools, "--ack-wait", "1s"),
		"w2": startWorker(t, "w2", url, tools, "--ack-wait", "1s"),
	}
	g := startGateway(t, url)
	args := `{"to":"acct-1","cents":500}`
	inflight := g.call(t, agentA, "wire_money", args, "Prefer", "wait=1")
	requireProblem(t, inflight, http.StatusConflict, "in_flight")
	key := ledgerKey(t, inflight.str("key"))
	hook.waitHit(t, 20*time.Second)
	workers[g.do(t, http.MethodGet, "/v1/operations/"+key, agentA, "").str("holder")].kill()
	held := g.call(t, agentA, "wire_money", args, "Prefer", "wait=30")
	require.Equal(t, intent.StatusUncertain, held.answer(t).Status, held.raw)

	b := openTab(t, g.direct)
	b.login(g.tokens[operator])
	b.open("/console/")
	b.do(chromedp.WaitVisible(chromedp.CSS(item(key) + `[data-status="uncertain"]`)))
	b.waitText(`[data-count="uncertain"]`, "1")
	b.shot("uncertain")

	form := item(key) + ` form.resolve`
	b.do(chromedp.Focus(chromedp.CSS(form+` input[value="succeeded"]`)),
		chromedp.KeyEvent(" "),
		chromedp.Focus(chromedp.CSS(form+` textarea[name="result"]`)),
		chromedp.KeyEvent(`{"confirmation":"BANK-77"}`),
		chromedp.KeyEvent(kb.Tab),
		chromedp.KeyEvent("bank statement"),
		chromedp.KeyEvent(kb.Enter),
		chromedp.WaitVisible(chromedp.CSS(`#flashes .flash`)))
	require.Contains(t, b.text(`#flashes .flash`), "Resolved")

	again := g.call(t, agentA, "wire_money", args)
	require.Equal(t, http.StatusOK, again.status, again.raw)
	require.JSONEq(t, `{"confirmation":"BANK-77"}`, string(again.answer(t).Result))
	rec := g.do(t, http.MethodGet, "/v1/operations/"+key, operator, "")
	require.Equal(t, "bank statement", rec.body["decision"].(map[string]any)["reason"], rec.raw)
	release()
	require.Equal(t, 1, hook.count(), "never fired again")
}

// A dead letter is listed with its reason and delivery count, inspected
// (its envelope), and replayed from the page once the tool it named exists:
// it fires once.
func TestConsoleReplaysDeadLetter(t *testing.T) {
	t.Parallel()
	e := newConsoleEnv(t, "")
	nc := connect(t, e.nats)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	dlq, err := js.OrderedConsumer(ctx, "IDEM_DLQ", jetstream.OrderedConsumerConfig{})
	require.NoError(t, err)

	// A tool the workers do not serve yet: the intent is answered
	// unknown_tool and dead-lettered.
	msg := nats.NewMsg("idem.intents.ship_order")
	msg.Data = []byte(`{"tool":"ship_order","args":{"order_id":"C-42","carrier":"dhl"},"session":"team-a/run-9"}`)
	_, err = js.PublishMsg(ctx, msg)
	require.NoError(t, err)
	_, err = dlq.Next(jetstream.FetchContext(ctx))
	require.NoError(t, err, "the intent reached the dead letters")

	b := e.tab(t, operator)
	b.open("/console/dead-letters")
	require.Equal(t, 1, b.count(`table.results tbody tr`))
	require.Contains(t, b.text(`table.results tbody td.reason`), "unknown_tool")
	require.Equal(t, "1", b.text(`table.results tbody tr td:nth-child(4)`), "delivered once")
	b.shot("dead-letters")
	b.do(chromedp.Click(chromedp.CSS(`table.results tbody a`)), chromedp.WaitVisible(chromedp.CSS(`h1`)))
	require.Contains(t, b.text(`pre.args`), `"carrier": "dhl"`)
	b.shot("dead-letter")

	// The tool is deployed; the dead letter is replayed from the page.
	e.worker.kill()
	startWorker(t, "w2", e.nats, writeTools(t, fmt.Sprintf(`tools:
  ship_order:
    effect: webhook
    key_args: [order_id]
    webhook: {url: %s/shipments}
`, e.sink.url)))
	b.do(chromedp.Click(chromedp.CSS(`button.replay`)), chromedp.WaitVisible(chromedp.CSS(`#flashes .flash`)))
	require.Contains(t, b.text(`#flashes .flash`), "published again")
	require.Contains(t, b.text(`main`), "No dead letters")

	var derived struct{ Key string }
	require.NoError(t, json.Unmarshal([]byte(submit(t, e.nats, "key", "--tool", "ship_order", "--args", `{"order_id":"C-42","carrier":"dhl"}`, "--session", "team-a/run-9").stdout), &derived))
	rec := e.gw.do(t, http.MethodGet, "/v1/operations/"+derived.Key+"?wait=60", operator, "")
	require.Equal(t, "completed", rec.str("status"), rec.raw)
	require.Equal(t, 1, e.sink.requests(t), "the replayed intent fired once")
}

// An operator of one namespace sees and touches only that namespace: another
// namespace's operation never shows in its queue (live or drawn), its page
// is not found, and a forged approval of it does nothing. Dead letters,
// which carry no trusted session, and the workers' rates, which count every
// namespace, are for operators of every namespace.
func TestConsoleNamespaces(t *testing.T) {
	t.Parallel()
	e := newConsoleEnv(t, "")
	g := e.gw
	a := e.tab(t, operatorA)
	a.recordEvents()
	a.open("/console/")
	a.do(chromedp.WaitVisible(chromedp.CSS(`#live-status.on`)))
	all := e.tab(t, operator)
	all.open("/console/")
	all.do(chromedp.WaitVisible(chromedp.CSS(`#live-status.on`)))

	theirs := g.call(t, agentB, "refund", `{"order_id":"D-1","amount_cents":700}`, "Prefer", "wait=30")
	require.Equal(t, http.StatusAccepted, theirs.status, theirs.raw)
	ours := g.call(t, agentA, "refund", `{"order_id":"D-2","amount_cents":800}`, "Prefer", "wait=30")
	require.Equal(t, http.StatusAccepted, ours.status, ours.raw)
	bKey, aKey := ledgerKey(t, theirs.str("key")), ledgerKey(t, ours.str("key"))

	all.do(chromedp.WaitVisible(chromedp.CSS(item(bKey))), chromedp.WaitVisible(chromedp.CSS(item(aKey))))
	a.do(chromedp.WaitVisible(chromedp.CSS(item(aKey))))
	require.Contains(t, a.stream(), aKey)
	require.NotContains(t, a.stream(), bKey, "team-a's operator is not sent team-b's operation")
	require.Zero(t, a.count(item(bKey)))
	a.open("/console/")
	require.Zero(t, a.count(item(bKey)), "nor shown it when the queue is drawn")
	require.Equal(t, "1", a.text(`[data-count="awaiting_approval"]`), "drawn from the ledger")

	a.open("/console/op/" + bKey)
	require.Contains(t, a.text(`main`), "No operation")
	a.open("/console/search?key=" + bKey)
	require.Contains(t, a.text(`main`), "No operation")

	// A form the page never drew, posted with the session's own CSRF token.
	fp := g.do(t, http.MethodGet, "/v1/operations/"+bKey, operator, "").str("fingerprint")
	a.open("/console/")
	a.do(chromedp.Evaluate[chromedp.Void](fmt.Sprintf(`(() => {
		const f = document.createElement('form');
		f.method = 'post';
		f.action = '/console/op/%s/approve';
		for (const [n, v] of [['csrf', document.querySelector('input[name=csrf]').value], ['fingerprint', %q]]) {
			const i = document.createElement('input'); i.type = 'hidden'; i.name = n; i.value = v; f.appendChild(i);
		}
		document.body.appendChild(f);
		f.submit();
	})()`, bKey, fp)), chromedp.WaitVisible(chromedp.CSS(`#flashes .flash`)))
	require.Contains(t, a.text(`#flashes .flash`), "No operation")
	require.Equal(t, "awaiting_approval", g.do(t, http.MethodGet, "/v1/operations/"+bKey, operator, "").str("status"))
	require.Equal(t, 0, e.sink.requests(t))

	// The operator of every namespace denies it, with a reason its caller
	// reads.
	all.do(chromedp.SendKeys(chromedp.CSS(item(bKey)+` input[name="reason"]`), "not this customer"),
		chromedp.Click(chromedp.CSS(item(bKey)+` button.deny`)),
		chromedp.WaitVisible(chromedp.CSS(`#flashes .flash`)))
	require.Contains(t, all.text(`#flashes .flash`), "Denied")
	denied := g.do(t, http.MethodGet, "/v1/operations/"+bKey, agentB, "")
	require.Equal(t, "denied", denied.str("status"), denied.raw)
	require.Contains(t, denied.raw, "not this customer")

	a.open("/console/dead-letters")
	require.Contains(t, a.text(`main`), "operators of every namespace")
	a.open("/console/overview")
	require.Contains(t, a.text(`#rates-h + p`), "operators of every namespace")
}
