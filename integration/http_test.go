package integration

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/pkg/intent"
)

// The HTTP front door (cmd/gateway) in front of real workers on a real
// JetStream, called over real HTTP through a proxy that checks every
// response against the OpenAPI document.

// tokens of the test front doors, by who holds them.
const (
	agentA    = "agent-a"    // agent, namespace team-a
	agentB    = "agent-b"    // agent, namespace team-b
	operator  = "ops"        // operator of every namespace
	operatorA = "ops-team-a" // operator of namespace team-a
)

// gateway is a running front door.
type gateway struct {
	proc   *proc
	url    string // through the validating proxy
	direct string // the gateway itself
	tokens map[string]string
	file   string // its tokens file
}

// startGateway runs the gateway binary against natsURL with the four test
// tokens and waits until it listens.
func startGateway(t *testing.T, natsURL string, extra ...string) *gateway {
	t.Helper()
	return startGatewayEnv(t, nil, append([]string{"--nats-url", natsURL}, extra...)...)
}

// startGatewayEnv runs the gateway binary with args (and env) and the four
// test tokens, and waits until it listens.
func startGatewayEnv(t *testing.T, env []string, args ...string) *gateway {
	t.Helper()
	g := &gateway{tokens: map[string]string{}, file: filepath.Join(t.TempDir(), "tokens")}
	for _, tok := range []struct{ name, role, ns string }{
		{agentA, "agent", "team-a"}, {agentB, "agent", "team-b"}, {operator, "operator", "*"}, {operatorA, "operator", "team-a"},
	} {
		out, err := exec.Command(bin("gateway"), "token", "--role", tok.role, "--namespace", tok.ns, "--name", tok.name, "--tokens", g.file).Output()
		require.NoError(t, err, "gateway token")
		g.tokens[tok.name] = strings.TrimSpace(string(out))
	}
	args = append([]string{"--tokens", g.file, "--listen", "127.0.0.1:0", "--log-level", "debug"}, args...)
	g.proc = launchProc(t, "gateway", "gateway", args, env)
	g.direct = g.proc.waitURL(t)
	g.url = newValidatingProxy(t, g.direct).URL
	return g
}

// waitURL waits for the gateway's "gateway listening" log line and returns
// the URL it names.
func (p *proc) waitURL(t *testing.T) string {
	t.Helper()
	p.waitLog(t, "gateway listening", 20*time.Second)
	for _, line := range lines(p.log.String()) {
		var l struct{ Msg, URL string }
		if json.Unmarshal([]byte(line), &l) == nil && l.Msg == "gateway listening" {
			return l.URL
		}
	}
	t.Fatalf("no URL in the gateway's log:\n%s", p.log.String())
	return ""
}

// httpTools is the demo tools file with its webhooks pointed at url, plus
// tools whose downstream blocks until released (slow_job, an unsafe tool;
// slow_read, a read) and one that always fails (strict).
func httpTools(t *testing.T, url string) string {
	t.Helper()
	demo, err := os.ReadFile(filepath.Join("..", "deployments", "demo", "tools.yaml"))
	require.NoError(t, err)
	text := strings.ReplaceAll(string(demo), "http://127.0.0.1:8787", url) + fmt.Sprintf(`
  slow_job:
    effect: webhook
    key_args: [n]
    webhook: {url: %[1]s/slow, timeout: 60s}
  slow_read:
    effect: webhook
    class: read
    webhook: {url: %[1]s/slow-read, timeout: 60s}
  strict:
    effect: webhook
    key_args: [to]
    webhook: {url: %[1]s/fail}
`, url)
	return writeTools(t, text)
}

// httpSink is a downstream for httpTools: /slow and /slow-read block until
// release is called, /fail answers 422, the rest 200 with a JSON body.
func httpSink(t *testing.T) (*sink, func()) {
	t.Helper()
	release := make(chan struct{})
	var once sync.Once
	unblock := func() { once.Do(func() { close(release) }) }
	t.Cleanup(unblock)
	s := newSink(t, func(n int, w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/slow", "/slow-read":
			select {
			case <-release:
			case <-r.Context().Done():
				return
			}
		case "/fail":
			http.Error(w, `{"error":"invalid recipient"}`, http.StatusUnprocessableEntity)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"ok":true,"n":%d,"path":%q,"traceparent":%q}`, n, r.URL.Path, r.Header.Get("traceparent"))
	})
	return s, unblock
}

// httpEnv is a JetStream, a worker with httpTools and a front door.
type httpEnv struct {
	nats    string
	sink    *sink
	release func()
	gw      *gateway
}

func newHTTPEnv(t *testing.T, workerArgs ...string) *httpEnv {
	t.Helper()
	e := &httpEnv{nats: jetStream(t)}
	e.sink, e.release = httpSink(t)
	startWorker(t, "w1", e.nats, httpTools(t, e.sink.URL), workerArgs...)
	e.gw = startGateway(t, e.nats)
	return e
}

// response is one answer of the front door, decoded.
type response struct {
	status int
	header http.Header
	body   map[string]any
	raw    string
}

// str returns the body's member name as a string.
func (r response) str(name string) string { s, _ := r.body[name].(string); return s }

// answer returns the operation's answer a response carries: the body, or
// the problem's answer member.
func (r response) answer(t *testing.T) intent.Result {
	t.Helper()
	var res intent.Result
	src := r.raw
	if a, ok := r.body["answer"]; ok {
		b, err := json.Marshal(a)
		require.NoError(t, err)
		src = string(b)
	}
	require.NoError(t, json.Unmarshal([]byte(src), &res), r.raw)
	return res
}

// do sends a request as the holder of token (none when "") and decodes the
// answer.
func (g *gateway) do(t *testing.T, method, path, token, body string, headers ...string) response {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, g.url+path, rd)
	require.NoError(t, err)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+g.tokens[token])
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Add(headers[i], headers[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	r := response{status: resp.StatusCode, header: resp.Header, raw: string(data)}
	if len(data) > 0 {
		require.NoError(t, json.Unmarshal(data, &r.body), "%s %s: %s", method, path, data)
	}
	return r
}

// call POSTs args to a tool as token.
func (g *gateway) call(t *testing.T, token, tool, args string, headers ...string) response {
	t.Helper()
	return g.do(t, http.MethodPost, "/v1/tools/"+tool, token, args, headers...)
}

// requireProblem checks a problem's status and code.
func requireProblem(t *testing.T, r response, status int, code string) {
	t.Helper()
	require.Equal(t, status, r.status, r.raw)
	require.Equal(t, "application/problem+json", r.header.Get("Content-Type"), r.raw)
	require.Equal(t, code, r.str("code"), r.raw)
	require.EqualValues(t, status, r.body["status"], r.raw)
}

// Every answer of a tool call, each reached by a real request: 200 first
// and replayed, 202, 400, 401, 404, 405, 409, 413, 422, 502, 504 — and 403
// for a denied operation (TestHTTPOperatorAPI).
func TestHTTPToolCalls(t *testing.T) {
	t.Parallel()
	e := newHTTPEnv(t)
	g := e.gw
	email := `{"to":"ada@example.com","subject":"Your order shipped","body":"Hi Ada"}`
	trace := "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"

	first := g.call(t, agentA, "send_email", email, "Idem-Session", "run-7", "traceparent", trace)
	require.Equal(t, http.StatusOK, first.status, first.raw)
	require.Equal(t, "application/json", first.header.Get("Content-Type"))
	res := first.answer(t)
	require.Equal(t, intent.StatusCompleted, res.Status)
	require.False(t, res.Replayed)
	require.Empty(t, first.header.Get(httpReplayed))
	require.Equal(t, "/v1/operations/"+res.Key, first.header.Get("Location"))
	hit := e.sink.waitHit(t, 10*time.Second)
	require.Equal(t, res.Key, hit.Key, "the key goes downstream")
	require.Contains(t, string(res.Result), "0af7651916cd43dd8448eb211c80319c", "the caller's traceparent reaches the effect")

	// The same operation, reworded (body is volatile), in another member order.
	again := g.call(t, agentA, "send_email", `{"body":"Hello Ada","subject":"Your order shipped","to":"ada@example.com"}`, "Idem-Session", "run-7")
	require.Equal(t, http.StatusOK, again.status, again.raw)
	require.Equal(t, "true", again.header.Get(httpReplayed))
	rep := again.answer(t)
	require.True(t, rep.Replayed)
	require.Equal(t, res.Key, rep.Key)
	require.JSONEq(t, string(res.Result), string(rep.Result), "the same recorded result")

	// A key override (a Structured Field string, as the draft has it), then
	// the same key with other arguments: 422, never fired.
	mine := g.call(t, agentA, "send_email", `{"to":"bob@example.com","subject":"Receipt"}`, "Idempotency-Key", `"order-1001"`)
	require.Equal(t, http.StatusOK, mine.status, mine.raw)
	clash := g.call(t, agentA, "send_email", `{"to":"bob@example.com","subject":"Receipt, corrected"}`, "Idempotency-Key", "order-1001")
	requireProblem(t, clash, http.StatusUnprocessableEntity, intent.CodeConflict)
	require.Equal(t, mine.answer(t).Key, clash.str("key"), "the bare header names the same operation")
	require.Equal(t, intent.StatusConflict, clash.answer(t).Status)

	// Bad input: never published, so nothing is dead-lettered for it.
	requireProblem(t, g.call(t, agentA, "send_email", `{"to":`), http.StatusBadRequest, intent.CodeInvalidIntent)
	requireProblem(t, g.call(t, agentA, "send_email", `["to"]`), http.StatusBadRequest, intent.CodeInvalidIntent)
	requireProblem(t, g.call(t, agentA, "send_email", `{"id":9007199254740993}`), http.StatusBadRequest, intent.CodeInvalidIntent)
	requireProblem(t, g.call(t, agentA, "send_email", `{}`, "Idempotency-Key", `""`), http.StatusBadRequest, "invalid_request")
	missing := g.call(t, agentA, "strict", `{"subject":"hi"}`)
	requireProblem(t, missing, http.StatusBadRequest, intent.CodeInvalidIntent)
	require.Contains(t, missing.str("detail"), `key arg "to" is missing`)
	unschemed := g.call(t, agentA, "refund", `{"amount_cents":100}`) // its schema requires order_id, checked first, as the workers do
	requireProblem(t, unschemed, http.StatusBadRequest, intent.CodeInvalidIntent)
	require.Contains(t, unschemed.str("detail"), `args do not match tool refund's schema`)
	requireProblem(t, g.call(t, agentA, "no_such_tool", `{}`), http.StatusNotFound, intent.CodeUnknownTool)
	requireProblem(t, g.call(t, agentA, "Bad.Tool", `{}`), http.StatusNotFound, intent.CodeUnknownTool)
	big := `{"blob":"` + strings.Repeat("x", intent.DefaultMaxBytes) + `"}`
	requireProblem(t, g.call(t, agentA, "echo", big), http.StatusRequestEntityTooLarge, intent.CodeTooLarge)
	requireProblem(t, g.call(t, "", "echo", `{}`), http.StatusUnauthorized, "unauthorized")
	requireProblem(t, g.do(t, http.MethodPost, "/v1/tools/echo", "", `{}`, "Authorization", "Bearer idg_not-a-token"), http.StatusUnauthorized, "unauthorized")
	requireProblem(t, g.do(t, http.MethodGet, "/v1/tools/echo", agentA, ""), http.StatusMethodNotAllowed, "method_not_allowed")
	requireProblem(t, g.do(t, http.MethodGet, "/v2/nothing", agentA, ""), http.StatusNotFound, "no_route")

	// Behind the approval gate: 202 with the operation's Location.
	parked := g.call(t, agentA, "refund", `{"order_id":"o-1","amount_cents":100}`)
	require.Equal(t, http.StatusAccepted, parked.status, parked.raw)
	require.Equal(t, intent.StatusAwaitingApproval, parked.answer(t).Status)
	require.Equal(t, "/v1/operations/"+parked.str("key"), parked.header.Get("Location"))

	// A permanent failure: 502, and the same on a replay.
	failed := g.call(t, agentA, "strict", `{"to":"nobody"}`)
	requireProblem(t, failed, http.StatusBadGateway, intent.CodeEffectFailed)
	failedAgain := g.call(t, agentA, "strict", `{"to":"nobody"}`)
	requireProblem(t, failedAgain, http.StatusBadGateway, intent.CodeEffectFailed)
	require.Equal(t, "true", failedAgain.header.Get(httpReplayed))

	// In flight when the wait runs out: 409 with Retry-After and Location;
	// a repeat is not fired again; the record, watched, turns final.
	inflight := g.call(t, agentA, "slow_job", `{"n":1}`, "Prefer", "wait=1")
	requireProblem(t, inflight, http.StatusConflict, "in_flight")
	require.Equal(t, "1", inflight.header.Get("Retry-After"))
	require.Equal(t, "wait=1", inflight.header.Get("Preference-Applied"))
	loc := inflight.header.Get("Location")
	require.Equal(t, "/v1/operations/"+inflight.str("key"), loc)
	requireProblem(t, g.call(t, agentA, "slow_job", `{"n":1}`, "Prefer", "wait=1"), http.StatusConflict, "in_flight")
	pending := g.do(t, http.MethodGet, loc, agentA, "")
	require.Equal(t, http.StatusOK, pending.status, pending.raw)
	require.Equal(t, "pending", pending.str("status"))
	require.Equal(t, "team-a", pending.str("session"), "the token's namespace is the session")
	// A read without an answer in time: 504 (it is safe to call again).
	requireProblem(t, g.call(t, agentA, "slow_read", `{"id":7}`, "Prefer", "wait=1"), http.StatusGatewayTimeout, "no_answer")
	e.release()
	final := g.do(t, http.MethodGet, loc+"?wait=20", agentA, "")
	require.Equal(t, http.StatusOK, final.status, final.raw)
	require.Equal(t, "completed", final.str("status"))
	done := g.call(t, agentA, "slow_job", `{"n":1}`)
	require.Equal(t, http.StatusOK, done.status, done.raw)
	require.True(t, done.answer(t).Replayed)
	slow := 0
	for _, h := range e.sink.all() {
		if strings.Contains(h.Body, `"n":1`) {
			slow++
		}
	}
	require.Equal(t, 1, slow, "slow_job fired once for its three calls")

	requireProblem(t, g.call(t, agentA, "echo", `{}`, "Idem-Session", "run-\xff"), http.StatusBadRequest, "invalid_request")
	doc := g.do(t, http.MethodGet, "/v1/openapi.json", "", "")
	require.Equal(t, http.StatusOK, doc.status)
	file, err := os.ReadFile(openAPIFile)
	require.NoError(t, err)
	require.JSONEq(t, string(file), doc.raw, "the served document is the checked-in one")

	tools := g.do(t, http.MethodGet, "/v1/tools", agentA, "")
	require.Equal(t, http.StatusOK, tools.status, tools.raw)
	require.Contains(t, tools.raw, `"name":"send_email"`)
	require.Contains(t, tools.raw, `"safe_to_retry"`)
}

// httpReplayed is the replay header.
const httpReplayed = "Idempotent-Replayed"

// 50 identical calls at once: one fires, 49 are replays marked
// Idempotent-Replayed, all with the same result; the downstream sees one
// request.
func TestHTTPConcurrentIdenticalCalls(t *testing.T) {
	t.Parallel()
	e := newHTTPEnv(t)
	const n = 50
	out := make([]response, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			out[i] = e.gw.call(t, agentA, "create_ticket", `{"title":"Printer on fire"}`, "Idem-Session", "load")
		}()
	}
	close(start)
	wg.Wait()
	fired, replays := 0, 0
	for _, r := range out {
		require.Equal(t, http.StatusOK, r.status, r.raw)
		res := r.answer(t)
		require.Equal(t, out[0].answer(t).Key, res.Key)
		require.JSONEq(t, string(out[0].answer(t).Result), string(res.Result))
		if res.Replayed {
			replays++
			require.Equal(t, "true", r.header.Get(httpReplayed))
		} else {
			fired++
			require.Empty(t, r.header.Get(httpReplayed))
		}
	}
	require.Equal(t, 1, fired)
	require.Equal(t, n-1, replays)
	require.Equal(t, 1, e.sink.count(), "one firing downstream")
}

// The operator API: list and filter, approve (fires once), deny (the agent
// then gets 403), resolve, wrong states, forget, dead letters — and the
// same listing from the shell (submit list).
func TestHTTPOperatorAPI(t *testing.T) {
	t.Parallel()
	e := newHTTPEnv(t, "--dup-window", "1s")
	g := e.gw
	parked := g.call(t, agentA, "refund", `{"order_id":"o-1","amount_cents":100}`)
	require.Equal(t, http.StatusAccepted, parked.status, parked.raw)
	key, fp := parked.str("key"), parked.str("fingerprint")
	other := g.call(t, agentB, "refund", `{"order_id":"o-2","amount_cents":200}`)
	require.Equal(t, http.StatusAccepted, other.status, other.raw)
	done := g.call(t, agentA, "echo", `{"n":1}`)
	require.Equal(t, http.StatusOK, done.status, done.raw)

	list := g.do(t, http.MethodGet, "/v1/operations?status=awaiting_approval", operator, "")
	require.Equal(t, http.StatusOK, list.status, list.raw)
	require.Len(t, list.body["records"], 2)
	require.Equal(t, false, list.body["more"])
	// Pages of one, following the Link header.
	var keys []string
	next := "/v1/operations?status=open&limit=1"
	for next != "" {
		page := g.do(t, http.MethodGet, next, operator, "")
		require.Equal(t, http.StatusOK, page.status, page.raw)
		for _, r := range page.body["records"].([]any) {
			keys = append(keys, r.(map[string]any)["key"].(string))
		}
		next = strings.TrimSuffix(strings.TrimPrefix(strings.Split(page.header.Get("Link"), ";")[0], "<"), ">")
		require.Less(t, len(keys), 10)
	}
	require.ElementsMatch(t, []string{ledgerKey(t, key), ledgerKey(t, other.str("key"))}, keys, "a listing shows the ledger keys")
	listed := g.do(t, http.MethodGet, "/v1/operations/"+keys[0], operator, "")
	require.Equal(t, http.StatusOK, listed.status, "a listed key reads the operation: %s", listed.raw)
	byTool := g.do(t, http.MethodGet, "/v1/operations?tool=echo", operator, "")
	require.Len(t, byTool.body["records"], 1)
	bySession := g.do(t, http.MethodGet, "/v1/operations?session=team-b", operator, "")
	require.Len(t, bySession.body["records"], 1)
	require.Len(t, g.do(t, http.MethodGet, "/v1/operations?older_than=1h", operator, "").body["records"], 0)
	require.Len(t, g.do(t, http.MethodGet, "/v1/operations?past_lease=true", operator, "").body["records"], 0)
	requireProblem(t, g.do(t, http.MethodGet, "/v1/operations?status=done", operator, ""), http.StatusBadRequest, "invalid_request")
	requireProblem(t, g.do(t, http.MethodGet, "/v1/operations?colour=red", operator, ""), http.StatusBadRequest, "invalid_request")

	// The same from the shell.
	cli := submit(t, e.nats, "list", "--status", "open")
	require.Equal(t, 0, cli.code, cli.stderr)
	require.Len(t, lines(cli.stdout), 2, cli.stdout)
	require.Contains(t, cli.stdout, ledgerKey(t, key))
	require.Contains(t, cli.stderr, "2 records")

	// Approve: the wrong arguments are refused, the right ones fire once.
	requireProblem(t, g.do(t, http.MethodPost, "/v1/operations/"+key+"/approve", operator, `{"fingerprint":"`+strings.Repeat("0", 64)+`"}`),
		http.StatusUnprocessableEntity, intent.CodeConflict)
	// By the key the listing shows: the firing still forwards the full key.
	approved := g.do(t, http.MethodPost, "/v1/operations/"+ledgerKey(t, key)+"/approve", operator, `{"fingerprint":"`+fp+`","reason":"checked"}`)
	require.Equal(t, http.StatusOK, approved.status, approved.raw)
	require.Equal(t, "completed", approved.str("status"))
	rec := g.do(t, http.MethodGet, "/v1/operations/"+key, agentA, "")
	require.Equal(t, "ops", rec.body["decision"].(map[string]any)["by"], "recorded as the token's name")
	requireProblem(t, g.do(t, http.MethodPost, "/v1/operations/"+key+"/deny", operator, ""), http.StatusConflict, intent.CodeWrongState)
	requireProblem(t, g.do(t, http.MethodPost, "/v1/operations/"+key+"/resolve", operator, `{"outcome":"succeeded"}`), http.StatusConflict, intent.CodeWrongState)
	requireProblem(t, g.do(t, http.MethodPost, "/v1/operations/"+key+"/resolve", operator, `{"outcome":"maybe"}`), http.StatusBadRequest, "invalid_request")
	requireProblem(t, g.do(t, http.MethodPost, "/v1/operations/"+key+"/undo", operator, ""), http.StatusNotFound, "no_route")
	requireProblem(t, g.do(t, http.MethodPost, "/v1/operations/refund.nope/approve", operator, ""), http.StatusNotFound, intent.CodeNotFound)

	// Deny: the agent's repeat is answered 403 denied, never fired.
	denied := g.do(t, http.MethodPost, "/v1/operations/"+ledgerKey(t, other.str("key"))+"/deny", operator, `{"reason":"fraud suspected"}`)
	require.Equal(t, http.StatusOK, denied.status, denied.raw)
	require.Equal(t, "denied", denied.str("status"))
	again := g.call(t, agentB, "refund", `{"order_id":"o-2","amount_cents":200}`)
	requireProblem(t, again, http.StatusForbidden, intent.CodeDenied)
	require.Contains(t, again.str("detail"), "fraud suspected")
	// An approval of the denied operation (from a stale page): 409
	// wrong_state, saying who denied it and when, with the record.
	stale := g.do(t, http.MethodPost, "/v1/operations/"+ledgerKey(t, other.str("key"))+"/approve", operator, `{"fingerprint":"`+other.str("fingerprint")+`"}`)
	requireProblem(t, stale, http.StatusConflict, intent.CodeWrongState)
	staleRec, _ := stale.body["record"].(map[string]any)
	require.NotNil(t, staleRec, "the problem carries the record: %s", stale.raw)
	require.Equal(t, "denied", staleRec["status"], stale.raw)
	decision, _ := staleRec["decision"].(map[string]any)
	require.Equal(t, "deny", decision["op"], stale.raw)
	require.Equal(t, "ops", decision["by"], stale.raw)
	deniedAt, err := time.Parse(time.RFC3339Nano, fmt.Sprint(decision["at"]))
	require.NoError(t, err, stale.raw)
	require.Contains(t, stale.str("detail"), "Denied by ops at "+deniedAt.UTC().Format(time.RFC3339), stale.raw)
	require.Contains(t, stale.str("detail"), "fraud suspected", stale.raw)
	require.Contains(t, stale.str("detail"), "the operation is denied", stale.raw)
	require.NotContains(t, stale.raw, "dedup:", "the ledger's words stay inside")
	refunds := 0
	for _, h := range e.sink.all() {
		if strings.Contains(h.Body, "order_id") {
			refunds++
			require.Equal(t, key, h.Key, "the approved refund fired under its full key")
		}
	}
	require.Equal(t, 1, refunds, "the approved refund fired once, the denied one never")

	// Forget: refused while in flight, then the operation may run again.
	inflight := g.call(t, agentA, "slow_job", `{"n":2}`, "Prefer", "wait=1")
	requireProblem(t, inflight, http.StatusConflict, "in_flight")
	refused := g.do(t, http.MethodDelete, inflight.header.Get("Location"), operator, "")
	requireProblem(t, refused, http.StatusConflict, "in_flight")
	require.NotEmpty(t, refused.header.Get("Retry-After"))
	e.release()
	echoKey := done.str("key")
	forgot := g.do(t, http.MethodDelete, "/v1/operations/"+echoKey, operator, "")
	require.Equal(t, http.StatusOK, forgot.status, forgot.raw)
	require.Equal(t, echoKey, forgot.str("forgotten"))
	tomb := g.do(t, http.MethodGet, "/v1/operations/"+echoKey, agentA, "")
	require.Equal(t, http.StatusOK, tomb.status, tomb.raw)
	require.Equal(t, string(intent.StatusForgotten), tomb.str("status"), "the forgotten record says who forgot it: %s", tomb.raw)
	require.Equal(t, intent.ControlForget, tomb.body["decision"].(map[string]any)["op"], tomb.raw)
	requireProblem(t, g.do(t, http.MethodDelete, "/v1/operations/"+echoKey, operator, ""), http.StatusNotFound, intent.CodeNotFound)
	// Publish dedup would hide a repeat inside the stream's duplicate
	// window (1s here); after it the same call fires again.
	time.Sleep(time.Until(parseTime(t, done.str("completed_at")).Add(1500 * time.Millisecond)))
	rerun := g.call(t, agentA, "echo", `{"n":1}`)
	require.Equal(t, http.StatusOK, rerun.status, rerun.raw)
	require.False(t, rerun.answer(t).Replayed, "forgotten: it ran again")
	cliForget := submit(t, e.nats, "forget", echoKey)
	require.Equal(t, 0, cliForget.code, cliForget.stderr)

	// Dead letters: an intent no worker can read is dead-lettered; an
	// operator lists and replays it.
	nc := connect(t, e.nats)
	bad := publishRaw(t, nc, "idem.intents.echo", []byte(`{"tool":"echo"}`))
	require.Equal(t, intent.StatusRejected, bad(10*time.Second).Status)
	var seq float64
	require.Eventually(t, func() bool {
		dl := g.do(t, http.MethodGet, "/v1/dead-letters?limit=10", operator, "")
		require.Equal(t, http.StatusOK, dl.status, dl.raw)
		letters := dl.body["dead_letters"].([]any)
		if len(letters) == 0 {
			return false
		}
		seq = letters[0].(map[string]any)["seq"].(float64)
		return true
	}, 10*time.Second, 20*time.Millisecond)
	replay := g.do(t, http.MethodPost, fmt.Sprintf("/v1/dead-letters/%d/replay", int(seq)), operator, "")
	require.Equal(t, http.StatusOK, replay.status, replay.raw)
	requireProblem(t, g.do(t, http.MethodPost, fmt.Sprintf("/v1/dead-letters/%d/replay", int(seq)+1000), operator, ""), http.StatusNotFound, intent.CodeNotFound)
	requireProblem(t, g.do(t, http.MethodGet, "/v1/dead-letters?limit=0", operator, ""), http.StatusBadRequest, "invalid_request")
}

func parseTime(t *testing.T, s string) time.Time {
	t.Helper()
	at, err := time.Parse(time.RFC3339Nano, s)
	require.NoError(t, err)
	return at
}

// One agent cannot read, list or decide another's operations; agent tokens
// are refused every operator endpoint; an operator of one namespace sees
// only it.
func TestHTTPTokensAreScoped(t *testing.T) {
	t.Parallel()
	e := newHTTPEnv(t)
	g := e.gw
	a := g.call(t, agentA, "refund", `{"order_id":"o-9","amount_cents":900}`, "Idem-Session", "run-1")
	require.Equal(t, http.StatusAccepted, a.status, a.raw)
	key := a.str("key")

	// Agent B: not found (existence is not revealed), and the same call is
	// another operation in B's namespace.
	requireProblem(t, g.do(t, http.MethodGet, "/v1/operations/"+key, agentB, ""), http.StatusNotFound, intent.CodeNotFound)
	requireProblem(t, g.do(t, http.MethodGet, "/v1/operations/"+key+"?wait=1", agentB, ""), http.StatusNotFound, intent.CodeNotFound)
	b := g.call(t, agentB, "refund", `{"order_id":"o-9","amount_cents":900}`, "Idem-Session", "run-1")
	require.Equal(t, http.StatusAccepted, b.status, b.raw)
	require.NotEqual(t, key, b.str("key"), "a namespace scopes the key")
	// An Idempotency-Key is scoped by the namespace too.
	ka := g.call(t, agentA, "echo", `{"n":1}`, "Idempotency-Key", "shared-name")
	kb := g.call(t, agentB, "echo", `{"n":2}`, "Idempotency-Key", "shared-name")
	require.Equal(t, http.StatusOK, kb.status, "not a conflict with A's: %s", kb.raw)
	require.NotEqual(t, ka.str("key"), kb.str("key"))

	// Agents on operator endpoints: 403.
	for _, req := range []struct{ method, path, body string }{
		{http.MethodGet, "/v1/operations", ""},
		{http.MethodGet, "/v1/operations?status=open", ""},
		{http.MethodPost, "/v1/operations/" + key + "/approve", `{}`},
		{http.MethodPost, "/v1/operations/" + key + "/deny", `{}`},
		{http.MethodPost, "/v1/operations/" + key + "/resolve", `{"outcome":"failed"}`},
		{http.MethodDelete, "/v1/operations/" + key, ""},
		{http.MethodGet, "/v1/dead-letters", ""},
		{http.MethodPost, "/v1/dead-letters/1/replay", ""},
	} {
		for _, who := range []string{agentA, agentB} {
			requireProblem(t, g.do(t, req.method, req.path, who, req.body), http.StatusForbidden, "forbidden")
		}
	}
	own := g.do(t, http.MethodGet, "/v1/operations/"+key, agentA, "")
	require.Equal(t, http.StatusOK, own.status, own.raw)
	require.Equal(t, "team-a/run-1", own.str("session"))

	// An operator of team-a: lists and decides team-a only.
	la := g.do(t, http.MethodGet, "/v1/operations?status=awaiting_approval", operatorA, "")
	require.Equal(t, http.StatusOK, la.status, la.raw)
	require.Len(t, la.body["records"], 1)
	require.Equal(t, ledgerKey(t, key), la.body["records"].([]any)[0].(map[string]any)["key"])
	requireProblem(t, g.do(t, http.MethodPost, "/v1/operations/"+b.str("key")+"/deny", operatorA, ""), http.StatusNotFound, intent.CodeNotFound)
	requireProblem(t, g.do(t, http.MethodDelete, "/v1/operations/"+kb.str("key"), operatorA, ""), http.StatusNotFound, intent.CodeNotFound)
	dl := g.do(t, http.MethodGet, "/v1/dead-letters", operatorA, "")
	requireProblem(t, dl, http.StatusForbidden, "forbidden")
	require.Contains(t, dl.header.Get("WWW-Authenticate"), `error="insufficient_scope"`, "a 403 says why, as RFC 6750 asks")
	denied := g.do(t, http.MethodPost, "/v1/operations/"+key+"/deny", operatorA, "")
	require.Equal(t, http.StatusOK, denied.status, denied.raw)
	// The operator of every namespace sees both.
	all := g.do(t, http.MethodGet, "/v1/operations?tool=refund", operator, "")
	require.Len(t, all.body["records"], 2)
	require.Equal(t, 0, e.sink.count(), "nothing was approved")
}

// Rate limits, an installation that cannot be reached, and requests that
// are too slow or too large are all bounded.
func TestHTTPLimitsAndBounds(t *testing.T) {
	t.Parallel()
	// No worker on this JetStream: the catalogue does not answer.
	g := startGateway(t, jetStream(t), "--rate", "0.2", "--burst", "2",
		"--read-header-timeout", "1s", "--body-timeout", "1s", "--max-body", "1024")
	requireProblem(t, g.do(t, http.MethodGet, "/v1/tools", agentA, ""), http.StatusServiceUnavailable, "unavailable")
	requireProblem(t, g.call(t, agentA, "echo", `{}`), http.StatusServiceUnavailable, "unavailable")
	limited := g.do(t, http.MethodGet, "/v1/tools", agentA, "")
	requireProblem(t, limited, http.StatusTooManyRequests, intent.CodeRateLimited)
	require.Equal(t, "5", limited.header.Get("Retry-After"), "one request per 5s")
	health := g.do(t, http.MethodGet, "/healthz", "", "")
	require.Equal(t, http.StatusOK, health.status, "healthz needs no token and no rate")

	// Oversized: refused from the Content-Length before the body is read,
	// and by counting when the body is chunked.
	requireProblem(t, g.call(t, agentB, "echo", `{"blob":"`+strings.Repeat("x", 2000)+`"}`), http.StatusRequestEntityTooLarge, intent.CodeTooLarge)
	conn := dialRaw(t, g.direct)
	fmt.Fprintf(conn, "POST /v1/tools/echo HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Length: 10000000\r\n\r\n", g.tokens[operator])
	require.Contains(t, readStatusLine(t, conn), "413", "answered without the body")
	conn = dialRaw(t, g.direct)
	fmt.Fprintf(conn, "POST /v1/tools/echo HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nTransfer-Encoding: chunked\r\n\r\n800\r\n%s\r\n", g.tokens[operatorA], strings.Repeat("x", 2048))
	require.Contains(t, readStatusLine(t, conn), "413")
	conn = dialRaw(t, g.direct)
	fmt.Fprintf(conn, "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: %s\r\n\r\n", strings.Repeat("y", 64<<10))
	require.Contains(t, readStatusLine(t, conn), "431", "headers over the limit")

	// Slowloris: headers that never end are cut off after the header
	// timeout; a body that trickles gets 408 after the body timeout.
	slow := dialRaw(t, g.direct)
	start := time.Now()
	fmt.Fprintf(slow, "GET /healthz HTTP/1.1\r\nHost: x\r\n")
	go func() {
		for range 20 {
			if _, err := fmt.Fprintf(slow, "X-Slow: 1\r\n"); err != nil {
				return
			}
			time.Sleep(200 * time.Millisecond)
		}
	}()
	_, _ = io.ReadAll(slow) // returns when the server closes the connection
	require.Less(t, time.Since(start), 3*time.Second, "the slow headers were cut off")
	conn = dialRaw(t, g.direct)
	start = time.Now()
	fmt.Fprintf(conn, "POST /v1/tools/echo HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Length: 100\r\n\r\n{", g.tokens[agentB])
	require.Contains(t, readStatusLine(t, conn), "408")
	require.Less(t, time.Since(start), 3*time.Second)
}

// dialRaw opens a TCP connection to the server of url, closed when the
// test ends.
func dialRaw(t *testing.T, url string) net.Conn {
	t.Helper()
	conn, err := net.DialTimeout("tcp", strings.TrimPrefix(url, "http://"), 5*time.Second)
	require.NoError(t, err)
	require.NoError(t, conn.SetDeadline(time.Now().Add(15*time.Second)))
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

func readStatusLine(t *testing.T, conn net.Conn) string {
	t.Helper()
	line, err := bufio.NewReader(conn).ReadString('\n')
	require.NoError(t, err)
	return line
}

// The listen rules: a non-loopback address needs TLS or --insecure-listen;
// with a certificate the API is served over HTTPS.
func TestHTTPListenNeedsTLS(t *testing.T) {
	t.Parallel()
	url := jetStream(t)
	tokens := filepath.Join(t.TempDir(), "tokens")
	out, err := exec.Command(bin("gateway"), "token", "--role", "agent", "--namespace", "a", "--tokens", tokens).Output()
	require.NoError(t, err)
	token := strings.TrimSpace(string(out))

	cmd := exec.Command(bin("gateway"), "--tokens", tokens, "--nats-url", url, "--listen", "0.0.0.0:0")
	msg, err := cmd.CombinedOutput()
	require.Error(t, err, "refused: %s", msg)
	require.Contains(t, string(msg), "is not loopback: serve TLS (--tls-cert, --tls-key) or say --insecure-listen")
	msg, err = exec.Command(bin("gateway"), "--nats-url", url).CombinedOutput()
	require.Error(t, err)
	require.Contains(t, string(msg), "--tokens is required")

	dir := t.TempDir()
	ca := newTestCA(t, dir, "ca")
	cert, key := ca.serverCert(t, dir)
	p := launchProc(t, "gateway", "gateway-tls", []string{"--tokens", tokens, "--nats-url", url, "--listen", "0.0.0.0:0", "--tls-cert", cert, "--tls-key", key}, nil)
	addr := p.waitURL(t)
	require.True(t, strings.HasPrefix(addr, "https://"), addr)
	port := addr[strings.LastIndex(addr, ":")+1:]
	pool := x509.NewCertPool()
	pool.AddCert(ca.cert)
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
	req, err := http.NewRequest(http.MethodGet, "https://127.0.0.1:"+port+"/healthz", nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := hc.Do(req)
	require.NoError(t, err)
	_ = resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	plain, err := http.Get("http://127.0.0.1:" + port + "/healthz")
	require.NoError(t, err)
	_ = plain.Body.Close()
	require.Equal(t, http.StatusBadRequest, plain.StatusCode, "plain HTTP is refused on the TLS port")

	p = launchProc(t, "gateway", "gateway-insecure", []string{"--tokens", tokens, "--nats-url", url, "--listen", "0.0.0.0:0", "--insecure-listen"}, nil)
	require.True(t, strings.HasPrefix(p.waitURL(t), "http://"))
}

// A holder killed mid-effect of an on_abandoned: hold tool leaves the
// operation uncertain: a call is answered 202 uncertain with its Location,
// an operator lists it (past_lease finds nothing left pending) and
// resolves it over HTTP, and the caller's repeat gets the resolution.
func TestHTTPUncertainAndResolve(t *testing.T) {
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
	loc := inflight.header.Get("Location")
	h := hook.waitHit(t, 20*time.Second)
	require.Equal(t, inflight.str("key"), h.Key)
	holder := g.do(t, http.MethodGet, loc, agentA, "").str("holder")
	require.Contains(t, workers, holder)
	workers[holder].kill()

	held := g.call(t, agentA, "wire_money", args, "Prefer", "wait=30")
	require.Equal(t, http.StatusAccepted, held.status, held.raw)
	require.Equal(t, intent.StatusUncertain, held.answer(t).Status)
	require.Equal(t, loc, held.header.Get("Location"))
	open := g.do(t, http.MethodGet, "/v1/operations?status=uncertain", operator, "")
	require.Len(t, open.body["records"], 1, open.raw)
	require.Len(t, g.do(t, http.MethodGet, "/v1/operations?past_lease=true", operator, "").body["records"], 0)

	resolved := g.do(t, http.MethodPost, loc+"/resolve", operator, `{"outcome":"succeeded","result":{"confirmation":"BANK-77"},"reason":"bank statement"}`)
	require.Equal(t, http.StatusOK, resolved.status, resolved.raw)
	require.Equal(t, "completed", resolved.str("status"))
	again := g.call(t, agentA, "wire_money", args)
	require.Equal(t, http.StatusOK, again.status, again.raw)
	require.JSONEq(t, `{"confirmation":"BANK-77"}`, string(again.answer(t).Result))
	release()
	require.Equal(t, 1, hook.count(), "never fired again")
}

// SIGTERM: the gateway stops accepting connections, lets a call in progress
// finish with its answer, and exits 0.
func TestHTTPGatewayDrainsOnSIGTERM(t *testing.T) {
	t.Parallel()
	e := newHTTPEnv(t)
	g := e.gw
	answered := make(chan response, 1)
	go func() { answered <- g.call(t, agentA, "slow_job", `{"n":"drain"}`) }()
	require.Contains(t, e.sink.waitHit(t, 30*time.Second).Body, `"drain"`, "the call is in progress")
	require.NoError(t, g.proc.cmd.Process.Signal(syscall.SIGTERM))
	addr := strings.TrimPrefix(g.direct, "http://")
	require.Eventually(t, func() bool {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			_ = c.Close()
		}
		return err != nil
	}, 10*time.Second, 20*time.Millisecond, "no new connection after SIGTERM")
	select {
	case <-g.proc.done:
		t.Fatal("the gateway exited with a call in progress")
	default:
	}
	e.release()
	r := <-answered
	require.Equal(t, http.StatusOK, r.status, r.raw)
	require.Equal(t, intent.StatusCompleted, r.answer(t).Status)
	select {
	case <-g.proc.done:
		require.NoError(t, g.proc.err, "exit status after a drain")
	case <-time.After(10 * time.Second):
		t.Fatal("the gateway did not exit after its drain")
	}
	require.Contains(t, g.proc.log.String(), "gateway stopped")
}

// Past --drain-timeout the gateway closes the calls left and exits; a cut
// call's operation is not lost: it completes, and a retry gets its answer.
func TestHTTPGatewayDrainTimeout(t *testing.T) {
	t.Parallel()
	e := &httpEnv{nats: jetStream(t)}
	e.sink, e.release = httpSink(t)
	startWorker(t, "w1", e.nats, httpTools(t, e.sink.URL))
	g := startGateway(t, e.nats, "--drain-timeout", "1s")
	require.Equal(t, http.StatusOK, g.call(t, agentA, "echo", `{"n":"before"}`).status)
	cut := make(chan error, 1)
	go func() {
		req, err := http.NewRequest(http.MethodPost, g.direct+"/v1/tools/slow_job", strings.NewReader(`{"n":"cut"}`))
		if err == nil {
			req.Header.Set("Authorization", "Bearer "+g.tokens[agentA])
			var res *http.Response
			if res, err = http.DefaultClient.Do(req); err == nil {
				_ = res.Body.Close()
				err = fmt.Errorf("answered %d", res.StatusCode)
			}
		}
		cut <- err
	}()
	for h := e.sink.waitHit(t, 30*time.Second); !strings.Contains(h.Body, `"cut"`); h = e.sink.waitHit(t, 30*time.Second) {
	}
	start := time.Now()
	require.NoError(t, g.proc.cmd.Process.Signal(syscall.SIGTERM))
	select {
	case <-g.proc.done:
	case <-time.After(15 * time.Second):
		t.Fatal("the gateway did not exit after its drain timeout")
	}
	require.GreaterOrEqual(t, time.Since(start), time.Second, "the call had its drain timeout")
	require.Error(t, <-cut, "the call in progress is closed, not answered")

	e.release()
	other := startGateway(t, e.nats)
	again := other.call(t, agentA, "slow_job", `{"n":"cut"}`)
	require.Equal(t, http.StatusOK, again.status, again.raw)
	require.Equal(t, intent.StatusCompleted, again.answer(t).Status)
	fired := 0
	for _, h := range e.sink.all() {
		if strings.Contains(h.Body, `"cut"`) {
			fired++
		}
	}
	require.Equal(t, 1, fired, "fired once for the cut call and its retry")
}

// ledgerKey is key as a new (layout 2) ledger stores it, and lists it.
func ledgerKey(t *testing.T, key string) string {
	t.Helper()
	sk, err := intent.LedgerKey(key, intent.DefaultLayout)
	require.NoError(t, err)
	return sk
}
