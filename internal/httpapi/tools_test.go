package httpapi

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/internal/auth"
	"github.com/idemgate/idemgate/internal/natstest"
	"github.com/idemgate/idemgate/pkg/client"
	"github.com/idemgate/idemgate/pkg/intent"
)

// Args that break the tool's schema are refused at the door, as the
// workers would refuse them, before anything is published: a 400
// invalid_intent problem naming the violation, and the intents stream
// stays empty (a valid call reaches it).
func TestSchemaViolationIsRefusedBeforePublishing(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	nc := natstest.Connect(t, natstest.RunServer(t).ClientURL())
	cl, err := client.New(nc)
	require.NoError(t, err)
	names := cl.Names()

	// The workers' catalogue and stream, with no worker to answer.
	cat, err := json.Marshal(intent.Catalog{Tools: []intent.ToolInfo{{Name: "send_email", Class: intent.ClassUnsafe, Ledger: true,
		Schema: json.RawMessage(`{"type":"object","properties":{"to":{"type":"string"}},"required":["to"]}`)}}})
	require.NoError(t, err)
	_, err = nc.Subscribe(names.ToolsSubject, func(m *nats.Msg) { _ = m.Respond(cat) })
	require.NoError(t, err)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	stream, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: names.Stream, Subjects: []string{names.Subjects}})
	require.NoError(t, err)
	stored := func() uint64 {
		info, err := stream.Info(ctx)
		require.NoError(t, err)
		return info.State.Msgs
	}

	secret, line, err := auth.NewToken(auth.RoleAgent, "team-a", "agent")
	require.NoError(t, err)
	toks, err := auth.ParseTokens(strings.NewReader(line))
	require.NoError(t, err)
	s, err := New(nc, cl, nil, Config{Tokens: toks})
	require.NoError(t, err)
	ts := httptest.NewServer(s.Handler())
	t.Cleanup(ts.Close)
	call := func(args string) (int, map[string]any) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, ts.URL+"/v1/tools/send_email", strings.NewReader(args))
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+secret)
		req.Header.Set("Prefer", "wait=1") // no worker answers a published call
		resp, err := ts.Client().Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		data, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		var body map[string]any
		require.NoError(t, json.Unmarshal(data, &body), string(data))
		if resp.StatusCode >= 400 {
			require.Equal(t, "application/problem+json", resp.Header.Get("Content-Type"), string(data))
		}
		return resp.StatusCode, body
	}

	for args, violation := range map[string]string{
		`{"to":5}`:     `want "string"`,
		`{"cc":"a@b"}`: `missing properties: ["to"]`,
	} {
		status, body := call(args)
		require.Equal(t, http.StatusBadRequest, status, "%s: %v", args, body)
		require.Equal(t, intent.CodeInvalidIntent, body["code"], args)
		require.Contains(t, body["detail"], "args do not match tool send_email's schema", args)
		require.Contains(t, body["detail"], violation, args)
		require.NotContains(t, body, "answer", "refused at the door, not answered by a worker: %v", body)
		h, _ := body["hint"].(map[string]any)
		require.Contains(t, h["text"], "Nothing was done; fix the call", "the model reads what to do: %v", body)
		require.Zero(t, stored(), "%s: nothing reached the stream", args)
	}

	status, body := call(`{"to":"a@b.c"}`)
	require.Equal(t, http.StatusConflict, status, "published, and no worker answers: %v", body)
	require.EqualValues(t, 1, stored(), "the valid call reached the stream")
}
