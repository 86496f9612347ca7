package integration

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/pkg/intent"
)

// The front door answers as docs/http.md and its OpenAPI document say:
// malformed headers are invalid_request; args that break the tool's schema
// are refused before publishing; a worker's rejection carries no Location
// (there is no record to find there); a wait preference it cannot
// read is ignored (RFC 7240); headers over 16 KiB get a 431 problem; a 405
// names what is allowed; approving an operation that never awaited approval
// is 409 wrong_state; the advice of a 409 in_flight works when followed.
func TestHTTPAnswersAsDocumented(t *testing.T) {
	t.Parallel()
	url := jetStream(t)
	sink, release := httpSink(t)
	startWorker(t, "w1", url, writeTools(t, fmt.Sprintf(`tools:
  echo:
    effect: noop
    key_args: [n]
  strict_form:
    effect: noop
    key_args: [to]
    schema:
      type: object
      properties:
        to: {type: string}
  once:
    effect: noop
    key_args: [n]
    budget: {per: session, max: 1, window: 168h}
  slow_job:
    effect: webhook
    key_args: [n]
    webhook: {url: "%s/slow", timeout: 60s}
`, sink.URL)))
	g := startGateway(t, url)

	// Malformed headers: invalid_request, whatever the tool.
	for _, h := range [][]string{
		{"Idempotency-Key", `"order-1`},
		{"Idempotency-Key", `""`},
		{"Idempotency-Key", `"a\b"`},
		{"Idempotency-Key", `"` + strings.Repeat("k", intent.MaxKeyBytes+1) + `"`},
		{"Idempotency-Key", "a", "Idempotency-Key", "b"},
		{"Idem-Session", "a", "Idem-Session", "b"},
		{"Idem-Session", strings.Repeat("s", 257)},
		{"Idem-Session", "run-\xff"},
		{"Idem-Call-Id", "call-\xff"},
	} {
		requireProblem(t, g.call(t, agentA, "echo", `{"n":1}`, h...), http.StatusBadRequest, "invalid_request")
	}
	requireProblem(t, g.call(t, agentA, "echo", `{"n":`), http.StatusBadRequest, intent.CodeInvalidIntent) // the body is the intent's

	// Args that break the tool's schema: refused by the gateway as the
	// workers would refuse them, before publishing: no answer, no Location,
	// no record.
	refused := g.call(t, agentA, "strict_form", `{"to":5}`)
	requireProblem(t, refused, http.StatusBadRequest, intent.CodeInvalidIntent)
	require.Contains(t, refused.str("detail"), "args do not match tool strict_form's schema", refused.raw)
	require.NotContains(t, refused.body, "answer", "not published: %s", refused.raw)
	require.Empty(t, refused.header.Get("Location"), refused.raw)
	id, err := intent.Derive(&intent.Envelope{Tool: "strict_form", Args: json.RawMessage(`{"to":5}`), Session: "team-a"},
		intent.KeySpec{KeyArgs: []string{"to"}}, time.Now())
	require.NoError(t, err)
	requireProblem(t, g.do(t, http.MethodGet, "/v1/operations/"+id.Key, agentA, ""), http.StatusNotFound, intent.CodeNotFound)

	// A worker's rejection (a new operation over the tool's budget): no
	// Location, since no record is kept.
	require.Equal(t, http.StatusOK, g.call(t, agentA, "once", `{"n":1}`).status)
	rejected := g.call(t, agentA, "once", `{"n":2}`)
	requireProblem(t, rejected, http.StatusTooManyRequests, intent.CodeBudgetExceeded)
	require.Equal(t, intent.StatusRejected, rejected.answer(t).Status, "answered by a worker: %s", rejected.raw)
	require.Empty(t, rejected.header.Get("Location"), rejected.raw)
	good, err := intent.Derive(&intent.Envelope{Tool: "strict_form", Args: json.RawMessage(`{"to":"x"}`), Session: "team-a"},
		intent.KeySpec{KeyArgs: []string{"to"}}, time.Now())
	require.NoError(t, err)
	require.Equal(t, good.Key, g.call(t, agentA, "strict_form", `{"to":"x"}`).str("key"), "the key derived here is the gateway's")

	// A wait preference that is not a number of seconds is ignored.
	for _, prefer := range []string{"wait=abc", "wait=-1", "wait=soon, wait=5"} {
		r := g.call(t, agentA, "echo", `{"n":2}`, "Prefer", prefer)
		require.Equal(t, http.StatusOK, r.status, "%s: %s", prefer, r.raw)
		require.Empty(t, r.header.Get("Preference-Applied"), prefer)
	}
	done := g.call(t, agentA, "echo", `{"n":3}`, "Prefer", "wait=7")
	require.Equal(t, http.StatusOK, done.status, done.raw)
	require.Equal(t, "wait=7", done.header.Get("Preference-Applied"))
	require.Equal(t, "/v1/operations/"+done.str("key"), done.header.Get("Location"))

	// Headers over the documented 16 KiB: a 431 problem (not plain text).
	big := g.do(t, http.MethodGet, "/v1/tools", agentA, "", "X-Big", strings.Repeat("y", 20000))
	requireProblem(t, big, http.StatusRequestHeaderFieldsTooLarge, "headers_too_large")
	small := g.do(t, http.MethodGet, "/v1/tools", agentA, "", "X-Big", strings.Repeat("y", 15000))
	require.Equal(t, http.StatusOK, small.status, "under the limit")

	// 405 with Allow.
	for path, allow := range map[string]string{
		"/v1/tools/echo":            "POST",
		"/v1/operations/echo.x":     "GET, DELETE, HEAD",
		"/healthz":                  "GET, HEAD",
		"/v1/openapi.json":          "GET, HEAD",
		"/v1/operations":            "GET, HEAD",
		"/v1/dead-letters/1/replay": "POST",
	} {
		method := http.MethodPut
		r := g.do(t, method, path, agentA, "")
		requireProblem(t, r, http.StatusMethodNotAllowed, "method_not_allowed")
		require.Equal(t, allow, r.header.Get("Allow"), path)
	}

	// Approving an operation that never awaited approval: 409 wrong_state,
	// by its key and by its ledger key.
	stored := ledgerKey(t, done.str("key"))
	for _, key := range []string{done.str("key"), stored} {
		requireProblem(t, g.do(t, http.MethodPost, "/v1/operations/"+key+"/approve", operator, ""), http.StatusConflict, intent.CodeWrongState)
	}
	again := g.call(t, agentA, "echo", `{"n":3}`)
	require.Equal(t, "true", again.header.Get(httpReplayed), "still the one operation: %s", again.raw)

	// In flight: the advice is to GET the Location with a wait, which
	// answers the record once final.
	inflight := g.call(t, agentA, "slow_job", `{"n":1}`, "Prefer", "wait=1")
	requireProblem(t, inflight, http.StatusConflict, "in_flight")
	require.Contains(t, inflight.str("detail"), "?wait=")
	require.Equal(t, map[string]any{"code": "pending", "text": "Still running: operation " + inflight.str("key") +
		" has not finished yet and goes on. Do not call the tool again; check it later with GET /v1/operations/" + inflight.str("key") +
		" (with ?wait=30 it waits up to 30 s for the final outcome)."}, inflight.body["hint"], "the hint of an operation in flight")
	release()
	final := g.do(t, http.MethodGet, inflight.header.Get("Location")+"?wait=60", agentA, "")
	require.Equal(t, http.StatusOK, final.status, final.raw)
	require.Equal(t, "completed", final.str("status"))
}

// The OpenAPI document holds what a strict validator asks: every operation
// lists the 405 and 431 the server can answer, and info.license, when there
// is one, names a url or an SPDX identifier.
func TestOpenAPIListsEveryAnswer(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile(openAPIFile)
	require.NoError(t, err)
	var doc struct {
		Info struct {
			License *struct {
				Name       string `json:"name"`
				URL        string `json:"url"`
				Identifier string `json:"identifier"`
			} `json:"license"`
		} `json:"info"`
		Paths map[string]map[string]struct {
			Responses map[string]any `json:"responses"`
		} `json:"paths"`
	}
	require.NoError(t, json.Unmarshal(data, &doc))
	if l := doc.Info.License; l != nil {
		require.NotEmpty(t, l.Name)
		require.True(t, (l.URL == "") != (l.Identifier == ""), "info.license needs a url or an identifier, not both")
	}
	for path, item := range doc.Paths {
		for method, op := range item {
			for _, status := range []string{"405", "431"} {
				require.Contains(t, op.Responses, status, "%s %s", method, path)
			}
		}
	}
}

// Every answer to a tool call carries the hint a model reads: a first run,
// its replay and a conflict, each with its code and a text that says what
// happened; the conflict's never invites other arguments.
func TestHTTPAnswersCarryTheHint(t *testing.T) {
	t.Parallel()
	url := jetStream(t)
	startWorker(t, "w1", url, writeTools(t, `tools:
  pick:
    effect: noop
    key_args: [n]
`))
	g := startGateway(t, url)
	hintOf := func(r response) (code, text string) {
		t.Helper()
		h, ok := r.body["hint"].(map[string]any)
		require.True(t, ok, "a hint: %s", r.raw)
		code, _ = h["code"].(string)
		text, _ = h["text"].(string)
		return code, text
	}
	first := g.call(t, agentA, "pick", `{"n":1,"colour":"red"}`)
	require.Equal(t, http.StatusOK, first.status, first.raw)
	code, text := hintOf(first)
	require.Equal(t, "completed", code)
	require.Contains(t, text, "Completed: operation "+first.str("key"))

	again := g.call(t, agentA, "pick", `{"n":1,"colour":"red"}`)
	code, text = hintOf(again)
	require.Equal(t, "replayed", code, again.raw)
	require.Contains(t, text, "Already done, not repeated")

	conflict := g.call(t, agentA, "pick", `{"n":1,"colour":"blue"}`)
	requireProblem(t, conflict, http.StatusUnprocessableEntity, intent.CodeConflict)
	code, text = hintOf(conflict)
	require.Equal(t, "conflict", code)
	require.Contains(t, text, "Do not change the arguments to get around this")
	require.Contains(t, text, "GET /v1/operations/"+first.str("key"))
	require.NotContains(t, text, "must differ")
}
