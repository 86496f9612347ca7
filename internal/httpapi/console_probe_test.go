package httpapi

import (
	"io"
	"net/http"
	"net/http/httptest"
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

// A record's probe evidence is shown on its page and in the queue as text:
// a downstream's body cannot inject markup. Without a worker to say that
// the tool has a probe, no "Probe now" is offered.
func TestConsoleProbeEvidence(t *testing.T) {
	t.Parallel()
	nc := natstest.Connect(t, natstest.RunServer(t).ClientURL())
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	ledger, err := dedup.Open(t.Context(), js, dedup.BucketConfig{Bucket: "IDEM_LEDGER"})
	require.NoError(t, err)
	cl, err := client.New(nc)
	require.NoError(t, err)
	secret, line, err := auth.NewToken(auth.RoleOperator, "*", "ops")
	require.NoError(t, err)
	toks, err := auth.ParseTokens(strings.NewReader(line))
	require.NoError(t, err)
	s, err := New(nc, cl, nil, Config{Tokens: toks})
	require.NoError(t, err)
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)
	t.Cleanup(s.console.shutdown)
	ts := srv.URL

	key := "refund." + strings.Repeat("cd", 32)
	c, err := ledger.Claim(t.Context(), dedup.ClaimRequest{Key: key, Tool: "refund", Fingerprint: "fp-1", Holder: "gone", Lease: time.Minute})
	require.NoError(t, err)
	_, err = c.Lease.Hold(t.Context(), "the holder vanished mid-effect")
	require.NoError(t, err)
	hostile := `<script>alert(1)</script><img src=x onerror=alert(2)>`
	_, _, err = ledger.ProbeUncertain(t.Context(), key, dedup.Probe{At: time.Now().UTC(), Key: key, Verdict: "not_done",
		Request: "GET https://api.example/refunds?idempotency_key=" + key, Status: "404 Not Found", Body: hostile}, nil)
	require.NoError(t, err)

	jar := newJar(t)
	hc := noRedirect(jar)
	resp, err := hc.PostForm(ts+"/console/login", url.Values{"token": {secret}})
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	require.Equal(t, http.StatusSeeOther, resp.StatusCode)
	get := func(path string) string {
		resp, err := hc.Get(ts + path)
		require.NoError(t, err)
		defer resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return string(body)
	}

	page := get("/console/op/" + key)
	require.Contains(t, page, `<section id="probe"`)
	require.Contains(t, page, "not done downstream")
	require.Contains(t, page, "404 Not Found")
	require.Contains(t, page, "GET https://api.example/refunds?idempotency_key="+key)
	require.Contains(t, page, "&lt;script&gt;alert(1)&lt;/script&gt;&lt;img src=x onerror=alert(2)&gt;", "the body, as text")
	require.NotContains(t, page, "<script>alert")
	require.NotContains(t, page, "<img src=x")
	requireNoInline(t, strings.ReplaceAll(page, " onerror=alert(2)", "")) // the hostile body, shown as text
	require.NotContains(t, page, "Probe now", "no worker says the tool has a probe")
	require.NotContains(t, page, "bin/submit probe")

	queue := get("/console/")
	require.Contains(t, queue, `class="probe-line"`)
	require.Contains(t, queue, "not done downstream")
	require.NotContains(t, queue, "Probe now")
}
