package httpapi

import (
	"context"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/internal/auth"
	"github.com/idemgate/idemgate/internal/natstest"
	"github.com/idemgate/idemgate/pkg/client"
	"github.com/idemgate/idemgate/pkg/dedup"
)

// A live page's event stream ends when the front door shuts down: the
// drain does not wait for it.
func TestConsoleStreamsEndOnShutdown(t *testing.T) {
	t.Parallel()
	nc := natstest.Connect(t, natstest.RunServer(t).ClientURL())
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	_, err = dedup.Open(t.Context(), js, dedup.BucketConfig{Bucket: "IDEM_LEDGER"}) // what the workers create
	require.NoError(t, err)
	cl, err := client.New(nc)
	require.NoError(t, err)
	secret, line, err := auth.NewToken(auth.RoleOperator, "*", "ops")
	require.NoError(t, err)
	toks, err := auth.ParseTokens(strings.NewReader(line))
	require.NoError(t, err)
	s, err := New(nc, cl, nil, Config{Tokens: toks})
	require.NoError(t, err)
	ln, err := s.Listen()
	require.NoError(t, err)
	ctx, stop := context.WithCancel(t.Context())
	served := make(chan error, 1)
	go func() { served <- s.Serve(ctx, ln, time.Hour) }()

	base := "http://" + ln.Addr().String()
	jar, err := cookiejar.New(nil)
	require.NoError(t, err)
	c := &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := c.PostForm(base+"/console/login", url.Values{"token": {secret}})
	require.NoError(t, err)
	require.Equal(t, http.StatusSeeOther, resp.StatusCode)
	_ = resp.Body.Close()
	resp, err = c.Get(base + "/console/events")
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))
	first := make([]byte, len("retry:"))
	_, err = io.ReadFull(resp.Body, first)
	require.NoError(t, err)

	stop()
	select {
	case err := <-served:
		require.NoError(t, err)
	case <-t.Context().Done():
		t.Fatal("the shutdown waited for the live page")
	}
	_, err = io.ReadAll(resp.Body)
	require.NoError(t, err, "the stream ended cleanly")
}
