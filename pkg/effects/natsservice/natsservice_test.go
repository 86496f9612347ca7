package natsservice_test

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/idemgate/idemgate/internal/natstest"
	"github.com/idemgate/idemgate/pkg/effects"
	"github.com/idemgate/idemgate/pkg/effects/natsservice"
	"github.com/idemgate/idemgate/pkg/effects/toolsfile"
	"github.com/idemgate/idemgate/pkg/intent"
)

var (
	_ effects.Effect  = (*natsservice.Effect)(nil)
	_ effects.Bounded = (*natsservice.Effect)(nil)
)

// request is one request as the test service saw it.
type request struct {
	header nats.Header
	data   string
}

// natsBundle is an embedded NATS server, the effect's connection and a
// micro service whose answers are scripted per request.
type natsBundle struct {
	nc  *nats.Conn // the effect's connection
	svc *nats.Conn // the service's connection
	mu  sync.Mutex
	got []request
	// seen gets a value for every request, before the service answers.
	seen chan int
}

func (b *natsBundle) requests() []request {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]request(nil), b.got...)
}

// setupNATS starts a server and, when handle is set, a micro service on
// subject whose n-th request (0-based) is answered by handle(n, req).
func setupNATS(t *testing.T, subject string, handle func(n int, req micro.Request)) *natsBundle {
	t.Helper()
	s := natstest.RunServer(t)
	b := &natsBundle{
		nc:   natstest.Connect(t, s.ClientURL()),
		svc:  natstest.Connect(t, s.ClientURL()),
		seen: make(chan int, 100),
	}
	if handle == nil {
		return b
	}
	svc, err := micro.AddService(b.svc, micro.Config{Name: "mailer", Version: "1.0.0"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = svc.Stop() })
	require.NoError(t, svc.AddEndpoint("send", micro.HandlerFunc(func(req micro.Request) {
		b.mu.Lock()
		n := len(b.got)
		b.got = append(b.got, request{header: nats.Header(req.Headers()), data: string(req.Data())})
		b.mu.Unlock()
		b.seen <- n
		handle(n, req)
	}), micro.WithEndpointSubject(subject)))
	require.NoError(t, b.svc.Flush()) // the server knows the endpoint before the first request
	return b
}

// newNATSService builds the effect with fast retries unless cfg says
// otherwise.
func newNATSService(t *testing.T, nc *nats.Conn, cfg natsservice.Config) *natsservice.Effect {
	t.Helper()
	if cfg.Retry.InitialInterval == 0 {
		cfg.Retry.InitialInterval = time.Millisecond
	}
	if cfg.Retry.MaxInterval == 0 {
		cfg.Retry.MaxInterval = 5 * time.Millisecond
	}
	e, err := natsservice.New(nc, cfg)
	require.NoError(t, err)
	return e
}

func respond(body string) func(int, micro.Request) {
	return func(_ int, req micro.Request) { _ = req.Respond([]byte(body)) }
}

func TestNATSServiceSendsArgsAndHeaders(t *testing.T) {
	t.Parallel()
	b := setupNATS(t, "svc.mail.send", respond(`{ "id": "msg-1" }`))
	e := newNATSService(t, b.nc, natsservice.Config{
		Subject: "svc.mail.send",
		Headers: map[string]string{"Authorization": "Bearer s3cret", "X-Team": "mail"},
	})

	out, err := e.Fire(context.Background(), testCall)
	require.NoError(t, err)
	require.Equal(t, 1, out.Invocations)
	require.Equal(t, `{"id":"msg-1"}`, string(out.Result))

	reqs := b.requests()
	require.Len(t, reqs, 1)
	r := reqs[0]
	require.JSONEq(t, string(testCall.Args), r.data)
	require.Equal(t, testCall.Key, r.header.Get("Idempotency-Key"))
	require.Equal(t, "send_email", r.header.Get("Idem-Tool"))
	require.Equal(t, "run-7", r.header.Get("Idem-Session"))
	require.Equal(t, "call_abc", r.header.Get("Idem-Call-Id"))
	require.Equal(t, "Bearer s3cret", r.header.Get("Authorization"))
	require.Equal(t, "mail", r.header.Get("X-Team"))
}

func TestNATSServiceOmitsEmptyOptionalHeaders(t *testing.T) {
	t.Parallel()
	b := setupNATS(t, "svc.x", respond(""))
	e := newNATSService(t, b.nc, natsservice.Config{Subject: "svc.x"})
	out, err := e.Fire(context.Background(), effects.Call{Key: "k", Tool: "t"})
	require.NoError(t, err)
	require.Equal(t, "null", string(out.Result), "an empty reply is null")
	r := b.requests()[0]
	require.Equal(t, "{}", r.data, "no args send an empty object")
	require.NotContains(t, r.header, "Idem-Session")
	require.NotContains(t, r.header, "Idem-Call-Id")
}

func TestNATSServiceResults(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, body, want string
	}{
		{"JSONObject", `{"a": [1, 2]}`, `{"a":[1,2]}`},
		{"JSONNumber", `42`, `42`},
		{"PlainText", "queued <ok>", `"queued <ok>"`},
		{"Empty", "", `null`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setupNATS(t, "svc.r", respond(tc.body))
			e := newNATSService(t, b.nc, natsservice.Config{Subject: "svc.r"})
			out, err := e.Fire(context.Background(), testCall)
			require.NoError(t, err)
			require.Equal(t, tc.want, string(out.Result))
		})
	}
}

func TestNATSServiceRetriesWithTheSameKey(t *testing.T) {
	t.Parallel()
	b := setupNATS(t, "svc.mail.send", func(n int, req micro.Request) {
		if n == 0 {
			_ = req.Error("503", "busy", nil)
			return
		}
		_ = req.Respond([]byte(`{"ok":true}`))
	})
	e := newNATSService(t, b.nc, natsservice.Config{Subject: "svc.mail.send"})

	out, err := e.Fire(context.Background(), testCall)
	require.NoError(t, err)
	require.Equal(t, 2, out.Invocations)
	require.JSONEq(t, `{"ok":true}`, string(out.Result))
	reqs := b.requests()
	require.Len(t, reqs, 2)
	for _, r := range reqs {
		require.Equal(t, testCall.Key, r.header.Get("Idempotency-Key"))
		require.JSONEq(t, string(testCall.Args), r.data)
	}
}

func TestNATSServiceErrorCodes(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		code      string // "" for an error with no code
		permanent bool
	}{
		{"400", true},
		{"404", true},
		{"422", true},
		{"408", false},
		{"429", false},
		{"500", false},
		{"503", false},
		{"", false},
		{"E_BUSY", false},
	} {
		t.Run("Code"+tc.code, func(t *testing.T) {
			t.Parallel()
			b := setupNATS(t, "svc.e", nil)
			// A plain responder, so that a code-less error can be sent too.
			sub, err := b.svc.Subscribe("svc.e", func(m *nats.Msg) {
				b.seen <- 0
				reply := nats.NewMsg(m.Reply)
				reply.Header.Set("Nats-Service-Error", "to: invalid address")
				if tc.code != "" {
					reply.Header.Set("Nats-Service-Error-Code", tc.code)
				}
				reply.Data = []byte(`{"field":"to"}`)
				_ = m.RespondMsg(reply)
			})
			require.NoError(t, err)
			t.Cleanup(func() { _ = sub.Unsubscribe() })
			require.NoError(t, b.svc.Flush())

			e := newNATSService(t, b.nc, natsservice.Config{Subject: "svc.e", Retry: effects.RetryPolicy{MaxAttempts: 2}})
			out, err := e.Fire(context.Background(), testCall)
			pe, perm := effects.IsPermanent(err)
			require.Equal(t, tc.permanent, perm, "err: %v", err)
			if tc.permanent {
				require.Equal(t, 1, out.Invocations)
				require.Equal(t, "effect_failed", pe.Code)
				require.Equal(t, `nats service svc.e answered `+tc.code+`: to: invalid address ({"field":"to"})`, pe.Message)
				return
			}
			require.Equal(t, 2, out.Invocations)
			require.ErrorIs(t, err, effects.ErrExhausted)
			require.ErrorContains(t, err, "to: invalid address")
		})
	}
}

func TestNATSServiceMicroErrorIsPermanent(t *testing.T) {
	t.Parallel()
	b := setupNATS(t, "svc.mail.send", func(_ int, req micro.Request) {
		_ = req.Error("400", "to: invalid address", nil)
	})
	e := newNATSService(t, b.nc, natsservice.Config{Subject: "svc.mail.send"})
	out, err := e.Fire(context.Background(), testCall)
	require.Equal(t, 1, out.Invocations)
	require.ErrorIs(t, err, effects.ErrPermanent)
	require.EqualError(t, err, "effect_failed: nats service svc.mail.send answered 400: to: invalid address")
	require.Len(t, b.requests(), 1)
}

func TestNATSServiceNoResponders(t *testing.T) {
	t.Parallel()
	b := setupNATS(t, "", nil)
	e := newNATSService(t, b.nc, natsservice.Config{Subject: "svc.nobody", Retry: effects.RetryPolicy{MaxAttempts: 3}})
	out, err := e.Fire(context.Background(), testCall)
	require.Equal(t, 3, out.Invocations)
	require.ErrorIs(t, err, effects.ErrExhausted)
	require.ErrorIs(t, err, nats.ErrNoResponders)
	require.ErrorContains(t, err, "no service listens on the subject")
	_, perm := effects.IsPermanent(err)
	require.False(t, perm)
}

func TestNATSServiceTimeout(t *testing.T) {
	t.Parallel()
	b := setupNATS(t, "svc.slow", func(n int, req micro.Request) {
		if n == 0 {
			return // never answer the first request
		}
		_ = req.Respond([]byte(`{"ok":true}`))
	})
	e := newNATSService(t, b.nc, natsservice.Config{Subject: "svc.slow", Timeout: 50 * time.Millisecond})

	// The first request times out; the retry is a second firing with the
	// same key, and succeeds.
	out, err := e.Fire(context.Background(), testCall)
	require.NoError(t, err)
	require.Equal(t, 2, out.Invocations)
	reqs := b.requests()
	require.Len(t, reqs, 2)
	require.Equal(t, reqs[0].header.Get("Idempotency-Key"), reqs[1].header.Get("Idempotency-Key"))
}

func TestNATSServiceTimeoutExhausted(t *testing.T) {
	t.Parallel()
	b := setupNATS(t, "svc.silent", func(int, micro.Request) {})
	e := newNATSService(t, b.nc, natsservice.Config{Subject: "svc.silent", Timeout: 20 * time.Millisecond, Retry: effects.RetryPolicy{MaxAttempts: 2}})
	out, err := e.Fire(context.Background(), testCall)
	require.Equal(t, 2, out.Invocations)
	require.ErrorIs(t, err, effects.ErrExhausted)
	require.ErrorContains(t, err, "no reply within 20ms (the request may have reached the service)")
}

func TestNATSServiceContextCancel(t *testing.T) {
	t.Parallel()
	b := setupNATS(t, "svc.silent", func(int, micro.Request) {})
	e := newNATSService(t, b.nc, natsservice.Config{Subject: "svc.silent", Timeout: time.Hour})
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		<-b.seen // the service has the request and does not answer
		cancel()
	}()
	out, err := e.Fire(ctx, testCall)
	require.ErrorIs(t, err, context.Canceled)
	require.Equal(t, 1, out.Invocations)
	_, perm := effects.IsPermanent(err)
	require.False(t, perm)

	ctx, cancel = context.WithCancel(context.Background())
	cancel()
	out, err = e.Fire(ctx, testCall)
	require.ErrorIs(t, err, context.Canceled)
	require.Equal(t, 0, out.Invocations)
}

func TestNATSServiceContextCancelStopsRetrying(t *testing.T) {
	t.Parallel()
	b := setupNATS(t, "svc.busy", func(_ int, req micro.Request) { _ = req.Error("503", "busy", nil) })
	e := newNATSService(t, b.nc, natsservice.Config{
		Subject: "svc.busy",
		Retry:   effects.RetryPolicy{MaxAttempts: 10, InitialInterval: time.Hour, MaxInterval: time.Hour},
	})
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		<-b.seen
		cancel()
	}()
	out, err := e.Fire(ctx, testCall)
	require.ErrorIs(t, err, context.Canceled)
	require.Equal(t, 1, out.Invocations)
}

func TestNATSServiceMaxDuration(t *testing.T) {
	t.Parallel()
	b := setupNATS(t, "", nil)
	e, err := natsservice.New(b.nc, natsservice.Config{Subject: "svc.x"})
	require.NoError(t, err)
	require.Equal(t, 4*natsservice.DefaultTimeout+3*effects.DefaultMaxInterval, e.MaxDuration())
}

func TestNewNATSServiceRejects(t *testing.T) {
	t.Parallel()
	b := setupNATS(t, "", nil)
	for _, tc := range []struct {
		name string
		cfg  natsservice.Config
		want string
	}{
		{"NoSubject", natsservice.Config{}, "subject: is missing"},
		{"Wildcard", natsservice.Config{Subject: "svc.*"}, "holds a wildcard"},
		{"FullWildcard", natsservice.Config{Subject: "svc.>"}, "holds a wildcard"},
		{"EmptyToken", natsservice.Config{Subject: "svc..send"}, "has an empty token"},
		{"Space", natsservice.Config{Subject: "svc send"}, "holds a space"},
		{"IdemHeader", natsservice.Config{Subject: "s", Headers: map[string]string{"idem-tool": "x"}}, "set by the effect itself"},
		{"KeyHeader", natsservice.Config{Subject: "s", Headers: map[string]string{"Idempotency-Key": "x"}}, "set by the effect itself"},
		{"NatsHeader", natsservice.Config{Subject: "s", Headers: map[string]string{"Nats-Msg-Id": "x"}}, "reserved for NATS"},
		{"HeaderValue", natsservice.Config{Subject: "s", Headers: map[string]string{"X-A": "a\r\nB: c"}}, "line break"},
		{"Retry", natsservice.Config{Subject: "s", Retry: effects.RetryPolicy{InitialInterval: time.Second, MaxInterval: time.Millisecond}}, "under initial_interval"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := natsservice.New(b.nc, tc.cfg)
			require.ErrorContains(t, err, tc.want)
		})
	}
	_, err := natsservice.New(nil, natsservice.Config{Subject: "s"})
	require.ErrorContains(t, err, "connection: is nil")
}

func TestParseNATSService(t *testing.T) {
	t.Parallel()
	b := setupNATS(t, "billing.charge", respond(`{"charged":true}`))
	r := parse(t, `tools:
  charge:
    effect: nats
    key_args: [order_id]
    nats:
      subject: billing.charge
      timeout: 2s
      headers: {X-Team: billing}
      retry: {max_attempts: 2, initial_interval: 1ms, max_interval: 1s}
`, toolsfile.WithNATSConn(b.nc))
	tool, ok := r.Lookup("charge")
	require.True(t, ok)
	require.Equal(t, intent.EffectNATS, tool.Kind)
	require.IsType(t, &natsservice.Effect{}, tool.Effect)
	require.Equal(t, 2*2*time.Second+time.Second, tool.MaxDuration)

	out, err := tool.Effect.Fire(context.Background(), effects.Call{Key: "charge.1", Tool: "charge", Args: json.RawMessage(`{"order_id":7}`)})
	require.NoError(t, err)
	require.JSONEq(t, `{"charged":true}`, string(out.Result))
	require.Equal(t, "billing", b.requests()[0].header.Get("X-Team"))
}

func TestParseNATSServiceErrors(t *testing.T) {
	t.Parallel()
	b := setupNATS(t, "", nil)
	const head = "tools:\n  t:\n    effect: nats\n    key_args: [id]\n"
	for _, tc := range []struct {
		name string
		file string
		nc   *nats.Conn
		want []string
	}{
		{"Missing", head, b.nc, []string{`tools.yaml:2: t.nats: is missing (add nats: with at least subject: ...)`}},
		{"NoSubject", head + "    nats:\n      timeout: 1s\n", b.nc, []string{`tools.yaml:5: t.nats.subject: is missing (write e.g. subject: billing.charge)`}},
		{"Wildcard", head + "    nats:\n      subject: billing.>\n", b.nc, []string{`tools.yaml:6: t.nats.subject: "billing.>" holds a wildcard`}},
		{"ReservedHeader", head + "    nats:\n      subject: s\n      headers:\n        Idem-Tool: x\n", b.nc, []string{`tools.yaml:8: t.nats.headers.Idem-Tool: is set by the effect itself (remove it)`}},
		{"ZeroTimeout", head + "    nats:\n      subject: s\n      timeout: 0s\n", b.nc, []string{`tools.yaml:7: t.nats.timeout: must be positive`}},
		{"UnknownField", head + "    nats:\n      subject: s\n      queue: workers\n", b.nc, []string{`tools.yaml:7: t.nats.queue: unknown field`}},
		{"BadRetry", head + "    nats:\n      subject: s\n      retry:\n        max_attempts: lots\n", b.nc, []string{`tools.yaml:8: t.nats.retry.max_attempts: "lots" is not a whole number`}},
		{"NoConnection", head + "    nats: {subject: s}\n", nil, []string{`tools.yaml:5: t.nats: no NATS connection`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r, err := toolsfile.Parse([]byte(tc.file), toolsfile.WithNATSConn(tc.nc))
			require.Nil(t, r)
			require.ErrorIs(t, err, toolsfile.ErrConfig)
			lines := strings.Split(err.Error(), "\n")
			require.Len(t, lines, len(tc.want), "errors: %v", err)
			for i, want := range tc.want {
				require.True(t, strings.HasPrefix(lines[i], want), "error %d:\n got  %s\n want %s...", i, lines[i], want)
			}
		})
	}

	// Without the connection, the kind is unknown.
	_, err := toolsfile.Parse([]byte(head + "    nats: {subject: s}\n"))
	require.ErrorContains(t, err, `tools.yaml:3: t.effect: unknown effect "nats"`)
}

// firingCall is a third claim of an operation, fired by worker w2.3.
var firingCall = effects.Call{
	Key: "send_email.77aa", Tool: "send_email", Attempt: 3, Holder: "w2.3",
	Args: json.RawMessage(`{"subject":"hi","to":"ann@example.com"}`),
}

func TestNATSServiceSendsHolderAndAttempt(t *testing.T) {
	t.Parallel()
	b := setupNATS(t, "svc.mail.send", func(n int, req micro.Request) {
		if n == 0 {
			_ = req.Error("503", "busy", nil)
			return
		}
		_ = req.Respond([]byte(`{}`))
	})
	e := newNATSService(t, b.nc, natsservice.Config{Subject: "svc.mail.send"})

	out, err := e.Fire(context.Background(), firingCall)
	require.NoError(t, err)
	require.Equal(t, 2, out.Invocations)
	for _, r := range b.requests() {
		require.Equal(t, "w2.3", r.header.Get(effects.HeaderHolder), "the same on every retry of one firing")
		require.Equal(t, "3", r.header.Get(effects.HeaderAttempt))
	}

	_, err = e.Fire(context.Background(), effects.Call{Key: "k", Tool: "t"})
	require.NoError(t, err)
	r := b.requests()[2]
	require.NotContains(t, r.header, effects.HeaderHolder)
	require.NotContains(t, r.header, effects.HeaderAttempt)
}

var (
	_ effects.Effect  = (*natsservice.Effect)(nil)
	_ effects.Bounded = (*natsservice.Effect)(nil)
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func parse(t *testing.T, data string, opts ...toolsfile.Option) *effects.Registry {
	t.Helper()
	r, err := toolsfile.Parse([]byte(data), opts...)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, r.Close()) })
	return r
}

var testCall = effects.Call{
	Key:     "send_email.4f2a",
	Tool:    "send_email",
	Session: "run-7",
	CallID:  "call_abc",
	Args:    json.RawMessage(`{"subject":"hi","to":"a@example.com"}`),
	Attempt: 1,
}
