package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	gosmtp "github.com/emersion/go-smtp"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/pkg/intent"
)

// What a hostile caller — a model choosing arguments, an agent choosing a
// session, an agent reading the catalogue — can do to the effects, tried
// against the real binaries.

// upstreamServer is a real MCP server over streamable HTTP in the test
// process: charge (an open schema) and peek (a closed schema, which calls
// itself read-only), each counting its calls.
type upstreamServer struct {
	*httptest.Server
	requests atomic.Int64 // HTTP requests that reached it
	mu       sync.Mutex
	calls    map[string]int
}

func newUpstreamServer(t *testing.T) *upstreamServer {
	t.Helper()
	u := &upstreamServer{calls: map[string]int{}}
	srv := mcp.NewServer(&mcp.Implementation{Name: "upstream", Version: "1"}, nil)
	count := func(name string) mcp.ToolHandler {
		return func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			u.mu.Lock()
			defer u.mu.Unlock()
			u.calls[name]++
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: fmt.Sprintf("%s %d", name, u.calls[name])}}}, nil
		}
	}
	srv.AddTool(&mcp.Tool{Name: "charge", InputSchema: map[string]any{"type": "object", "properties": map[string]any{"order": map[string]any{"type": "string"}}, "required": []string{"order"}}}, count("charge"))
	srv.AddTool(&mcp.Tool{Name: "peek", Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true},
		InputSchema: map[string]any{"type": "object", "properties": map[string]any{"id": map[string]any{"type": "string"}}, "additionalProperties": false}}, count("peek"))
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, nil)
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.requests.Add(1)
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(func() {
		for ss := range srv.Sessions() {
			_ = ss.Close()
		}
		u.Close()
	})
	return u
}

func (u *upstreamServer) count(tool string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.calls[tool]
}

// Hole: the model chooses the key. A worker whose tools file has an unsafe
// tool keyed by all its args, with no schema to refuse an invented arg,
// does not start; the error names the file, the line, the tool and the ways
// out. --check-config says the same.
func TestWorkerRefusesAnUnsafeToolAModelCanKey(t *testing.T) {
	t.Parallel()
	tools := writeTools(t, `tools:
  send_email:
    effect: webhook
    key_args: [to, subject]
    webhook: {url: "http://127.0.0.1:9/email"}
  create_ticket:
    effect: webhook
    webhook: {url: "http://127.0.0.1:9/tickets"}
`)
	want := tools + ":6: create_ticket: an unsafe tool keyed by all its args, with no schema: an arg a model invents (a request id, a uuid) makes each retry another operation, which fires again"
	fixes := []string{"key_args: [order_id]", "close the schema (additionalProperties: false)", "key_args: all", "class: read or idempotent"}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin("worker"), "--check-config", "--tools", tools).CombinedOutput()
	var ee *exec.ExitError
	require.ErrorAs(t, err, &ee, string(out))
	require.Equal(t, 1, ee.ExitCode())
	require.Contains(t, string(out), want)
	for _, fix := range fixes {
		require.Contains(t, string(out), fix)
	}
	require.NotContains(t, string(out), "send_email")

	w := launchWorker(t, "w1", []string{"--tools", tools, "--nats-url", jetStream(t), "--webhook-allow", "127.0.0.0/8"}, nil)
	select {
	case <-w.done:
	case <-ctx.Done():
		t.Fatalf("the worker still runs:\n%s", w.log.String())
	}
	require.ErrorAs(t, w.err, &ee)
	require.Equal(t, 1, ee.ExitCode())
	require.Contains(t, w.log.String(), want)
	require.NotContains(t, w.log.String(), "worker consuming")
}

// The ways out hold: a model that adds an argument of its own to a call of
// a tool with a closed schema is refused, and to a call of a tool with
// key_args gets a conflict. Neither fires again, over MCP or over NATS.
func TestInventedArgumentsDoNotFireAgain(t *testing.T) {
	t.Parallel()
	url := jetStream(t)
	hook := newSink(t, nil)
	startWorker(t, "w1", url, writeTools(t, fmt.Sprintf(`tools:
  create_ticket:
    effect: webhook
    schema:
      type: object
      properties: {title: {type: string}}
      required: [title]
      additionalProperties: false
    webhook: {url: %[1]s/tickets}
  send_email:
    effect: webhook
    key_args: [to, subject]
    webhook: {url: %[1]s/email}
`, hook.URL)))
	cs := stdioSession(t, url, []string{"--session", "run-1"})
	ticket := map[string]any{"title": "printer on fire"}
	email := map[string]any{"to": "ada@example.com", "subject": "hi"}
	require.False(t, mcpCall(t, cs, "create_ticket", ticket).IsError)
	require.False(t, mcpCall(t, cs, "send_email", email).IsError)

	invented := []string{"x-request-id", "uuid", "call_id", "trace_id", "operation_id", "attempt", "request_uuid"}
	for i, name := range invented {
		with := func(args map[string]any) map[string]any {
			out := map[string]any{name: fmt.Sprintf("v-%d", i)}
			for k, v := range args {
				out[k] = v
			}
			return out
		}
		res := mcpCall(t, cs, "create_ticket", with(ticket))
		require.True(t, res.IsError, "%s: %s", name, mcpText(res))
		require.Contains(t, mcpText(res), "Invalid arguments for create_ticket", name)
		res = mcpCall(t, cs, "send_email", with(email))
		require.False(t, res.IsError, "%s: a conflict is an outcome, not a tool error: %s", name, mcpText(res))
		require.Equal(t, string(intent.StatusConflict), opOf(t, res.Meta).Status, "%s: %s", name, mcpText(res))

		args, err := json.Marshal(with(ticket))
		require.NoError(t, err)
		s := submit(t, url, "--tool", "create_ticket", "--session", "run-1", "--args", string(args), "--wait", "30s")
		require.NotZero(t, s.code, "%s: refused by the client before publishing: %s %s", name, s.stdout, s.stderr)
		require.Contains(t, s.stderr, "args do not match tool create_ticket's schema", name)
		args, err = json.Marshal(with(email))
		require.NoError(t, err)
		s = submit(t, url, "--tool", "send_email", "--session", "run-1", "--args", string(args), "--wait", "30s")
		require.Equal(t, intent.StatusConflict, s.res.Status, "%s: %s %s", name, s.stdout, s.stderr)
	}
	require.Equal(t, 2, hook.count(), "each operation fired once")
}

// Hole: upstream secrets shown to agents. A URL upstream's credential is in
// its URL (user, password, query), a command upstream's in its arguments:
// neither is in the catalogue an agent reads (over HTTP and NATS), in the
// failure recorded and returned for a call, or in the worker's log.
func TestUpstreamSecretsAreNotShown(t *testing.T) {
	t.Parallel()
	self, err := os.Executable()
	require.NoError(t, err)
	up := newUpstreamServer(t)
	secretURL := strings.Replace(up.URL, "http://", "http://agent-user:pw-s3cret@", 1) + "/mcp?token=tok-s3cret"
	secrets := []string{"pw-s3cret", "tok-s3cret", "agent-user", "k-s3cret"}
	url := jetStream(t)
	tools := writeTools(t, fmt.Sprintf(`mcp_upstreams:
  pay:
    command: [%q, --api-key, k-s3cret]
    tools:
      charge: {key_args: [order]}
      balance: {class: read}
  remote:
    url: %q
    prefix: r_
    tools:
      charge: {key_args: [order]}
      peek: {class: read}
`, self, secretURL))
	w := launchWorker(t, "w1", []string{"--tools", tools, "--holder", "w1", "--log-level", "debug", "--nats-url", url, "--webhook-allow", "127.0.0.0/8",
		"--max-deliver", "2", "--retry-delay", "100ms", "--max-retry-delay", "100ms"}, []string{upstreamEnv + "=" + t.TempDir()})
	w.waitLog(t, "worker consuming", 30*time.Second)
	hidden := func(t *testing.T, where, text string) {
		t.Helper()
		for _, s := range secrets {
			require.NotContains(t, text, s, where)
		}
	}

	catalogue := submit(t, url, "tools")
	require.Equal(t, 0, catalogue.code, catalogue.stderr)
	hidden(t, "submit tools", catalogue.stdout)
	var cat intent.Catalog
	require.NoError(t, json.Unmarshal([]byte(catalogue.stdout), &cat))
	upstreams := map[string]string{}
	for _, tl := range cat.Tools {
		upstreams[tl.Name] = tl.Upstream
	}
	require.Equal(t, self+" [2 arguments not shown]", upstreams["charge"])
	require.Equal(t, up.URL+"/mcp", upstreams["r_charge"])

	g := startGateway(t, url)
	list := g.do(t, http.MethodGet, "/v1/tools", agentA, "")
	require.Equal(t, http.StatusOK, list.status, list.raw)
	require.Contains(t, list.raw, up.URL+"/mcp")
	hidden(t, "GET /v1/tools", list.raw)

	// The upstream goes away: the call fails, and its recorded failure,
	// which the model reads, names the upstream without its secrets.
	up.CloseClientConnections()
	up.Close()
	failed := submit(t, url, "--tool", "r_charge", "--args", `{"order":"o-1"}`, "--wait", "90s")
	require.Equal(t, intent.StatusFailed, failed.res.Status, failed.stdout+failed.stderr)
	require.Contains(t, failed.res.Error.Message, up.URL+"/mcp")
	hidden(t, "the recorded failure", failed.stdout+failed.stderr)
	hidden(t, "the worker's log", w.log.String())
}

// Hole: the mcp effect followed redirects. A tools/call the configured
// upstream answers with 307 is not sent to the host the redirect names (a
// second real MCP server, which would have answered): the operation fails
// for good, and that host got nothing.
func TestMCPRedirectIsNotFollowed(t *testing.T) {
	t.Parallel()
	elsewhere := newUpstreamServer(t)
	up := newUpstreamServer(t)
	var redirected atomic.Int64
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if bytes.Contains(body, []byte(`"tools/call"`)) {
			redirected.Add(1)
			http.Redirect(w, r, elsewhere.URL+"/mcp", http.StatusTemporaryRedirect)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		up.Config.Handler.ServeHTTP(w, r)
	}))
	t.Cleanup(front.Close)
	url := jetStream(t)
	startWorker(t, "w1", url, writeTools(t, fmt.Sprintf(`tools:
  charge:
    effect: mcp
    key_args: [order]
    mcp: {url: %q, tool: charge}
`, front.URL+"/mcp")))
	s := submit(t, url, "--tool", "charge", "--args", `{"order":"o-1"}`, "--wait", "60s")
	require.Equal(t, 5, s.code, s.stdout+s.stderr)
	require.Equal(t, intent.StatusFailed, s.res.Status)
	require.Contains(t, s.res.Error.Message, "answered with a redirect, which is not followed")
	require.Equal(t, 1, s.res.Attempts)
	require.EqualValues(t, 1, redirected.Load())
	require.Zero(t, elsewhere.requests.Load(), "the host the redirect names got nothing")
	require.Zero(t, up.count("charge"))
}

// envelopeRelay is a real SMTP relay (with DSN) that records every MAIL FROM
// and RCPT TO it accepts, parameters included.
type envelopeRelay struct {
	addr string
	mu   sync.Mutex
	seen []string
}

type envelopeSession struct{ r *envelopeRelay }

func (s envelopeSession) note(line string) {
	s.r.mu.Lock()
	defer s.r.mu.Unlock()
	s.r.seen = append(s.r.seen, line)
}
func (s envelopeSession) Mail(from string, _ *gosmtp.MailOptions) error {
	s.note("MAIL " + from)
	return nil
}
func (s envelopeSession) Rcpt(to string, o *gosmtp.RcptOptions) error {
	line := "RCPT " + to
	if o != nil && len(o.Notify) > 0 {
		line += fmt.Sprintf(" NOTIFY=%v", o.Notify)
	}
	if o != nil && o.OriginalRecipient != "" {
		line += " ORCPT=" + o.OriginalRecipient
	}
	s.note(line)
	return nil
}
func (s envelopeSession) Data(rd io.Reader) error { _, err := io.Copy(io.Discard, rd); return err }
func (s envelopeSession) Reset()                  {}
func (s envelopeSession) Logout() error           { return nil }

func (r *envelopeRelay) envelope() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.seen...)
}

// Hole: SMTP envelope smuggling. A quoted local part holding "> NOTIFY=...
// ORCPT=..." would end RCPT TO's path early: the relay would mail
// evil.example while the To header shows good.example. The operation fails
// before any SMTP command; a plain address goes through as it is.
func TestEmailEnvelopeCannotBeSmuggled(t *testing.T) {
	t.Parallel()
	r := &envelopeRelay{}
	srv := gosmtp.NewServer(gosmtp.BackendFunc(func(*gosmtp.Conn) (gosmtp.Session, error) { return envelopeSession{r}, nil }))
	srv.Domain, srv.EnableDSN, srv.ErrorLog = "relay.test", true, log.New(io.Discard, "", 0)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	r.addr = l.Addr().String()
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })

	url := jetStream(t)
	startWorker(t, "w1", url, writeTools(t, fmt.Sprintf(`tools:
  send_email:
    effect: smtp
    key_args: [to, subject]
    smtp: {addr: %s, from: "Shop <shop@example.com>", starttls: "off"}
`, r.addr)))
	args, err := json.Marshal(map[string]string{"to": `"victim@evil.example> NOTIFY=SUCCESS ORCPT=rfc822;x"@good.example`, "subject": "Your invoice"})
	require.NoError(t, err)
	s := submit(t, url, "--tool", "send_email", "--args", string(args), "--wait", "60s")
	require.Equal(t, 5, s.code, s.stdout+s.stderr)
	require.Equal(t, intent.StatusFailed, s.res.Status)
	require.Contains(t, s.res.Error.Message, "cannot be sent")
	require.Empty(t, r.envelope(), "the relay got no MAIL FROM or RCPT TO")

	ok := submit(t, url, "--tool", "send_email", "--args", `{"to":"Ann <ann.lee+billing@good.example>","subject":"Your invoice"}`, "--wait", "60s")
	require.Equal(t, 0, ok.code, ok.stdout+ok.stderr)
	require.Equal(t, []string{"MAIL shop@example.com", "RCPT ann.lee+billing@good.example"}, r.envelope())
}

// Hole: a line break in session or call_id made an operation that never
// settled (the webhook sets both as headers; the HTTP client refused the
// request, and the refusal was retried). Every front door refuses a control
// character there at once, invalid_intent, and nothing is sent.
func TestControlCharactersInSessionAndCallID(t *testing.T) {
	t.Parallel()
	url := jetStream(t)
	hook := newSink(t, nil)
	tools := writeTools(t, fmt.Sprintf(`tools:
  echo:
    effect: webhook
    key_args: [n]
    webhook: {url: %s, timeout: 5s, retry: {max_attempts: 2, initial_interval: 10ms, max_interval: 10ms}}
`, hook.URL))
	// A worker that would give up quickly: on a refusal classified as
	// transient, the answer would be "failed", not "rejected".
	startWorker(t, "w1", url, tools, "--max-deliver", "2", "--retry-delay", "100ms", "--max-retry-delay", "100ms")

	// NATS: intents published by hand, as any agent may.
	nc := connect(t, url)
	for _, env := range []string{
		`{"tool":"echo","args":{"n":1},"session":"run-7\r\nX-Evil: 1"}`,
		`{"tool":"echo","args":{"n":2},"call_id":"call_1\n"}`,
		`{"tool":"echo","args":{"n":3},"session":"run\u0000"}`,
	} {
		res := publishRaw(t, nc, "idem.intents.echo", []byte(env))(60 * time.Second)
		require.Equal(t, intent.StatusRejected, res.Status, env)
		require.Equal(t, intent.CodeInvalidIntent, res.Error.Code, env)
		require.Contains(t, res.Error.Message, "control character", env)
	}

	// HTTP: the session and call id come from headers (a tab is all an HTTP
	// client will send).
	g := startGateway(t, url)
	requireProblem(t, g.call(t, agentA, "echo", `{"n":4}`, "Idem-Session", "run\t7"), http.StatusBadRequest, intent.CodeInvalidIntent)
	requireProblem(t, g.call(t, agentA, "echo", `{"n":5}`, "Idem-Call-Id", "call\t5"), http.StatusBadRequest, intent.CodeInvalidIntent)

	// MCP: the session comes from the call's _meta.
	cs := stdioSession(t, url, []string{"--wait", "20s"})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{"n": 6}, Meta: mcp.Meta{"io.idemgate/session": "run-7\nX-Evil: 1"}})
	require.NoError(t, err)
	require.True(t, res.IsError, mcpText(res))
	require.Contains(t, mcpText(res), "control character")
	require.Contains(t, mcpText(res), "Nothing was done")

	require.Zero(t, hook.count(), "nothing was sent")
	ok := submit(t, url, "--tool", "echo", "--args", `{"n":7}`, "--session", "run 7", "--wait", "30s")
	require.Equal(t, 0, ok.code, "a printable session is fine: %s %s", ok.stdout, ok.stderr)
}

// Hole: an upstream's readOnlyHint made its tool a read, with no ledger,
// and the upstream decides its hints at every listing. The tools file
// decides: peek, which the upstream calls read-only, is unsafe and goes
// through the ledger (a repeat is answered from it) unless the file says
// class: read.
func TestUpstreamReadOnlyHintDoesNotSkipTheLedger(t *testing.T) {
	t.Parallel()
	up := newUpstreamServer(t)
	url := jetStream(t)
	startWorker(t, "w1", url, writeTools(t, fmt.Sprintf(`mcp_upstreams:
  up:
    url: %[1]s
    tools:
      charge: {key_args: [order]}
  pinned:
    url: %[1]s
    prefix: p_
    tools:
      charge: {key_args: [order]}
      peek: {class: read}
`, up.URL+"/mcp")))
	cat := submit(t, url, "tools")
	require.Equal(t, 0, cat.code, cat.stderr)
	var c intent.Catalog
	require.NoError(t, json.Unmarshal([]byte(cat.stdout), &c))
	classes := map[string]string{}
	for _, tl := range c.Tools {
		classes[tl.Name] = string(tl.Class)
	}
	require.Equal(t, "unsafe", classes["peek"])
	require.Equal(t, "read", classes["p_peek"])

	for i := range 2 {
		s := submit(t, url, "--tool", "peek", "--args", `{"id":"a-1"}`, "--wait", "30s")
		require.Equal(t, []int{0, 3}[i], s.code, "call %d: %s %s", i, s.stdout, s.stderr)
	}
	require.Equal(t, 1, up.count("peek"), "the repeat was answered from the ledger")
	for range 2 {
		s := submit(t, url, "--tool", "p_peek", "--args", `{"id":"a-1"}`, "--wait", "30s")
		require.Equal(t, 0, s.code, s.stdout+s.stderr)
	}
	require.Equal(t, 3, up.count("peek"), "a read the file declares fires every time")
}
