package client_test

import (
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/internal/natstest"
	"github.com/idemgate/idemgate/pkg/client"
	"github.com/idemgate/idemgate/pkg/intent"
)

// Concurrent copies of one intent on a replicated stream: JetStream may
// answer a copy "duplicate message id is in process" while the first is
// being stored; the client publishes it again and gets the duplicate's ack,
// never an error.
func TestConcurrentCopiesOnAReplicatedStream(t *testing.T) {
	t.Parallel()
	servers := natstest.RunCluster(t, 3)
	ctx := t.Context() // bounded by the test binary's -timeout
	js, err := jetstream.New(natstest.Connect(t, servers[0].ClientURL()))
	require.NoError(t, err)
	_, err = js.CreateStream(ctx, jetstream.StreamConfig{Name: "IDEM_INTENTS", Subjects: []string{"idem.intents.>"},
		Retention: jetstream.WorkQueuePolicy, Replicas: 3, Duplicates: time.Minute})
	require.NoError(t, err)

	const copies = 60
	originals := 0
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i := range copies {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cl, err := client.New(natstest.Connect(t, servers[i%3].ClientURL()), client.WithKeySpec("send", intent.KeySpec{}))
			if !assertNoError(t, err) {
				return
			}
			env, err := intent.Decode([]byte(`{"tool":"send","args":{"to":"x"}}`), intent.Limits{})
			if !assertNoError(t, err) {
				return
			}
			s, err := cl.Publish(ctx, env)
			if !assertNoError(t, err) {
				return
			}
			mu.Lock()
			defer mu.Unlock()
			if !s.Duplicate {
				originals++
			}
		}()
	}
	wg.Wait()
	require.Equal(t, 1, originals, "one copy is stored, every other is acknowledged as its duplicate")
}

func assertNoError(t *testing.T, err error) bool {
	t.Helper()
	if err != nil {
		t.Errorf("publish: %v", err)
		return false
	}
	return true
}
