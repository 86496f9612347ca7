package integration

import (
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Hole 4 of the trust issue: a key outside the caller's namespace answers
// exactly as a key with no record does — status, body, headers and time —
// on every {key} route, and a wait for it lasts the wait asked, as for a
// missing key (a waiting GET must not tell another namespace's operation,
// finished or in flight, by answering early).
func TestHTTPOtherNamespacesKeysAreNotFound(t *testing.T) {
	t.Parallel()
	e := newHTTPEnv(t)
	g := e.gw
	done := g.call(t, agentB, "echo", `{"n":42}`)
	require.Equal(t, http.StatusOK, done.status, done.raw)
	inflight := g.call(t, agentB, "slow_job", `{"n":42}`, "Prefer", "wait=1")
	require.Equal(t, http.StatusConflict, inflight.status, inflight.raw)
	theirs := map[string]string{"completed": done.str("key"), "in flight": inflight.str("key")}
	// A key of the same shape that names nothing (its digest's first
	// digits changed: a compact ledger stores the first 32).
	missing := func(key string) string { return key[:len(key)-64] + "00000000" + key[len(key)-56:] }

	// compare checks that r (for key) and m (for the missing key) are the
	// same answer: status, headers but Date, and body but the key.
	compare := func(what string, r, m response, key, none string) {
		t.Helper()
		require.Equal(t, http.StatusNotFound, r.status, "%s: %s", what, r.raw)
		require.Equal(t, m.status, r.status, what)
		// (The detail may clip the key: replace the part that differs.)
		require.Equal(t, m.raw, strings.ReplaceAll(r.raw, key[:len(key)-56], none[:len(none)-56]), what)
		rh, mh := r.header.Clone(), m.header.Clone()
		rh.Del("Date")
		mh.Del("Date")
		require.Equal(t, mh, rh, what)
	}
	const wait = 2 * time.Second
	for state, key := range theirs {
		none := missing(key)
		// Without a wait.
		for _, c := range []struct{ method, path, token string }{
			{http.MethodGet, "/v1/operations/%s", agentA},
			{http.MethodGet, "/v1/operations/%s", operatorA},
			{http.MethodDelete, "/v1/operations/%s", operatorA},
			{http.MethodDelete, "/v1/operations/%s?force=true", operatorA},
			{http.MethodPost, "/v1/operations/%s/approve", operatorA},
			{http.MethodPost, "/v1/operations/%s/deny", operatorA},
			{http.MethodPost, "/v1/operations/%s/resolve", operatorA},
		} {
			what := state + ": " + c.method + " " + c.path + " as " + c.token
			body := ""
			if strings.HasSuffix(c.path, "/resolve") {
				body = `{"outcome":"succeeded"}`
			}
			r := g.do(t, c.method, strings.Replace(c.path, "%s", key, 1), c.token, body)
			m := g.do(t, c.method, strings.Replace(c.path, "%s", none, 1), c.token, body)
			compare(what, r, m, key, none)
		}
		// With a wait: both last the wait asked, at once.
		var wg sync.WaitGroup
		var r, m response
		var rTook, mTook time.Duration
		for _, q := range []struct {
			key  string
			out  *response
			took *time.Duration
		}{{key, &r, &rTook}, {none, &m, &mTook}} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				start := time.Now()
				*q.out = g.do(t, http.MethodGet, "/v1/operations/"+q.key+"?wait=2", agentA, "")
				*q.took = time.Since(start)
			}()
		}
		wg.Wait()
		compare(state+": GET ?wait=2", r, m, key, none)
		require.GreaterOrEqual(t, mTook, wait, "a missing key is waited for")
		require.GreaterOrEqual(t, rTook, wait, "%s: another namespace's key is waited for as long", state)
	}
	e.release()
}
