package httpapi

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/internal/auth"
	"github.com/idemgate/idemgate/internal/natstest"
	"github.com/idemgate/idemgate/pkg/audit"
	"github.com/idemgate/idemgate/pkg/client"
	"github.com/idemgate/idemgate/pkg/dedup"
	"github.com/idemgate/idemgate/pkg/intent"
)

// boundsServer is a front door on a JetStream with no workers, with an
// operator token per name of ns (name: namespace), and no rate limit that
// a flood would meet before the console's own bounds.
func boundsServer(t *testing.T, ns map[string]string) (*Server, map[string]string) {
	t.Helper()
	nc := natstest.Connect(t, natstest.RunServer(t).ClientURL())
	cl, err := client.New(nc)
	require.NoError(t, err)
	secrets, lines := map[string]string{}, []string{}
	for name, namespace := range ns {
		secret, line, err := auth.NewToken(auth.RoleOperator, namespace, name)
		require.NoError(t, err)
		secrets[name] = secret
		lines = append(lines, line)
	}
	toks, err := auth.ParseTokens(strings.NewReader(strings.Join(lines, "\n")))
	require.NoError(t, err)
	s, err := New(nc, cl, nil, Config{Tokens: toks, Rate: 1e9, Burst: 1 << 30})
	require.NoError(t, err)
	t.Cleanup(s.console.shutdown)
	return s, secrets
}

// serve runs one request through h and returns its answer.
func serve(h http.Handler, method, target, body, cookie string) *http.Response {
	req := httptest.NewRequest(method, target, strings.NewReader(body))
	if body != "" {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	if cookie != "" {
		req.AddCookie(&http.Cookie{Name: consoleCookie, Value: cookie})
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	return w.Result()
}

// loginCookie logs token in through h and returns the session cookie.
func loginCookie(t *testing.T, h http.Handler, token string) string {
	t.Helper()
	resp := serve(h, http.MethodPost, "/console/login", url.Values{"token": {token}}.Encode(), "")
	require.Equal(t, http.StatusSeeOther, resp.StatusCode)
	for _, c := range resp.Cookies() {
		if c.Name == consoleCookie {
			return c.Value
		}
	}
	t.Fatal("no session cookie")
	return ""
}

// loggedIn reports whether the session cookie names opens the queue.
func loggedIn(t *testing.T, h http.Handler, cookie string) bool {
	t.Helper()
	resp := serve(h, http.MethodGet, "/console/search", "", cookie)
	return resp.StatusCode == http.StatusOK
}

// Ten thousand logins by team-a's operator (the console's whole session
// cap) leave team-b's operator logged in: a token's logins end only its own
// oldest sessions.
func TestConsoleLoginsCannotEvictAnotherTenant(t *testing.T) {
	t.Parallel()
	s, secrets := boundsServer(t, map[string]string{"ops-a": "team-a", "ops-b": "team-b"})
	h := s.Handler()
	b := loginCookie(t, h, secrets["ops-b"])
	first := loginCookie(t, h, secrets["ops-a"])
	var last string
	for range maxSessions {
		last = loginCookie(t, h, secrets["ops-a"])
	}
	require.True(t, loggedIn(t, h, b), "team-a's logins logged team-b's operator out")
	require.True(t, loggedIn(t, h, last), "the latest login works")
	require.False(t, loggedIn(t, h, first), "team-a's oldest session made room for its newest")
}

// A flood of wrong tokens from one address is slowed (refused unchecked,
// with a Retry-After of about a second), while an operator at another
// address logs in at once; once the flood stops, its own address logs in
// again within the Retry-After it was given.
func TestConsoleFailedLoginsSlowedPerAddress(t *testing.T) {
	t.Parallel()
	s, secrets := boundsServer(t, map[string]string{"ops": "*"})
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)
	from := func(ip string) *http.Client {
		d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
		return &http.Client{Transport: &http.Transport{DialContext: d.DialContext},
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	}
	attacker, operator := from("127.0.0.2"), from("127.0.0.1")
	login := func(c *http.Client, token string) *http.Response {
		resp, err := c.PostForm(srv.URL+"/console/login", url.Values{"token": {token}})
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		require.NoError(t, resp.Body.Close())
		return resp
	}

	// The first failures are answered at once; then the address waits.
	tries := 0
	for {
		tries++
		resp := login(attacker, fmt.Sprintf("idg_guess-%d", tries))
		if resp.StatusCode == http.StatusTooManyRequests {
			wait, err := strconv.Atoi(resp.Header.Get("Retry-After"))
			require.NoError(t, err, "a refusal says when to retry")
			require.LessOrEqual(t, wait, 2, "a failed login is slowed, not locked out for long")
			break
		}
		require.Equal(t, http.StatusUnauthorized, resp.StatusCode)
		require.LessOrEqual(t, tries, loginFailBurst, "wrong tokens from one address were never slowed")
	}
	require.Equal(t, http.StatusTooManyRequests, login(attacker, secrets["ops"]).StatusCode,
		"while its address floods, a login there is refused unchecked: a guess is not even tried")

	// The flood goes on while the operator at another address logs in.
	ctx, stop := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	defer func() { stop(); wg.Wait() }()
	for range 4 {
		wg.Go(func() {
			for i := 0; ctx.Err() == nil; i++ {
				resp, err := attacker.PostForm(srv.URL+"/console/login", url.Values{"token": {fmt.Sprintf("idg_flood-%d", i)}})
				if err != nil {
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				_ = resp.Body.Close()
			}
		})
	}
	for range 20 {
		resp := login(operator, secrets["ops"])
		require.Equal(t, http.StatusSeeOther, resp.StatusCode, "another address's correct login is not slowed by the flood")
	}
	stop()
	wg.Wait()

	// Flood over: the flooding address logs in within its Retry-After.
	resp := login(attacker, secrets["ops"])
	if resp.StatusCode == http.StatusTooManyRequests {
		wait, err := strconv.Atoi(resp.Header.Get("Retry-After"))
		require.NoError(t, err)
		require.LessOrEqual(t, wait, 2)
		time.Sleep(time.Duration(wait) * time.Second)
		resp = login(attacker, secrets["ops"])
	}
	require.Equal(t, http.StatusSeeOther, resp.StatusCode, "the flood's own address logs in once it waited")
}

// Approvals of an operation whose answer is big (a 256 KiB result, as a
// worker answers a completed operation's approval) leave the front door's
// heap as it was: a session keeps at most maxFlashes messages of
// maxFlashBytes together (the answer clipped), and its next page shows the
// newest. The worker is a stand-in that answers every decision on the
// control subjects with the operation's big result. Not parallel: it
// measures the process's heap.
func TestConsoleFlashesBounded(t *testing.T) {
	nc := natstest.Connect(t, natstest.RunServer(t).ClientURL())
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	ledger, err := dedup.Open(t.Context(), js, dedup.BucketConfig{Bucket: "IDEM_LEDGER"})
	require.NoError(t, err)
	key := "refund." + strings.Repeat("ab", 32)
	_, err = ledger.Claim(t.Context(), dedup.ClaimRequest{Key: key, Tool: "refund", Session: "team-a/run-1", Fingerprint: "fp-1", Holder: "w1", Lease: time.Minute})
	require.NoError(t, err)

	names, err := intent.NewNames(intent.DefaultPrefix)
	require.NoError(t, err)
	stream, err := js.CreateStream(t.Context(), jetstream.StreamConfig{Name: "CONTROL", Subjects: []string{names.ControlSubject("*")}})
	require.NoError(t, err)
	big := []byte(`{"blob":"` + strings.Repeat("r", 256<<10) + `"}`)
	worker, err := stream.OrderedConsumer(t.Context(), jetstream.OrderedConsumerConfig{})
	require.NoError(t, err)
	answering, err := worker.Consume(func(m jetstream.Msg) {
		meta, err := m.Metadata()
		if err != nil {
			return
		}
		res := intent.Result{Key: key, Tool: "refund", Status: intent.StatusCompleted, Result: big}
		data, _ := json.Marshal(res)
		out := nats.NewMsg(m.Headers().Get(intent.HeaderReplyTo))
		out.Data = data
		out.Header.Set(intent.HeaderIntentSeq, strconv.FormatUint(meta.Sequence.Stream, 10))
		_ = nc.PublishMsg(out)
	})
	require.NoError(t, err)
	t.Cleanup(answering.Stop)

	cl, err := client.New(nc)
	require.NoError(t, err)
	secret, line, err := auth.NewToken(auth.RoleOperator, "*", "ops")
	require.NoError(t, err)
	toks, err := auth.ParseTokens(strings.NewReader(line))
	require.NoError(t, err)
	s, err := New(nc, cl, nil, Config{Tokens: toks, Rate: 1e9, Burst: 1 << 30})
	require.NoError(t, err)
	t.Cleanup(s.console.shutdown)
	h := s.Handler()
	cookie := loginCookie(t, h, secret)
	page := func() string {
		resp := serve(h, http.MethodGet, "/console/search", "", cookie)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return string(body)
	}
	csrf := csrfField.FindStringSubmatch(page())
	require.NotNil(t, csrf)
	approve := func(reason string) {
		form := url.Values{"csrf": {csrf[1]}, "fingerprint": {"fp-1"}, "reason": {reason}}.Encode()
		resp := serve(h, http.MethodPost, "/console/op/"+key+"/approve", form, cookie)
		require.Equal(t, http.StatusSeeOther, resp.StatusCode)
	}
	approve("warm-up")
	require.Contains(t, page(), "Approved: the operation fired once", "the stand-in worker answers")

	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	const actions = 200
	before := heap()
	for i := range actions {
		approve(fmt.Sprintf("try %d", i))
	}
	grown := int64(heap()) - int64(before)
	t.Logf("heap grew %d KiB over %d actions answered with %d KiB each", grown>>10, actions, len(big)>>10)
	require.Less(t, grown, int64(4<<20),
		"the session kept the actions' answers: the heap grew %d KiB (unbounded: about %d KiB)", grown>>10, actions*len(big)>>10)

	shown := page()
	require.Contains(t, shown, `class="flash `)
	require.LessOrEqual(t, len(shown), maxFlashBytes+len(page()), "the messages shown fit maxFlashBytes")
	require.Contains(t, shown, "(clipped: the operation&#39;s page shows it whole)")
	require.NotContains(t, page(), `class="flash `, "shown once")

	// Small messages: the newest maxFlashes are kept.
	for i := range 3 * maxFlashes {
		form := url.Values{"csrf": {csrf[1]}, "fingerprint": {"fp-1"}}.Encode()
		resp := serve(h, http.MethodPost, fmt.Sprintf("/console/op/refund.%064x/approve", i), form, cookie)
		require.Equal(t, http.StatusSeeOther, resp.StatusCode)
	}
	shown = page()
	require.Equal(t, maxFlashes, strings.Count(shown, `class="flash `), "the page shows the newest messages, at most maxFlashes")
	require.Contains(t, shown, fmt.Sprintf(`href="/console/op/refund.%064x"`, 3*maxFlashes-1), "the newest is kept")
	require.NotContains(t, shown, fmt.Sprintf(`href="/console/op/refund.%064x"`, 2*maxFlashes-1), "the oldest made room")
}

// A probe's event says its verdict and what was asked.
func TestDescribeProbedEvent(t *testing.T) {
	t.Parallel()
	label, text := describeEvent(audit.Event{Kind: audit.KindProbed, Holder: "w1", Attempt: 2, Effect: "webhook",
		Destination: "GET https://api.example/refunds?key=k", Reason: "not_done"})
	require.Equal(t, "probed", label)
	require.Equal(t, "Probed by w1 (claim 2), with the webhook effect's probe: the downstream answered not done downstream; asked GET https://api.example/refunds?key=k", text)
}

// A login ends its token's expired sessions, whichever of them expired,
// and counts only the live ones against the token's cap.
func TestSessionStoreEndsExpired(t *testing.T) {
	t.Parallel()
	secret, line, err := auth.NewToken(auth.RoleOperator, "*", "ops")
	require.NoError(t, err)
	toks, err := auth.ParseTokens(strings.NewReader(line))
	require.NoError(t, err)
	tok, ok := toks.Lookup(secret)
	require.True(t, ok)
	st := sessionStore{byID: map[string]*consoleSession{}, byToken: map[string][]*consoleSession{}}
	var live []*consoleSession
	for range 4 {
		_, err := st.newSession(tok)
		require.NoError(t, err)
	}
	for i, sess := range st.byToken[tok.Hash()] {
		if i%2 == 0 {
			sess.used = time.Now().Add(-2 * sessionIdle)
		} else {
			live = append(live, sess)
		}
	}
	sess, err := st.newSession(tok)
	require.NoError(t, err)
	live = append(live, sess)
	require.Equal(t, live, st.byToken[tok.Hash()], "the expired ones are ended, the live ones kept in order")
	require.Len(t, st.byID, len(live))
}
