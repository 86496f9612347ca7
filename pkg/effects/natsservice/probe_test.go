package natsservice_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go/micro"
	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/pkg/effects"
	"github.com/idemgate/idemgate/pkg/effects/natsservice"
)

func TestNATSProbeVerdicts(t *testing.T) {
	t.Parallel()
	b := setupNATS(t, "svc.refund.probe", func(_ int, req micro.Request) {
		var q struct{ Key string }
		_ = json.Unmarshal(req.Data(), &q)
		switch q.Key {
		case "in-header":
			_ = req.Respond([]byte(`{"refund":"R-1"}`), micro.WithHeaders(micro.Headers{natsservice.HeaderProbeVerdict: {"done"}}))
		case "in-body":
			_ = req.RespondJSON(map[string]any{"verdict": "done", "result": map[string]string{"refund": "R-2"}})
		case "gone":
			_ = req.RespondJSON(map[string]any{"verdict": "not_done"})
		case "failing":
			_ = req.Error("503", "ledger busy", nil)
		case "hang":
			// never answers
		default:
			_ = req.RespondJSON(map[string]any{"verdict": "maybe"})
		}
	})
	e := newNATSService(t, b.nc, natsservice.Config{Subject: "svc.refund", Headers: map[string]string{"Authorization": "Bearer s3cret"}})
	p, err := e.Prober(natsservice.ProbeConfig{Subject: "svc.refund.probe", Timeout: time.Minute})
	require.NoError(t, err)
	for _, tc := range []struct {
		key     string
		verdict effects.Verdict
		result  string
		status  string
	}{
		{"in-header", effects.VerdictDone, `{"refund":"R-1"}`, "Idem-Probe-Verdict: done"},
		{"in-body", effects.VerdictDone, `{"refund":"R-2"}`, "verdict: done"},
		{"gone", effects.VerdictNotDone, "", "verdict: not_done"},
		{"failing", effects.VerdictUnknown, "", "service error 503 ledger busy"},
		{"other", effects.VerdictUnknown, "", "verdict: maybe"},
	} {
		ans, err := p.Probe(context.Background(), effects.Call{Key: tc.key, Tool: "refund"})
		require.NoError(t, err, tc.key)
		require.Equal(t, tc.verdict, ans.Verdict, tc.key)
		require.Equal(t, tc.status, ans.Evidence.Status, tc.key)
		require.Equal(t, "nats svc.refund.probe", ans.Evidence.Request)
		if tc.result != "" {
			require.JSONEq(t, tc.result, string(ans.Result), tc.key)
		}
		got := b.requests()[len(b.requests())-1]
		require.Equal(t, tc.key, got.header.Get(effects.HeaderIdempotencyKey), "the probe forwards the key")
		require.Equal(t, "Bearer s3cret", got.header.Get("Authorization"), "and the static headers")
	}
	short, err := e.Prober(natsservice.ProbeConfig{Subject: "svc.refund.probe", Timeout: 300 * time.Millisecond})
	require.NoError(t, err)
	ans, err := short.Probe(context.Background(), effects.Call{Key: "hang"})
	require.ErrorIs(t, err, effects.ErrProbe)
	require.Equal(t, effects.VerdictUnknown, ans.Verdict)
	require.Equal(t, "no answer within 300ms", ans.Evidence.Status, "bounded by its timeout")

	_, err = e.Prober(natsservice.ProbeConfig{Subject: "svc.*"})
	require.ErrorContains(t, err, "holds a wildcard")
}
