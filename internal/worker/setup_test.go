package worker

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
)

// deadlineJS reports whether a Stream lookup's context had a deadline.
type deadlineJS struct {
	jetstream.JetStream
	had bool
}

func (d *deadlineJS) Stream(ctx context.Context, _ string) (jetstream.Stream, error) {
	_, d.had = ctx.Deadline()
	return nil, nil
}

// setup's JetStream bounds the requests of setup only: the ledger setup
// opens keeps it, and its requests later are the caller's to bound.
func TestBoundedJSBoundsSetupOnly(t *testing.T) {
	t.Parallel()
	d := &deadlineJS{}
	js := boundedJS{JetStream: d, bound: time.Minute}
	_, _ = js.Stream(context.WithValue(context.Background(), setupScope{}, true), "s")
	require.True(t, d.had, "setup's request is bounded")
	_, _ = js.Stream(context.Background(), "s")
	require.False(t, d.had, "a later request is not")
}
