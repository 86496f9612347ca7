// Package workertest runs a worker inside a test of another package.
package workertest

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap/zaptest"

	"github.com/idemgate/idemgate/internal/worker"
	"github.com/idemgate/idemgate/pkg/effects"
)

// Run starts a worker serving tools on nc with cfg and returns it once it is
// ready. It runs until the test ends; the test fails if it stops early or
// with an error.
func Run(t testing.TB, nc *nats.Conn, tools *effects.Registry, cfg worker.Config) *worker.Worker {
	t.Helper()
	w, err := worker.New(t.Context(), nc, tools, zaptest.NewLogger(t), cfg)
	if err != nil {
		t.Fatalf("worker.New: %v", err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx, 5*time.Second) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("worker: %v", err)
		}
	})
	select {
	case <-w.Ready():
	case err := <-done:
		t.Fatalf("worker stopped before it was ready: %v", err)
	}
	return w
}
