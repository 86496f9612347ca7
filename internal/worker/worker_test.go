package worker

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"

	"github.com/idemgate/idemgate/internal/natstest"
	"github.com/idemgate/idemgate/pkg/client"
	"github.com/idemgate/idemgate/pkg/effects"
	"github.com/idemgate/idemgate/pkg/intent"
)

type testBundle struct {
	client *client.Client
	worker *Worker
}

// start runs a worker with tools on an embedded JetStream until the test ends.
func start(t *testing.T, cfg Config, tools ...*effects.Tool) testBundle {
	t.Helper()
	s := natstest.RunServer(t)
	nc := natstest.Connect(t, s.ClientURL())
	reg, err := effects.NewRegistry(tools...)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	w, err := New(ctx, nc, reg, zaptest.NewLogger(t), cfg)
	require.NoError(t, err)
	runCtx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(runCtx, 5*time.Second) }()
	t.Cleanup(func() { stop(); require.NoError(t, <-done) })
	select {
	case <-w.Ready():
	case err := <-done:
		t.Fatalf("worker stopped before it was ready: %v", err)
	}
	cl, err := client.New(natstest.Connect(t, s.ClientURL()), client.WithReplyGrace(time.Second))
	require.NoError(t, err)
	return testBundle{client: cl, worker: w}
}

func submit(t *testing.T, cl *client.Client, tool, args string) *intent.Result {
	t.Helper()
	env, err := intent.Decode([]byte(`{"tool":"`+tool+`","args":`+args+`}`), intent.Limits{})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := cl.Submit(ctx, env)
	require.NoError(t, err)
	return res
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		cfg  Config
		want string
	}{
		{"ack wait", Config{AckWait: 10 * time.Millisecond}, "ack wait 10ms: must be at least 1s"},
		{"max deliver", Config{MaxDeliver: 1}, "max deliver 1: must be at least 2"},
		{"ack pending", Config{Concurrency: 64, MaxAckPending: 8}, "max ack pending 8: must be at least the concurrency (64)"},
		{"replicas", Config{Replicas: 2}, "replicas 2: use 1, 3 or 5"},
		{"ttl", Config{LedgerTTL: time.Minute, DuplicateWindow: time.Hour}, "ledger TTL 1m0s: must be at least the duplicate window (1h0m0s)"},
		{"retry", Config{RetryDelay: time.Minute, MaxRetryDelay: time.Second}, "max retry delay 1s: must be at least the retry delay (1m0s)"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			c.cfg.setDefaults()
			err := c.cfg.validate()
			require.ErrorContains(t, err, c.want)
		})
	}
	var ok Config
	ok.setDefaults()
	require.NoError(t, ok.validate())
}

func TestRetryDelayDoublesToItsCap(t *testing.T) {
	t.Parallel()
	w := &Worker{cfg: Config{RetryDelay: time.Second, MaxRetryDelay: 5 * time.Second}}
	got := []time.Duration{}
	for n := uint64(1); n <= 5; n++ {
		got = append(got, w.retryDelay(n))
	}
	require.Equal(t, []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 5 * time.Second, 5 * time.Second}, got)
}

// A transient failure releases the key and the intent is delivered again;
// the retry fires and the answer counts every invocation.
func TestTransientFailureIsRetriedLater(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	b := start(t, Config{RetryDelay: 50 * time.Millisecond, MaxRetryDelay: 100 * time.Millisecond},
		&effects.Tool{Name: "flaky", Effect: effects.EffectFunc(func(ctx context.Context, c effects.Call) (effects.Outcome, error) {
			if calls.Add(1) < 3 {
				return effects.Outcome{Invocations: 1}, errors.New("downstream unavailable")
			}
			return effects.Outcome{Result: json.RawMessage(`{"ok":true}`), Invocations: 1}, nil
		})})
	res := submit(t, b.client, "flaky", `{"n":1}`)
	require.Equal(t, intent.StatusCompleted, res.Status)
	require.False(t, res.Replayed)
	require.EqualValues(t, 3, calls.Load())
	require.Equal(t, 3, res.Attempts, "attempts survive the releases")
}

// A permanent failure is recorded and replayed; it never fires again.
func TestPermanentFailureIsReplayed(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	b := start(t, Config{}, &effects.Tool{Name: "strict", Effect: effects.EffectFunc(func(ctx context.Context, c effects.Call) (effects.Outcome, error) {
		calls.Add(1)
		return effects.Outcome{Invocations: 1}, effects.Permanent(intent.CodeEffectFailed, "422 invalid recipient")
	})})
	for i := range 3 {
		res := submit(t, b.client, "strict", `{"to":"nobody"}`)
		require.Equal(t, intent.StatusFailed, res.Status)
		require.Equal(t, intent.CodeEffectFailed, res.Error.Code)
		require.Contains(t, res.Error.Message, "422 invalid recipient")
		require.Equal(t, i > 0, res.Replayed)
	}
	require.EqualValues(t, 1, calls.Load())
}

// An effect that keeps failing transiently is recorded failed at the last
// delivery: nothing is left unanswered.
func TestLastDeliveryRecordsTheFailure(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	b := start(t, Config{MaxDeliver: 3, RetryDelay: 20 * time.Millisecond, MaxRetryDelay: 50 * time.Millisecond},
		&effects.Tool{Name: "down", Effect: effects.EffectFunc(func(ctx context.Context, c effects.Call) (effects.Outcome, error) {
			calls.Add(1)
			return effects.Outcome{Invocations: 2}, errors.New("connection refused")
		})})
	res := submit(t, b.client, "down", `{}`)
	require.Equal(t, intent.StatusFailed, res.Status)
	require.True(t, strings.HasPrefix(res.Error.Message, "gave up after 3 deliveries"), res.Error.Message)
	require.EqualValues(t, 3, calls.Load())
	require.Equal(t, 6, res.Attempts)
}

// A panicking effect does not stop the worker: the intent is delivered again.
func TestPanicIsRecovered(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	b := start(t, Config{RetryDelay: 20 * time.Millisecond, MaxRetryDelay: 50 * time.Millisecond},
		&effects.Tool{Name: "boom", Effect: effects.EffectFunc(func(ctx context.Context, c effects.Call) (effects.Outcome, error) {
			if calls.Add(1) == 1 {
				panic("effect bug")
			}
			return effects.Outcome{Result: json.RawMessage(`"fine"`), Invocations: 1}, nil
		})})
	res := submit(t, b.client, "boom", `{}`)
	require.Equal(t, intent.StatusCompleted, res.Status)
	require.JSONEq(t, `"fine"`, string(res.Result))
}

// The tool catalogue reports each tool's derivation.
func TestCatalogue(t *testing.T) {
	t.Parallel()
	b := start(t, Config{}, &effects.Tool{Name: "digest", Kind: "noop", Lease: 5 * time.Second,
		KeySpec: intent.KeySpec{KeyArgs: []string{"user"}, Window: 168 * time.Hour},
		Effect:  effects.EffectFunc(func(context.Context, effects.Call) (effects.Outcome, error) { return effects.Outcome{}, nil })})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cat, err := b.client.Tools(ctx)
	require.NoError(t, err)
	require.Equal(t, []intent.ToolInfo{{Name: "digest", Effect: "noop", Class: "unsafe", Ledger: true, OnAbandoned: "retry",
		KeyArgs: []string{"user"}, WindowSeconds: 604800, LeaseSeconds: 5}}, cat.Tools)
}
