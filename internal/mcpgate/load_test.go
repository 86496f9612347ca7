package mcpgate

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"

	"github.com/idemgate/idemgate/internal/natstest"
	"github.com/idemgate/idemgate/pkg/client"
)

// waitLogger is a test logger that calls each when Load logs that it
// waits for the catalogue: a try failed.
func waitLogger(t *testing.T, each func()) *zap.Logger {
	return zaptest.NewLogger(t, zaptest.WrapOptions(zap.Hooks(func(e zapcore.Entry) error {
		if e.Message == "waiting for the workers' tool catalogue" {
			each()
		}
		return nil
	})))
}

// A gate started before the workers loads the catalogue, trying again,
// once they answer.
func TestLoadWaitsForTheWorkers(t *testing.T) {
	t.Parallel()
	srv := natstest.RunServer(t)
	waiting := make(chan struct{}, 100)
	nc := natstest.Connect(t, srv.ClientURL())
	cl, err := client.New(nc)
	require.NoError(t, err)
	g, err := New(nc, cl, waitLogger(t, func() {
		select {
		case waiting <- struct{}{}:
		default:
		}
	}), Config{})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- g.Load(ctx) }()
	for range 2 { // two tries failed: Load is backing off
		select {
		case <-waiting:
		case err := <-done:
			t.Fatalf("Load returned with no workers: %v", err)
		case <-ctx.Done():
			t.Fatal("Load did not try again")
		}
	}
	(&testBundle{fired: map[string]int{}}).runWorker(t, srv.ClientURL())
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-ctx.Done():
		t.Fatal("Load did not load the catalogue once the workers answered")
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	require.NotEmpty(t, g.served)
}

// Load ends with its context and returns the last try's error, not the
// context's.
func TestLoadEndsWithItsContext(t *testing.T) {
	t.Parallel()
	srv := natstest.RunServer(t)
	ctx, cancel := context.WithCancel(t.Context())
	nc := natstest.Connect(t, srv.ClientURL())
	cl, err := client.New(nc)
	require.NoError(t, err)
	g, err := New(nc, cl, waitLogger(t, cancel), Config{})
	require.NoError(t, err)
	err = g.Load(ctx)
	require.Error(t, err)
	require.NotErrorIs(t, err, context.Canceled)
}
