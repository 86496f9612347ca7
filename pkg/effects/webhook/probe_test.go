package webhook_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/pkg/effects"
	"github.com/idemgate/idemgate/pkg/effects/netguard"
	"github.com/idemgate/idemgate/pkg/effects/webhook"
)

// probeOf builds the probe cfg describes on a webhook with static headers
// and a URL token, allowed to reach loopback.
func probeOf(t *testing.T, cfg webhook.ProbeConfig) *webhook.Prober {
	t.Helper()
	w, err := webhook.New(webhook.Config{URL: "http://127.0.0.1:1/hook?token=hook-secret", Headers: map[string]string{"Authorization": "Bearer s3cret-token"}, AllowPrivate: loopback})
	require.NoError(t, err)
	p, err := w.Prober(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close(); _ = w.Close() })
	return p
}

func TestProbeVerdicts(t *testing.T) {
	t.Parallel()
	type seen struct {
		path, query, key, auth, method string
	}
	got := make(chan seen, 10)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- seen{r.URL.Path, r.URL.RawQuery, r.Header.Get(effects.HeaderIdempotencyKey), r.Header.Get("Authorization"), r.Method}
		switch r.URL.Query().Get("k") {
		case "done key/1":
			_, _ = w.Write([]byte(`{"refund":"R-1", "echo":"s3cret-token"}`))
		case "plain":
			w.WriteHeader(http.StatusCreated)
			_, _ = w.Write([]byte("made it"))
		case "gone":
			w.WriteHeader(http.StatusNotFound)
		default:
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte(strings.Repeat("x", 3*effects.MaxProbeEvidence)))
		}
	}))
	t.Cleanup(srv.Close)
	p := probeOf(t, webhook.ProbeConfig{URL: srv.URL + "/refunds/{key}?k={key}&api_key=probe-secret", Done: []int{200, 201}})

	for _, tc := range []struct {
		key     string
		verdict effects.Verdict
		result  string
		status  string
	}{
		{"done key/1", effects.VerdictDone, `{"refund":"R-1","echo":"s3cret-token"}`, "200 OK"},
		{"plain", effects.VerdictDone, `"made it"`, "201 Created"},
		{"gone", effects.VerdictNotDone, "", "404 Not Found"},
		{"busy", effects.VerdictUnknown, "", "503 Service Unavailable"},
	} {
		ans, err := p.Probe(context.Background(), effects.Call{Key: tc.key, Tool: "refund"})
		require.NoError(t, err, tc.key)
		require.Equal(t, tc.verdict, ans.Verdict, tc.key)
		if tc.result != "" {
			require.JSONEq(t, tc.result, string(ans.Result), tc.key)
		} else {
			require.Empty(t, ans.Result, tc.key)
		}
		require.Equal(t, tc.status, ans.Evidence.Status)
		s := <-got
		require.Equal(t, http.MethodGet, s.method)
		require.Equal(t, "/refunds/"+tc.key, s.path, "the key is escaped in the path and arrives whole")
		require.Equal(t, tc.key, s.key, "the probe forwards the key")
		require.Equal(t, "Bearer s3cret-token", s.auth, "the probe sends the webhook's static headers")
		esc := strings.ReplaceAll(url.QueryEscape(tc.key), "+", "%20")
		require.Equal(t, "GET "+srv.URL+"/refunds/"+esc+"?k="+esc+"&api_key=[redacted]", ans.Evidence.Request,
			"the evidence names the key whole, and redacts the template's other query values")
		require.NotContains(t, ans.Evidence.Body, "s3cret-token", "header values are redacted from the evidence")
		require.LessOrEqual(t, len(ans.Evidence.Body), effects.MaxProbeEvidence, "the evidence is clipped")
	}
	ans, err := p.Probe(context.Background(), effects.Call{Key: "a&b=c d"})
	require.NoError(t, err)
	require.Contains(t, ans.Evidence.Request, "a%26b%3Dc%20d", "a key is escaped for a query value")
	require.Equal(t, "k=a%26b%3Dc%20d&api_key=probe-secret", (<-got).query)
}

func TestProbeBounded(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(func() { close(release); srv.Close() })
	p := probeOf(t, webhook.ProbeConfig{URL: srv.URL + "/probe?key={key}", Timeout: 200 * time.Millisecond})
	// The caller's context has no deadline: the probe bounds itself.
	ans, err := p.Probe(context.Background(), effects.Call{Key: "k1"})
	require.ErrorIs(t, err, effects.ErrProbe)
	require.Equal(t, effects.VerdictUnknown, ans.Verdict)
	require.Equal(t, "no answer within 200ms", ans.Evidence.Status)
}

func TestProbeDestinationRules(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t.Error("a probe reached a destination the webhook may not")
	}))
	t.Cleanup(srv.Close)
	w, err := webhook.New(webhook.Config{URL: "https://hooks.example.com/x"}) // no allow_private
	require.NoError(t, err)
	t.Cleanup(func() { _ = w.Close() })
	p, err := w.Prober(webhook.ProbeConfig{URL: srv.URL + "/probe?key={key}"})
	require.NoError(t, err)
	ans, err := p.Probe(context.Background(), effects.Call{Key: "k1"})
	require.ErrorIs(t, err, effects.ErrProbe)
	var de *netguard.DestinationError
	require.False(t, errors.As(err, &de), "the message is kept, not the type")
	require.Contains(t, ans.Evidence.Status, "allow_private")
	require.Equal(t, effects.VerdictUnknown, ans.Verdict)
}

func TestProbeConfigValidate(t *testing.T) {
	t.Parallel()
	for cfg, want := range map[*webhook.ProbeConfig]string{
		{}:                                         "url: is missing",
		{URL: "ftp://h/{key}"}:                     "not an http or https URL",
		{URL: "http://{key}.example/x"}:            "has {key} before its path",
		{URL: "http://h/x", Method: "DELETE"}:      `"DELETE" is not one of GET, HEAD, POST`,
		{URL: "http://h/x", Done: []int{99}}:       "status 99 is not an HTTP status",
		{URL: "http://h/x", NotDone: []int{200}}:   "status 200 also means done",
		{URL: "http://h/x", Timeout: -time.Second}: "timeout: is negative",
		{URL: "http://h/{key}", Method: "post"}:    "",
		{URL: "https://h/r?idempotency_key={key}"}: "",
	} {
		err := cfg.Validate()
		if want == "" {
			require.NoError(t, err, fmt.Sprint(*cfg))
			continue
		}
		require.ErrorContains(t, err, want, fmt.Sprint(*cfg))
	}
}
