package effects_test

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"

	"github.com/nats-io/nats.go/micro"
	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/pkg/effects"
)

// firingCall is a third claim of an operation, fired by worker w2.3.
var firingCall = effects.Call{
	Key: "send_email.77aa", Tool: "send_email", Attempt: 3, Holder: "w2.3",
	Args: json.RawMessage(`{"subject":"hi","to":"ann@example.com"}`),
}

func TestWebhookSendsHolderAndAttempt(t *testing.T) {
	t.Parallel()
	b := setupWebhook(t, status(http.StatusServiceUnavailable, http.StatusOK))
	w := newWebhook(t, effects.WebhookConfig{URL: b.srv.URL})

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

func TestSMTPSendsHolderAndAttempt(t *testing.T) {
	t.Parallel()
	b := setupMail(t)
	s := newSMTP(t, effects.SMTPConfig{Addr: b.addr})

	_, err := s.Fire(context.Background(), firingCall)
	require.NoError(t, err)
	_, err = s.Fire(context.Background(), effects.Call{Key: firingCall.Key, Tool: firingCall.Tool, Args: firingCall.Args})
	require.NoError(t, err)
	msgs := b.delivered()
	require.Len(t, msgs, 2)
	m := readMail(t, msgs[0])
	require.Equal(t, "w2.3", m.Header.Get(effects.HeaderHolder))
	require.Equal(t, "3", m.Header.Get(effects.HeaderAttempt))
	bare := readMail(t, msgs[1])
	require.NotContains(t, bare.Header, effects.HeaderHolder)
	require.NotContains(t, bare.Header, effects.HeaderAttempt)
	require.Equal(t, m.Header.Get("Message-ID"), bare.Header.Get("Message-ID"), "the key alone makes the Message-ID")
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
	e := newNATSService(t, b.nc, effects.NATSServiceConfig{Subject: "svc.mail.send"})

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
