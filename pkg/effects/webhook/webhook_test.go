package webhook_test

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/idemgate/idemgate/pkg/effects"
	"github.com/idemgate/idemgate/pkg/effects/netguard"
	"github.com/idemgate/idemgate/pkg/effects/toolsfile"
	"github.com/idemgate/idemgate/pkg/effects/webhook"
)

// received is one request as the test server saw it.
type received struct {
	method string
	path   string
	header http.Header
	body   string
}

// webhookBundle is a test server whose answers are scripted per request.
type webhookBundle struct {
	srv  *httptest.Server
	mu   sync.Mutex
	reqs []received
	// seen gets a value for every request, before the handler answers.
	seen chan int
}

func (b *webhookBundle) requests() []received {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]received(nil), b.reqs...)
}

// setupWebhook starts a server whose n-th request (0-based) is answered by
// handle(n, w, r).
func setupWebhook(t *testing.T, handle func(n int, w http.ResponseWriter, r *http.Request)) *webhookBundle {
	t.Helper()
	b := &webhookBundle{seen: make(chan int, 100)}
	b.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		b.mu.Lock()
		n := len(b.reqs)
		b.reqs = append(b.reqs, received{method: r.Method, path: r.URL.Path, header: r.Header.Clone(), body: string(body)})
		b.mu.Unlock()
		b.seen <- n
		handle(n, w, r)
	}))
	t.Cleanup(b.srv.Close)
	return b
}

// loopback allows the test servers, which listen on 127.0.0.1.
var loopback = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}

// newWebhook builds a webhook with fast retries, allowed to reach loopback,
// unless cfg says otherwise.
func newWebhook(t *testing.T, cfg webhook.Config) *webhook.Effect {
	t.Helper()
	if cfg.AllowPrivate == nil {
		cfg.AllowPrivate = loopback
	}
	if cfg.Retry.InitialInterval == 0 {
		cfg.Retry.InitialInterval = time.Millisecond
	}
	if cfg.Retry.MaxInterval == 0 {
		cfg.Retry.MaxInterval = 5 * time.Millisecond
	}
	w, err := webhook.New(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = w.Close() })
	return w
}

func status(codes ...int) func(int, http.ResponseWriter, *http.Request) {
	return func(n int, w http.ResponseWriter, _ *http.Request) {
		code := codes[min(n, len(codes)-1)]
		w.WriteHeader(code)
		if code >= 300 {
			_, _ = io.WriteString(w, http.StatusText(code))
		}
	}
}

var (
	_ effects.Effect  = (*webhook.Effect)(nil)
	_ effects.Bounded = (*webhook.Effect)(nil)
	_ io.Closer       = (*webhook.Effect)(nil)
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

var testCall = effects.Call{
	Key:     "send_email.4f2a",
	Tool:    "send_email",
	Session: "run-7",
	CallID:  "call_abc",
	Args:    json.RawMessage(`{"subject":"hi","to":"a@example.com"}`),
	Attempt: 1,
}

func TestWebhookSendsArgsAndHeaders(t *testing.T) {
	t.Parallel()
	b := setupWebhook(t, func(_ int, w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{ "id": "msg-1" }`)
	})
	w := newWebhook(t, webhook.Config{
		URL:     b.srv.URL + "/hooks/email",
		Headers: map[string]string{"Authorization": "Bearer s3cret", "X-Team": "mail"},
	})

	out, err := w.Fire(context.Background(), testCall)
	require.NoError(t, err)
	require.Equal(t, 1, out.Invocations)
	require.Equal(t, `{"id":"msg-1"}`, string(out.Result))

	reqs := b.requests()
	require.Len(t, reqs, 1)
	r := reqs[0]
	require.Equal(t, http.MethodPost, r.method)
	require.Equal(t, "/hooks/email", r.path)
	require.JSONEq(t, string(testCall.Args), r.body)
	require.Equal(t, "application/json", r.header.Get("Content-Type"))
	require.Equal(t, testCall.Key, r.header.Get("Idempotency-Key"))
	require.Equal(t, "send_email", r.header.Get("Idem-Tool"))
	require.Equal(t, "run-7", r.header.Get("Idem-Session"))
	require.Equal(t, "call_abc", r.header.Get("Idem-Call-Id"))
	require.Equal(t, "Bearer s3cret", r.header.Get("Authorization"))
	require.Equal(t, "mail", r.header.Get("X-Team"))
}

func TestWebhookOmitsEmptyOptionalHeaders(t *testing.T) {
	t.Parallel()
	b := setupWebhook(t, status(http.StatusNoContent))
	w := newWebhook(t, webhook.Config{URL: b.srv.URL, Method: "put"})

	out, err := w.Fire(context.Background(), effects.Call{Key: "k", Tool: "t", Args: json.RawMessage(`{}`)})
	require.NoError(t, err)
	require.Equal(t, "null", string(out.Result), "an empty body is null")
	r := b.requests()[0]
	require.Equal(t, http.MethodPut, r.method)
	require.NotContains(t, r.header, "Idem-Session")
	require.NotContains(t, r.header, "Idem-Call-Id")
}

func TestWebhookResultBodies(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("x", webhook.MaxResponse+10)
	for _, tc := range []struct {
		name, body, want string
	}{
		{"JSONObject", `{"a": [1, 2]}`, `{"a":[1,2]}`},
		{"JSONString", `"queued"`, `"queued"`},
		{"PlainText", "OK <done>\n", `"OK <done>\n"`},
		{"InvalidUTF8", "a\xffb", `"a\ufffdb"`},
		{"Whitespace", "  \n", `null`},
		{"CutAtLimit", `"` + long, `"\"` + long[:webhook.MaxResponse-1] + `"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setupWebhook(t, func(_ int, w http.ResponseWriter, _ *http.Request) {
				_, _ = io.WriteString(w, tc.body)
			})
			w := newWebhook(t, webhook.Config{URL: b.srv.URL})
			out, err := w.Fire(context.Background(), testCall)
			require.NoError(t, err)
			require.True(t, json.Valid(out.Result), "result must be JSON")
			if tc.name == "InvalidUTF8" {
				var s string
				require.NoError(t, json.Unmarshal(out.Result, &s))
				require.Equal(t, "a\uFFFDb", s)
				return
			}
			require.Equal(t, tc.want, string(out.Result))
		})
	}
}

func TestWebhookRetriesWithTheSameKey(t *testing.T) {
	t.Parallel()
	b := setupWebhook(t, func(n int, w http.ResponseWriter, _ *http.Request) {
		if n < 2 {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		_, _ = io.WriteString(w, `{"ok":true}`)
	})
	w := newWebhook(t, webhook.Config{URL: b.srv.URL})

	out, err := w.Fire(context.Background(), testCall)
	require.NoError(t, err)
	require.Equal(t, 3, out.Invocations)
	require.JSONEq(t, `{"ok":true}`, string(out.Result))
	reqs := b.requests()
	require.Len(t, reqs, 3)
	for _, r := range reqs {
		require.Equal(t, testCall.Key, r.header.Get("Idempotency-Key"))
		require.JSONEq(t, string(testCall.Args), r.body)
	}
}

func TestWebhookRetryableStatuses(t *testing.T) {
	t.Parallel()
	for _, code := range []int{http.StatusRequestTimeout, http.StatusTooManyRequests, http.StatusInternalServerError, http.StatusBadGateway} {
		t.Run(http.StatusText(code), func(t *testing.T) {
			t.Parallel()
			b := setupWebhook(t, status(code, http.StatusOK))
			w := newWebhook(t, webhook.Config{URL: b.srv.URL})
			out, err := w.Fire(context.Background(), testCall)
			require.NoError(t, err)
			require.Equal(t, 2, out.Invocations)
		})
	}
}

func TestWebhookRetryAfterIsHonouredAndCapped(t *testing.T) {
	t.Parallel()
	b := setupWebhook(t, func(n int, w http.ResponseWriter, _ *http.Request) {
		if n == 0 {
			w.Header().Set("Retry-After", "120")
			w.WriteHeader(http.StatusTooManyRequests)
			return
		}
		_, _ = io.WriteString(w, `{}`)
	})
	w := newWebhook(t, webhook.Config{
		URL:   b.srv.URL,
		Retry: effects.RetryPolicy{InitialInterval: time.Millisecond, MaxInterval: 150 * time.Millisecond},
	})

	start := time.Now()
	out, err := w.Fire(context.Background(), testCall)
	elapsed := time.Since(start)
	require.NoError(t, err)
	require.Equal(t, 2, out.Invocations)
	// Backoff alone would wait about 1ms; Retry-After: 120 asks for 2 minutes,
	// capped by max_interval.
	require.GreaterOrEqual(t, elapsed, 150*time.Millisecond)
	require.Less(t, elapsed, 10*time.Second)
}

func TestWebhookClientErrorIsPermanent(t *testing.T) {
	t.Parallel()
	b := setupWebhook(t, func(_ int, w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusBadRequest)
		_, _ = io.WriteString(w, `{"error":"to: invalid address"}`+strings.Repeat(".", 2000))
	})
	w := newWebhook(t, webhook.Config{URL: b.srv.URL + "/hooks/email?token=s3cret"})

	out, err := w.Fire(context.Background(), testCall)
	require.Equal(t, 1, out.Invocations)
	require.ErrorIs(t, err, effects.ErrPermanent)
	pe, ok := effects.IsPermanent(err)
	require.True(t, ok)
	require.Equal(t, "effect_failed", pe.Code)
	require.Contains(t, pe.Message, "400 Bad Request")
	require.Contains(t, pe.Message, "to: invalid address")
	require.Less(t, len(pe.Message), 800, "the body is quoted truncated")
	require.NotContains(t, pe.Message, "s3cret", "the query is not quoted")
	require.Len(t, b.requests(), 1)
}

func TestWebhookRedirectIsPermanent(t *testing.T) {
	t.Parallel()
	b := setupWebhook(t, func(_ int, w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/elsewhere", http.StatusFound)
	})
	w := newWebhook(t, webhook.Config{URL: b.srv.URL})

	out, err := w.Fire(context.Background(), testCall)
	require.Equal(t, 1, out.Invocations)
	require.ErrorIs(t, err, effects.ErrPermanent)
	require.ErrorContains(t, err, "redirects are not followed")
	require.Len(t, b.requests(), 1)
}

// A request the HTTP client refuses to send (a header value with a line
// break) fails at once and for good: retrying would be refused again, and
// nothing reached the downstream.
func TestWebhookUnsendableHeaderIsPermanent(t *testing.T) {
	t.Parallel()
	b := setupWebhook(t, status(http.StatusOK))
	w := newWebhook(t, webhook.Config{URL: b.srv.URL})
	for _, call := range []effects.Call{
		{Tool: "t", Key: "t.k", Args: []byte(`{}`), Session: "run-7\r\nX-Evil: 1"},
		{Tool: "t", Key: "t.k", Args: []byte(`{}`), CallID: "call\x00"},
	} {
		out, err := w.Fire(context.Background(), call)
		require.Equal(t, 1, out.Invocations)
		pe, ok := effects.IsPermanent(err)
		require.True(t, ok, "%v", err)
		require.Equal(t, "effect_failed", pe.Code)
		require.Contains(t, pe.Message, "holds a control character")
		require.Contains(t, pe.Message, "nothing was sent")
	}
	require.Empty(t, b.requests())
}

func TestWebhookExhaustedIsTransient(t *testing.T) {
	t.Parallel()
	b := setupWebhook(t, status(http.StatusServiceUnavailable))
	w := newWebhook(t, webhook.Config{URL: b.srv.URL, Retry: effects.RetryPolicy{MaxAttempts: 3}})

	out, err := w.Fire(context.Background(), testCall)
	require.Equal(t, 3, out.Invocations)
	require.ErrorIs(t, err, effects.ErrExhausted)
	require.ErrorContains(t, err, "503")
	_, perm := effects.IsPermanent(err)
	require.False(t, perm)
}

func TestWebhookConnectionRefused(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	w := newWebhook(t, webhook.Config{URL: "http://" + addr + "/x", Retry: effects.RetryPolicy{MaxAttempts: 3}})

	out, err := w.Fire(context.Background(), testCall)
	require.Equal(t, 3, out.Invocations)
	require.ErrorIs(t, err, effects.ErrExhausted)
	_, perm := effects.IsPermanent(err)
	require.False(t, perm)
}

func TestWebhookTimeout(t *testing.T) {
	t.Parallel()
	b := setupWebhook(t, func(n int, w http.ResponseWriter, r *http.Request) {
		if n == 0 {
			<-r.Context().Done() // hang until the client gives up
			return
		}
		_, _ = io.WriteString(w, `{"ok":true}`)
	})
	// The bound is what the first request waits; every later request gets
	// an answer at once, which a loaded machine delivered later than 50 ms.
	w := newWebhook(t, webhook.Config{URL: b.srv.URL, Timeout: time.Second})

	// The first request times out; the retry is a second firing with the
	// same key, and succeeds.
	out, err := w.Fire(context.Background(), testCall)
	require.NoError(t, err)
	require.Equal(t, 2, out.Invocations)
	reqs := b.requests()
	require.Len(t, reqs, 2)
	require.Equal(t, reqs[0].header.Get("Idempotency-Key"), reqs[1].header.Get("Idempotency-Key"))
}

func TestWebhookTimeoutExhausted(t *testing.T) {
	t.Parallel()
	b := setupWebhook(t, func(_ int, _ http.ResponseWriter, r *http.Request) {
		<-r.Context().Done()
	})
	w := newWebhook(t, webhook.Config{URL: b.srv.URL, Timeout: 20 * time.Millisecond, Retry: effects.RetryPolicy{MaxAttempts: 2}})

	out, err := w.Fire(context.Background(), testCall)
	require.Equal(t, 2, out.Invocations)
	require.ErrorIs(t, err, effects.ErrExhausted)
	require.ErrorContains(t, err, "no complete response within 20ms")
}

func TestWebhookContextCancelStopsRetrying(t *testing.T) {
	t.Parallel()
	b := setupWebhook(t, status(http.StatusServiceUnavailable))
	w := newWebhook(t, webhook.Config{
		URL:   b.srv.URL,
		Retry: effects.RetryPolicy{MaxAttempts: 10, InitialInterval: time.Hour, MaxInterval: time.Hour},
	})
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		<-b.seen // the first request arrived; the webhook now waits an hour
		cancel()
	}()

	out, err := w.Fire(ctx, testCall)
	require.ErrorIs(t, err, context.Canceled)
	require.Equal(t, 1, out.Invocations)
	_, perm := effects.IsPermanent(err)
	require.False(t, perm)
}

func TestWebhookContextCancelAbortsRequest(t *testing.T) {
	t.Parallel()
	b := setupWebhook(t, func(_ int, _ http.ResponseWriter, r *http.Request) {
		<-r.Context().Done()
	})
	w := newWebhook(t, webhook.Config{URL: b.srv.URL, Timeout: time.Hour})
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		<-b.seen
		cancel()
	}()

	out, err := w.Fire(ctx, testCall)
	require.ErrorIs(t, err, context.Canceled)
	require.Equal(t, 1, out.Invocations)
}

func TestWebhookCancelledBeforeFire(t *testing.T) {
	t.Parallel()
	b := setupWebhook(t, status(http.StatusOK))
	w := newWebhook(t, webhook.Config{URL: b.srv.URL})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()

	out, err := w.Fire(ctx, testCall)
	require.ErrorIs(t, err, context.Canceled)
	require.Equal(t, 0, out.Invocations)
	require.Empty(t, b.requests())
}

func TestWebhookMaxDuration(t *testing.T) {
	t.Parallel()
	w := newWebhook(t, webhook.Config{
		URL:     "http://127.0.0.1:1",
		Timeout: 10 * time.Second,
		Retry:   effects.RetryPolicy{MaxAttempts: 4, InitialInterval: 200 * time.Millisecond, MaxInterval: 5 * time.Second},
	})
	require.Equal(t, 4*10*time.Second+3*5*time.Second, w.MaxDuration())
}

func TestNewWebhookRejects(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		cfg  webhook.Config
		want string
	}{
		{"NoURL", webhook.Config{}, "url: is missing"},
		{"Scheme", webhook.Config{URL: "ftp://h/x"}, "not an http or https URL"},
		{"NoHost", webhook.Config{URL: "http:///x"}, "has no host"},
		{"Method", webhook.Config{URL: "http://h", Method: "GET"}, "not one of POST"},
		{"ReservedHeader", webhook.Config{URL: "http://h", Headers: map[string]string{"idempotency-key": "x"}}, "set by the webhook itself"},
		{"IdemHeader", webhook.Config{URL: "http://h", Headers: map[string]string{"Idem-Tool": "x"}}, "set by the webhook itself"},
		{"HeaderName", webhook.Config{URL: "http://h", Headers: map[string]string{"Bad Name": "x"}}, "not a header name"},
		{"HeaderValue", webhook.Config{URL: "http://h", Headers: map[string]string{"X-A": "a\r\nB: c"}}, "line break"},
		{"Attempts", webhook.Config{URL: "http://h", Retry: effects.RetryPolicy{MaxAttempts: -1}}, "not between 1 and 100"},
		{"Intervals", webhook.Config{URL: "http://h", Retry: effects.RetryPolicy{InitialInterval: time.Second, MaxInterval: time.Millisecond}}, "under initial_interval"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := webhook.New(tc.cfg)
			require.ErrorContains(t, err, tc.want)
		})
	}
}

// A webhook without an allowlist refuses loopback at dial time — even when
// the URL names a host ("localhost") that only resolves to loopback — and
// fails permanently without sending anything.
func TestWebhookRefusesLoopbackByDefault(t *testing.T) {
	t.Parallel()
	b := setupWebhook(t, status(http.StatusOK))
	port := b.srv.URL[strings.LastIndexByte(b.srv.URL, ':')+1:]
	for _, u := range []string{b.srv.URL + "/x?token=s3cret", "http://localhost:" + port + "/x"} {
		w, err := webhook.New(webhook.Config{URL: u})
		require.NoError(t, err)
		t.Cleanup(func() { _ = w.Close() })
		out, err := w.Fire(context.Background(), testCall)
		require.ErrorIs(t, err, effects.ErrPermanent, u)
		require.ErrorIs(t, err, netguard.ErrForbidden, u)
		require.Equal(t, 1, out.Invocations, "refused once, not retried")
		pe, _ := effects.IsPermanent(err)
		require.Contains(t, pe.Message, "is loopback and not allowed")
		require.Contains(t, pe.Message, "allow_private")
		require.NotContains(t, pe.Message, "s3cret")
	}
	require.Empty(t, b.requests(), "nothing reached the server")

	// The same server, allowed explicitly.
	w, err := webhook.New(webhook.Config{URL: "http://localhost:" + port + "/x", AllowPrivate: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32"), netip.MustParsePrefix("::1/128")}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = w.Close() })
	_, err = w.Fire(context.Background(), testCall)
	require.NoError(t, err)
	require.Len(t, b.requests(), 1)
}

// Secrets of the configuration never reach a message: not the URL's
// credentials or query, not a static header echoed back in an error body.
func TestWebhookErrorsHideSecrets(t *testing.T) {
	t.Parallel()
	b := setupWebhook(t, func(_ int, w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusUnauthorized)
		_, _ = io.WriteString(w, "bad credentials: "+r.Header.Get("Authorization")+" key="+r.Header.Get("X-Api-Key")+" q="+r.URL.RawQuery)
	})
	u := strings.Replace(b.srv.URL, "http://", "http://hookuser:pa55word@", 1) + "/hooks?sig=abcdef123"
	w := newWebhook(t, webhook.Config{URL: u, Headers: map[string]string{"Authorization": "Bearer tok-9f8e7d", "X-Api-Key": "k-123456"}})
	_, err := w.Fire(context.Background(), testCall)
	pe, ok := effects.IsPermanent(err)
	require.True(t, ok, "%v", err)
	msg := pe.IntentError().Message
	require.Contains(t, msg, "401 Unauthorized")
	require.Contains(t, msg, "[redacted]")
	for _, secret := range []string{"tok-9f8e7d", "k-123456", "pa55word", "abcdef123", "hookuser"} {
		require.NotContains(t, msg, secret)
		require.NotContains(t, err.Error(), secret)
	}

	// A connection error names the URL without credentials or query.
	dead := newWebhook(t, webhook.Config{URL: "http://user:pa55word@127.0.0.1:1/x?sig=abcdef123", Retry: effects.RetryPolicy{MaxAttempts: 1}})
	_, err = dead.Fire(context.Background(), testCall)
	require.Error(t, err)
	require.NotContains(t, err.Error(), "pa55word")
	require.NotContains(t, err.Error(), "abcdef123")
}

func TestToolsFileAllowPrivate(t *testing.T) {
	t.Parallel()
	b := setupWebhook(t, status(http.StatusOK))
	file := func(allow string) []byte {
		return []byte("tools:\n  t:\n    effect: webhook\n    key_args: [id]\n    webhook:\n      url: " + b.srv.URL + "/x\n      retry: {max_attempts: 1}\n" + allow)
	}
	fire := func(t *testing.T, reg *effects.Registry) error {
		t.Helper()
		t.Cleanup(func() { _ = reg.Close() })
		tool, ok := reg.Lookup("t")
		require.True(t, ok)
		_, err := tool.Effect.Fire(context.Background(), testCall)
		return err
	}

	reg, err := toolsfile.Parse(file(""))
	require.NoError(t, err, "a loopback URL parses: the check is at dial time")
	require.ErrorIs(t, fire(t, reg), netguard.ErrForbidden)

	reg, err = toolsfile.Parse(file("      allow_private: [127.0.0.1/32]\n"))
	require.NoError(t, err)
	require.NoError(t, fire(t, reg))

	// The worker-wide list (--webhook-allow) reaches every webhook.
	reg, err = toolsfile.Parse(file(""), toolsfile.WithAllowPrivate(netip.MustParsePrefix("127.0.0.0/8")))
	require.NoError(t, err)
	require.NoError(t, fire(t, reg))

	_, err = toolsfile.Parse(file("      allow_private: [127.0.0.1/32, intranet]\n"))
	require.ErrorContains(t, err, `tools.yaml:8: t.webhook.allow_private[1]: "intranet" is not an IP address or CIDR prefix (write e.g. 127.0.0.1/32 or 10.0.0.0/8)`)
	_, err = toolsfile.Parse(file("      allow_private: 10.0.0.0/8\n"))
	require.ErrorContains(t, err, "t.webhook.allow_private: is \"10.0.0.0/8\", want a list")
}

// firingCall is a third claim of an operation, fired by worker w2.3.
var firingCall = effects.Call{
	Key: "send_email.77aa", Tool: "send_email", Attempt: 3, Holder: "w2.3",
	Args: json.RawMessage(`{"subject":"hi","to":"ann@example.com"}`),
}

func TestWebhookSendsHolderAndAttempt(t *testing.T) {
	t.Parallel()
	b := setupWebhook(t, status(http.StatusServiceUnavailable, http.StatusOK))
	w := newWebhook(t, webhook.Config{URL: b.srv.URL})

	out, err := w.Fire(context.Background(), firingCall)
	require.NoError(t, err)
	require.Equal(t, 2, out.Invocations)
	for _, r := range b.requests() {
		require.Equal(t, "w2.3", r.header.Get(effects.HeaderHolder), "the same on every retry of one firing")
		require.Equal(t, "3", r.header.Get(effects.HeaderAttempt))
	}

	_, err = w.Fire(context.Background(), effects.Call{Key: "k", Tool: "t", Holder: "w1\r\nX-Evil: 1"})
	require.NoError(t, err)
	r := b.requests()[2]
	require.Equal(t, "w1??X-Evil: 1", r.header.Get(effects.HeaderHolder), "a line break cannot end the header")
	require.Empty(t, r.header.Get("X-Evil"))
	require.NotContains(t, r.header, effects.HeaderAttempt, "no attempt, no header")

	_, err = w.Fire(context.Background(), effects.Call{Key: "k", Tool: "t"})
	require.NoError(t, err)
	require.NotContains(t, b.requests()[3].header, effects.HeaderHolder)
}
