package client

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/internal/natstest"
	"github.com/idemgate/idemgate/pkg/intent"
)

// A submission's envelope is built once: what is published is exactly
// Prepared.Data — its args in canonical form — and the key the client
// derived from the parsed args is the one the workers derive from those
// bytes.
func TestPublishSendsTheBuiltEnvelope(t *testing.T) {
	t.Parallel()
	srv := natstest.RunServer(t)
	nc := natstest.Connect(t, srv.ClientURL())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	spec := intent.KeySpec{KeyArgs: []string{"order_id"}, VolatileArgs: []string{"at"}}
	cl, err := New(nc, WithKeySpec("refund", spec))
	require.NoError(t, err)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	stream, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: cl.Names().Stream, Subjects: []string{cl.Names().IntentSubject("*")}})
	require.NoError(t, err)

	env := intent.Envelope{Tool: "refund", Args: json.RawMessage(" {\n \"order_id\": \"o-1\", \"amount\": 1.50, \"at\": \"now\" }"), Session: "s", CallID: "c"}
	p, err := cl.Prepare(ctx, env, intent.Limits{})
	require.NoError(t, err)
	require.Equal(t, `{"amount":1.5,"at":"now","order_id":"o-1"}`, string(p.Args), "canonical args")
	sub, err := cl.PublishPrepared(ctx, p)
	require.NoError(t, err)
	require.Equal(t, p.ID.Key, sub.Key)

	msg, err := stream.GetMsg(ctx, sub.Sequence)
	require.NoError(t, err)
	require.Equal(t, string(p.Data()), string(msg.Data), "published as built")
	received, err := intent.DecodeEnvelope(msg.Data, intent.Limits{})
	require.NoError(t, err)
	id, err := received.Derive(spec, time.Time{})
	require.NoError(t, err)
	require.Equal(t, p.ID, id, "the workers' identity")
	require.Equal(t, id.Key, msg.Header.Get(intent.HeaderKey))
	require.Equal(t, id.Fingerprint, msg.Header.Get(intent.HeaderFingerprint))

	// Built envelopes are refused as Decode refuses received ones.
	_, err = cl.Prepare(ctx, intent.Envelope{Tool: "refund", Args: json.RawMessage(`{"order_id":"o-1","order_id":"o-2"}`)}, intent.Limits{})
	require.ErrorIs(t, err, intent.ErrInvalid)
	_, err = cl.Prepare(ctx, intent.Envelope{Tool: "refund", Args: json.RawMessage(`{"a":"` + strings.Repeat("x", 64) + `"}`)}, intent.Limits{MaxBytes: 64})
	require.ErrorIs(t, err, intent.ErrTooLarge)
}
