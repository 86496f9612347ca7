package console

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/idemgate/idemgate/internal/auth"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/idemgate/idemgate/internal/natstest"
	"github.com/idemgate/idemgate/pkg/audit"
	"github.com/idemgate/idemgate/pkg/client"
	"github.com/idemgate/idemgate/pkg/dedup"
	"github.com/idemgate/idemgate/pkg/intent"
)

// consoleServer is a console on a JetStream with no workers: enough for
// its login, sessions and protections.
func consoleServer(t *testing.T) (*httptest.Server, map[string]string) {
	t.Helper()
	nc := natstest.Connect(t, natstest.RunServer(t).ClientURL())
	cl, err := client.New(nc)
	require.NoError(t, err)
	secrets, lines := map[string]string{}, []string{}
	for _, tk := range []struct{ role, ns, name string }{{auth.RoleOperator, "*", "ops"}, {auth.RoleAgent, "team-a", "agent"}} {
		secret, line, err := auth.NewToken(tk.role, tk.ns, tk.name)
		require.NoError(t, err)
		secrets[tk.name] = secret
		lines = append(lines, line)
	}
	toks, err := auth.ParseTokens(strings.NewReader(strings.Join(lines, "\n")))
	require.NoError(t, err)
	return served(t, cl, toks), secrets
}

// newMounted is a console on cl for toks, mounted on a mux of its own as
// the front door mounts it, with a limiter that admits every request.
func newMounted(t *testing.T, cl *client.Client, toks *auth.Tokens) (*Console, http.Handler) {
	t.Helper()
	admitAll := LimiterFunc(func(*auth.Token) (func(), time.Duration, string) { return func() {}, 0, "" })
	c, err := New(cl, nil, Config{Tokens: toks, Limiter: admitAll})
	require.NoError(t, err)
	mux := http.NewServeMux()
	c.Mount(mux)
	return c, mux
}

// mounted is newMounted's handler; the test's end shuts the console down.
func mounted(t *testing.T, cl *client.Client, toks *auth.Tokens) http.Handler {
	t.Helper()
	c, h := newMounted(t, cl, toks)
	t.Cleanup(c.shutdown)
	return h
}

// served is newMounted's handler on a test server; the test's end shuts
// the console down (ending its live pages), then the server.
func served(t *testing.T, cl *client.Client, toks *auth.Tokens) *httptest.Server {
	t.Helper()
	c, h := newMounted(t, cl, toks)
	ts := httptest.NewServer(h)
	t.Cleanup(ts.Close)
	t.Cleanup(c.shutdown)
	return ts
}

// newJar is an empty cookie jar.
func newJar(t *testing.T) http.CookieJar {
	t.Helper()
	jar, err := cookiejar.New(nil)
	require.NoError(t, err)
	return jar
}

// noRedirect is a client that shows redirects instead of following them.
func noRedirect(jar http.CookieJar) *http.Client {
	return &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

var csrfField = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// The console admits operators only, keeps them by an HttpOnly,
// SameSite=Strict session cookie, sends a strict CSP with every page,
// carries no inline script or style, and refuses a POST without the
// session's CSRF token or from another origin.
func TestConsoleSessionAndProtections(t *testing.T) {
	t.Parallel()
	ts, secrets := consoleServer(t)
	jar := newJar(t)
	c := noRedirect(jar)
	post := func(path string, form url.Values, header ...string) *http.Response {
		req, err := http.NewRequest(http.MethodPost, ts.URL+path, strings.NewReader(form.Encode()))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		for i := 0; i+1 < len(header); i += 2 {
			req.Header.Set(header[i], header[i+1])
		}
		resp, err := c.Do(req)
		require.NoError(t, err)
		t.Cleanup(func() { _ = resp.Body.Close() })
		return resp
	}
	get := func(path string) (*http.Response, string) {
		resp, err := c.Get(ts.URL + path)
		require.NoError(t, err)
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp, string(body)
	}

	resp, _ := get("/console/")
	require.Equal(t, http.StatusSeeOther, resp.StatusCode, "no session: to the login page")
	require.Equal(t, "/console/login?next=%2Fconsole%2F", resp.Header.Get("Location"))

	resp, page := get("/console/login")
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, contentSecurityPolicy, resp.Header.Get("Content-Security-Policy"))
	require.Equal(t, "DENY", resp.Header.Get("X-Frame-Options"))
	require.Equal(t, "no-store", resp.Header.Get("Cache-Control"))
	requireNoInline(t, page)

	resp = post("/console/login", url.Values{"token": {secrets["agent"]}})
	require.Equal(t, http.StatusForbidden, resp.StatusCode, "an agent's token does not log in")
	require.Empty(t, resp.Cookies())
	resp = post("/console/login", url.Values{"token": {"idg_not-a-token"}})
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode)
	require.Empty(t, resp.Cookies())

	resp = post("/console/login", url.Values{"token": {secrets["ops"]}, "next": {"//elsewhere.example/console/"}})
	require.Equal(t, http.StatusSeeOther, resp.StatusCode)
	require.Equal(t, "/console/", resp.Header.Get("Location"), "a login never sends the browser elsewhere")
	require.Len(t, resp.Cookies(), 1)
	ck := resp.Cookies()[0]
	require.True(t, ck.HttpOnly)
	require.Equal(t, http.SameSiteStrictMode, ck.SameSite)
	require.Equal(t, "/console/", ck.Path)
	require.NotContains(t, ck.Value, secrets["ops"], "the cookie names a session, not the token")

	resp, page = get("/console/search")
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Contains(t, page, "ops · namespace")
	requireNoInline(t, page)
	m := csrfField.FindStringSubmatch(page)
	require.NotNil(t, m, "the page's forms carry the CSRF token")
	csrf := m[1]

	resp = post("/console/logout", url.Values{})
	require.Equal(t, http.StatusForbidden, resp.StatusCode, "a POST without the CSRF token is refused")
	resp = post("/console/logout", url.Values{"csrf": {"forged"}})
	require.Equal(t, http.StatusForbidden, resp.StatusCode, "and with another one")
	resp = post("/console/logout", url.Values{"csrf": {csrf}}, "Sec-Fetch-Site", "cross-site")
	require.Equal(t, http.StatusForbidden, resp.StatusCode, "a cross-site POST is refused, token or not")
	resp = post("/console/logout", url.Values{"csrf": {csrf}}, "Origin", "https://elsewhere.example")
	require.Equal(t, http.StatusForbidden, resp.StatusCode, "and one from another origin")

	resp = post("/console/logout", url.Values{"csrf": {csrf}}, "Sec-Fetch-Site", "same-origin")
	require.Equal(t, http.StatusSeeOther, resp.StatusCode)
	resp, _ = get("/console/search")
	require.Equal(t, http.StatusSeeOther, resp.StatusCode, "the session ended")

	// The live stream and the fragments need a session too.
	resp, _ = get("/console/events")
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode)
}

// requireNoInline checks a page for inline script and style, which the CSP
// would refuse.
func requireNoInline(t *testing.T, page string) {
	t.Helper()
	for _, m := range regexp.MustCompile(`<script[^>]*>`).FindAllString(page, -1) {
		require.Contains(t, m, ` src="`, "inline script: %s", m)
	}
	require.NotContains(t, page, "<style")
	require.NotRegexp(t, `\sstyle=`, page)
	require.NotRegexp(t, `\son[a-z]+=`, page, "an inline event handler")
}

// fakeWatch is a ledger watch the test feeds.
type fakeWatch struct{ ch chan dedup.Change }

func (f *fakeWatch) WatchRecords(ctx context.Context) (<-chan dedup.Change, error) { return f.ch, nil }

// events drains the messages queued for sub.
func events(sub *subscriber) []string {
	var out []string
	for {
		select {
		case m := <-sub.ch:
			out = append(out, string(m))
		default:
			return out
		}
	}
}

// The hub sends each page only what its operator's namespace reaches: a
// record of another namespace never, a deletion whose session it knows by
// that session, one it does not know only to operators of every namespace
// and to a page that follows that key and was shown its record; a page that subscribes at the
// position it was drawn at gets the changes since; and the counts are per
// namespace.
func TestHubNamespaces(t *testing.T) {
	t.Parallel()
	w := &fakeWatch{ch: make(chan dedup.Change)}
	h := newHub(w, zap.NewNop())
	t.Cleanup(h.close)
	since := h.ensure(context.Background())
	require.NotEmpty(t, since)
	all := &auth.Token{Name: "ops", Role: auth.RoleOperator, Namespace: auth.AllNamespaces}
	teamA := &auth.Token{Name: "ops-a", Role: auth.RoleOperator, Namespace: "team-a"}
	subAll, subA := h.subscribe(all, "", false, since), h.subscribe(teamA, "", false, since)
	subKey := h.subscribe(teamA, "refund.gone", true, since)
	subOther := h.subscribe(teamA, "refund.gone", false, since) // a key it was not shown
	events(subOther)
	require.Contains(t, strings.Join(events(subA), ""), `"resync":false`, "drawn at the hub's position: nothing to read again")
	events(subAll)
	events(subKey)

	put := func(key string, rev uint64, status intent.Status, session string) {
		w.ch <- dedup.Change{Key: key, Revision: rev, Record: dedup.Record{Status: status, Session: session, Tool: "refund"}}
	}
	put("refund.a", 1, intent.StatusAwaitingApproval, "team-a/run-1")
	put("refund.b", 2, intent.StatusAwaitingApproval, "team-b")
	w.ch <- dedup.Change{Key: "refund.b", Revision: 3, Deleted: true} // open, so its session is known
	w.ch <- dedup.Change{Key: "refund.gone", Revision: 4, Deleted: true}
	w.ch <- dedup.Change{Key: "_scan", Revision: 1, Deleted: true} // a worker's own key, not an operation's
	put("refund.sync", 5, intent.StatusCompleted, "team-a")
	// The watch channel is unbuffered and the hub applies changes in order:
	// once it took a sixth, the first five are applied.
	put("refund.barrier", 6, intent.StatusCompleted, "team-c")

	a := strings.Join(events(subA), "")
	require.Contains(t, a, "refund.a")
	require.NotContains(t, a, "refund.b", "another namespace's record and deletion")
	require.NotContains(t, a, "refund.gone", "a deletion of a session the hub does not know")
	require.Contains(t, a, "refund.sync")
	k := strings.Join(events(subKey), "")
	require.Contains(t, k, "refund.gone", "a page that follows the key hears of its deletion")
	require.NotContains(t, k, "refund.a")
	require.Empty(t, events(subOther), "a page that follows a key of another namespace hears nothing of it")

	everything := strings.Join(events(subAll), "")
	require.Contains(t, everything, "refund.b")
	require.NotContains(t, everything, "_scan")

	// A page drawn at since subscribes late: it gets what changed since,
	// filtered the same way.
	late := strings.Join(events(h.subscribe(teamA, "", false, since)), "")
	require.Contains(t, late, `"resync":false`)
	require.Contains(t, late, "refund.a")
	require.NotContains(t, late, "refund.b")
	stale := strings.Join(events(h.subscribe(teamA, "", false, "another-epoch:0")), "")
	require.Contains(t, stale, `"resync":true`, "a position of another watch: read everything again")

	// Counts, once a complete read seeded the view, are per namespace.
	h.seed(since, []dedup.Listed{{Key: "refund.old", Revision: 1, Record: dedup.Record{Status: intent.StatusUncertain, Session: "team-a"}}}, true)
	h.mu.Lock()
	ca, cAll := h.countsLocked(teamA), h.countsLocked(all)
	h.mu.Unlock()
	require.Equal(t, 1, ca[intent.StatusAwaitingApproval])
	require.Equal(t, 1, ca[intent.StatusUncertain])
	require.Equal(t, 1, cAll[intent.StatusAwaitingApproval], "refund.b was deleted")

	var counts map[string]int
	c := strings.TrimPrefix(strings.TrimSpace(string(sseMessage("counts", ca))), "event: counts\ndata: ")
	require.NoError(t, json.Unmarshal([]byte(c), &counts))
	require.Equal(t, 1, counts["uncertain"])
}

// fakeTrail is a ledger watch and an audit watch the test feeds.
type fakeTrail struct {
	fakeWatch
	trail chan audit.Event
}

func (f *fakeTrail) WatchAudit(ctx context.Context) (<-chan audit.Event, error) { return f.trail, nil }

// A record page hears that its operation's history grew — by the full key
// or the compact one the ledger lists — and no other page does: not the
// queue, not a page of another operation, not another namespace's.
func TestHubHistory(t *testing.T) {
	t.Parallel()
	w := &fakeTrail{fakeWatch: fakeWatch{ch: make(chan dedup.Change)}, trail: make(chan audit.Event)}
	h := newHub(w, zap.NewNop())
	t.Cleanup(h.close)
	since := h.ensure(context.Background())
	teamA := &auth.Token{Name: "ops-a", Role: auth.RoleOperator, Namespace: "team-a"}
	teamB := &auth.Token{Name: "ops-b", Role: auth.RoleOperator, Namespace: "team-b"}
	full := "refund." + strings.Repeat("ab", 32)
	compact, err := intent.LedgerKey(full, intent.LayoutCompact)
	require.NoError(t, err)
	require.NotEqual(t, full, compact)
	byFull, byCompact := h.subscribe(teamA, full, true, since), h.subscribe(teamA, compact, true, since)
	queue, other := h.subscribe(teamA, "", false, since), h.subscribe(teamA, "refund.other", true, since)
	stranger := h.subscribe(teamB, compact, false, since)
	for _, sub := range []*subscriber{byFull, byCompact, queue, other, stranger} {
		events(sub)
	}

	w.trail <- audit.Event{Kind: audit.KindClaimed, Key: full, Session: "team-a/run-1"}
	w.trail <- audit.Event{Kind: audit.KindFired, Key: full} // names no session
	w.trail <- audit.Event{Kind: audit.KindDecision, Key: compact, By: "ops-a"}
	w.trail <- audit.Event{Kind: audit.KindGap, Dropped: 2}
	// The hub applies in order: once it took this one, the others are applied.
	w.ch <- dedup.Change{Key: "refund.barrier", Revision: 1, Record: dedup.Record{Status: intent.StatusCompleted, Session: "team-c"}}

	for _, sub := range []*subscriber{byFull, byCompact} {
		got := strings.Join(events(sub), "")
		require.Equal(t, 3, strings.Count(got, "event: history\n"), got)
		require.Contains(t, got, `"kind":"decision"`)
	}
	for name, sub := range map[string]*subscriber{"the queue": queue, "another operation's page": other, "another namespace's operator": stranger} {
		require.NotContains(t, strings.Join(events(sub), ""), "event: history", name)
	}

	// A page drawn before the events subscribes after them: it hears of them.
	late := strings.Join(events(h.subscribe(teamA, full, true, since)), "")
	require.Equal(t, 3, strings.Count(late, "event: history\n"), late)
}

func TestSafeNext(t *testing.T) {
	t.Parallel()
	for next, want := range map[string]string{
		"/console/op/refund.x":      "/console/op/refund.x",
		"/console/search?tool=a":    "/console/search?tool=a",
		"":                          "/console/",
		"/v1/operations":            "/console/",
		"//evil.example/console/":   "/console/",
		"https://evil.example/":     "/console/",
		"/console//evil.example":    "/console/",
		"/console/\\evil":           "/console/",
		"/console/\r\nSet-Cookie:x": "/console/",
	} {
		require.Equal(t, want, safeNext(next), next)
	}
}
