package natstest_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/idemgate/idemgate/internal/natstest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestRunServer(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	nc := natstest.Connect(t, s.ClientURL())
	js, err := jetstream.New(nc)
	require.NoError(t, err)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "T"})
	require.NoError(t, err)
	_, err = kv.Create(ctx, "k", []byte("v"))
	require.NoError(t, err)
}

func TestRunCluster(t *testing.T) {
	t.Parallel()
	servers := natstest.RunCluster(t, 3)
	require.Len(t, servers, 3)
	nc := natstest.Connect(t, servers[1].ClientURL())
	js, err := jetstream.New(nc)
	require.NoError(t, err)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "T", Replicas: 3})
	require.NoError(t, err)
	_, err = kv.Create(ctx, "k", []byte("v"))
	require.NoError(t, err)
	st, err := kv.Status(ctx)
	require.NoError(t, err)
	require.Equal(t, 3, st.(*jetstream.KeyValueBucketStatus).StreamInfo().Config.Replicas)
}

// TestProxy: a held reply arrives after Release; a cut drops what was held
// and the client reconnects through the proxy.
func TestProxy(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	responder := natstest.Connect(t, s.ClientURL())
	var served atomic.Int32
	_, err := responder.Subscribe("echo", func(m *nats.Msg) {
		served.Add(1)
		_ = m.Respond(m.Data)
	})
	require.NoError(t, err)
	require.NoError(t, responder.Flush())

	p := natstest.NewProxy(t, s.Addr().String())
	nc := natstest.Connect(t, p.URL(), nats.MaxReconnects(-1), nats.ReconnectWait(20*time.Millisecond))
	_, err = nc.Request("echo", []byte("1"), 5*time.Second)
	require.NoError(t, err, "relayed")

	p.Hold()
	_, err = nc.Request("echo", []byte("2"), 300*time.Millisecond)
	require.ErrorIs(t, err, nats.ErrTimeout, "the reply is held")
	require.Equal(t, int32(2), served.Load(), "the request itself went through")
	late, err := nc.SubscribeSync(nc.NewRespInbox())
	require.NoError(t, err)
	require.NoError(t, nc.PublishRequest("echo", late.Subject, []byte("3")))
	require.Eventually(t, func() bool { return served.Load() == 3 }, 5*time.Second, 5*time.Millisecond,
		"client-to-server bytes are never held")
	p.Release()
	m, err := late.NextMsg(5 * time.Second)
	require.NoError(t, err, "released")
	require.Equal(t, "3", string(m.Data))

	p.Hold()
	p.Cut()
	require.Eventually(t, func() bool { return nc.Stats().Reconnects > 0 && nc.IsConnected() }, 10*time.Second, 5*time.Millisecond)
	_, err = nc.Request("echo", []byte("4"), 5*time.Second)
	require.NoError(t, err, "relayed again after the cut")
}
