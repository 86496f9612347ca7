package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
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
	url    string // the server's
	// stop stops the worker and returns Run's error: once it returns, the
	// worker has drained and written what its trail held. The test's end
	// stops it too.
	stop func() error
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
	runCtx, cancelRun := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(runCtx, 5*time.Second) }()
	stop := sync.OnceValue(func() error { cancelRun(); return <-done })
	t.Cleanup(func() { require.NoError(t, stop()) })
	select {
	case <-w.Ready():
	case err := <-done:
		t.Fatalf("worker stopped before it was ready: %v", err)
	}
	cl, err := client.New(natstest.Connect(t, s.ClientURL()), client.WithReplyGrace(time.Second))
	require.NoError(t, err)
	return testBundle{client: cl, worker: w, url: s.ClientURL(), stop: stop}
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
		{"answer cache", Config{AnswerCache: 48 * time.Hour}, "answer cache 48h0m0s: must not exceed the ledger TTL (24h0m0s)"},
		{"answer cache bytes", Config{AnswerCacheBytes: -1}, "answer cache bytes -1: must not be negative"},
		{"batches in flight", Config{LedgerBatchInFlight: 9}, "ledger batches in flight 9: use 1-8"},
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
	require.Equal(t, []intent.ToolInfo{{Name: "digest", Effect: "noop", Class: "unsafe", Ledger: true, OnAbandoned: "retry", OnFailure: "replay", OnComplete: "replay",
		KeyArgs: []string{"user"}, WindowSeconds: 604800, LeaseSeconds: 5, Destructive: true, RetentionSeconds: 86400}}, cat.Tools)
}

// An intent out of deliveries is dead-lettered with its reason, not left in
// the work stream.
func TestOutOfDeliveriesIsDeadLettered(t *testing.T) {
	t.Parallel()
	b := start(t, Config{MaxDeliver: 2, RetryDelay: 20 * time.Millisecond, MaxRetryDelay: 50 * time.Millisecond},
		&effects.Tool{Name: "broken", Effect: effects.EffectFunc(func(ctx context.Context, c effects.Call) (effects.Outcome, error) {
			panic("always")
		})})
	env, err := intent.Decode([]byte(`{"tool":"broken","args":{}}`), intent.Limits{})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err = b.client.Publish(ctx, env)
	require.NoError(t, err)
	var letters []client.DeadLetter
	require.Eventually(t, func() bool {
		letters, err = b.client.DeadLetters(ctx, 0)
		require.NoError(t, err)
		return len(letters) == 1
	}, 15*time.Second, 20*time.Millisecond)
	d := letters[0]
	require.Equal(t, "idem.intents.broken", d.Subject)
	require.Contains(t, d.Reason, "max deliveries (2) reached: panic")
	require.EqualValues(t, 2, d.Delivered)
	require.JSONEq(t, `{"tool":"broken","args":{}}`, string(d.Data))
	require.Eventually(t, func() bool {
		info, err := b.worker.res.stream.Info(ctx)
		return err == nil && info.State.Msgs == 0
	}, 10*time.Second, 20*time.Millisecond, "removed from the work stream")
}

// Identical reads in flight on one worker are coalesced into one call.
func TestReadsInFlightAreCoalesced(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	release := make(chan struct{})
	b := start(t, Config{}, &effects.Tool{Name: "lookup", Policy: effects.Policy{Class: intent.ClassRead},
		Effect: effects.EffectFunc(func(ctx context.Context, c effects.Call) (effects.Outcome, error) {
			calls.Add(1)
			<-release
			return effects.Outcome{Result: json.RawMessage(`{"stock":3}`), Invocations: 1}, nil
		})})
	// Registered after start, so it runs before the worker stops: a failed
	// wait below must not leave handlers held.
	unblock := sync.OnceFunc(func() { close(release) })
	t.Cleanup(unblock)
	results := make(chan *intent.Result, 5)
	for range 5 {
		go func() { results <- submit(t, b.client, "lookup", `{"sku":"A1"}`) }()
	}
	// The other four wait on the first call while it is held.
	require.Eventually(t, func() bool {
		return calls.Load() == 1 && b.worker.reads.sharing() == 4
	}, 10*time.Second, 5*time.Millisecond)
	unblock()
	fired := 0
	for range 5 {
		res := <-results
		require.Equal(t, intent.StatusCompleted, res.Status)
		require.JSONEq(t, `{"stock":3}`, string(res.Result))
		if !res.Replayed {
			fired++
		}
	}
	require.EqualValues(t, 1, calls.Load(), "identical reads in flight share one call")
	require.Equal(t, 1, fired)
	require.Equal(t, 4.0, testutil.ToFloat64(b.worker.m.coalesced.WithLabelValues("lookup")))
	require.Equal(t, 1.0, testutil.ToFloat64(b.worker.m.fired.WithLabelValues("lookup")))
	_, err := b.client.Get(context.Background(), "lookup.x")
	require.ErrorIs(t, err, client.ErrNotFound)
}

// An approval that lapsed before the firing started does not fire: the
// operation waits for a new approval.
func TestLapsedApprovalDoesNotFire(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	b := start(t, Config{}, &effects.Tool{Name: "refund",
		Policy: effects.Policy{Class: intent.ClassUnsafe, Ledger: true, Approval: true, ApprovalTTL: time.Hour, OnAbandoned: intent.AbandonRetry},
		Effect: effects.EffectFunc(func(ctx context.Context, c effects.Call) (effects.Outcome, error) {
			calls.Add(1)
			return effects.Outcome{Result: json.RawMessage(`"refunded"`), Invocations: 1}, nil
		})})
	parked := submit(t, b.client, "refund", `{"order":1}`)
	require.Equal(t, intent.StatusAwaitingApproval, parked.Status)

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// Approved with a validity that is over by the time a worker claims it.
	_, _, err := b.worker.ledger.Approve(ctx, parked.Key, parked.Fingerprint, "ops", "", time.Nanosecond)
	require.NoError(t, err)
	env, err := intent.Decode([]byte(`{"tool":"refund","args":{"order":1}}`), intent.Limits{})
	require.NoError(t, err)
	data, err := json.Marshal(env)
	require.NoError(t, err)
	// Without Nats-Msg-Id the copy reaches a worker, which claims the
	// approved key and finds the approval over.
	_, err = b.worker.res.js.Publish(ctx, "idem.intents.refund", data)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		rec, _, err := b.worker.ledger.Get(ctx, parked.Key)
		return err == nil && rec.Status == intent.StatusAwaitingApproval && rec.Attempt >= 2
	}, 10*time.Second, 20*time.Millisecond, "the lapsed approval parks the operation again")
	require.EqualValues(t, 0, calls.Load(), "never fired without a valid approval")
}

// A session over its rate is answered rate_limited and nothing fires; other
// sessions are not affected.
func TestSessionRateLimit(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	b := start(t, Config{SessionRate: 0.001, SessionBurst: 2},
		&effects.Tool{Name: "send", Effect: effects.EffectFunc(func(ctx context.Context, c effects.Call) (effects.Outcome, error) {
			calls.Add(1)
			return effects.Outcome{Result: json.RawMessage(`true`), Invocations: 1}, nil
		})})
	send := func(session string, n int) *intent.Result {
		env, err := intent.Decode(fmt.Appendf(nil, `{"tool":"send","session":%q,"args":{"n":%d}}`, session, n), intent.Limits{})
		require.NoError(t, err)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		res, err := b.client.Submit(ctx, env)
		require.NoError(t, err)
		return res
	}
	require.Equal(t, intent.StatusCompleted, send("run-1", 1).Status)
	require.Equal(t, intent.StatusCompleted, send("run-1", 2).Status)
	limited := send("run-1", 3)
	require.Equal(t, intent.StatusRejected, limited.Status)
	require.Equal(t, intent.CodeRateLimited, limited.Error.Code)
	require.Contains(t, limited.Error.Message, `session "run-1" is over its rate`)
	require.Equal(t, intent.StatusCompleted, send("run-2", 1).Status, "another session has its own budget")
	require.EqualValues(t, 3, calls.Load())
}

// A tool's in-flight cap holds the others back; they fire once a slot is
// free, none is lost.
func TestToolInFlightCap(t *testing.T) {
	t.Parallel()
	var running, peak atomic.Int32
	release := make(chan struct{})
	b := start(t, Config{RetryDelay: 20 * time.Millisecond, MaxRetryDelay: 50 * time.Millisecond},
		&effects.Tool{Name: "slow", Policy: effects.Policy{Class: intent.ClassUnsafe, Ledger: true, OnAbandoned: intent.AbandonRetry, MaxInFlight: 1},
			Effect: effects.EffectFunc(func(ctx context.Context, c effects.Call) (effects.Outcome, error) {
				n := running.Add(1)
				defer running.Add(-1)
				for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
				}
				<-release
				return effects.Outcome{Result: json.RawMessage(`1`), Invocations: 1}, nil
			})})
	results := make(chan *intent.Result, 3)
	for i := range 3 {
		go func() { results <- submit(t, b.client, "slow", fmt.Sprintf(`{"n":%d}`, i)) }()
	}
	var once sync.Once
	defer once.Do(func() { close(release) })
	// All three are delivered and two held back, without a redelivery (a
	// delivery spent), while the first runs.
	require.Eventually(t, func() bool {
		info, err := b.worker.res.consumer.Info(context.Background())
		return err == nil && running.Load() == 1 && info.NumAckPending == 3
	}, 10*time.Second, 5*time.Millisecond)
	info, err := b.worker.res.consumer.Info(context.Background())
	require.NoError(t, err)
	require.Zero(t, info.NumRedelivered, "back-pressure spends no delivery")
	once.Do(func() { close(release) })
	for range 3 {
		require.Equal(t, intent.StatusCompleted, (<-results).Status)
	}
	require.EqualValues(t, 1, peak.Load(), "never more than the cap at once")
	require.Equal(t, 2.0, testutil.ToFloat64(b.worker.m.limited.WithLabelValues("slow", "tool_in_flight")))
}

// With the ledger's writes group-committed the answers are the same:
// fired once, replays, a transient failure retried with its count kept.
func TestBatchedLedgerAnswersTheSame(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	b := start(t, Config{LedgerBatch: 100, RetryDelay: 20 * time.Millisecond, MaxRetryDelay: 50 * time.Millisecond},
		&effects.Tool{Name: "send", Effect: effects.EffectFunc(func(ctx context.Context, c effects.Call) (effects.Outcome, error) {
			if calls.Add(1) == 1 {
				return effects.Outcome{Invocations: 1}, errors.New("downstream unavailable")
			}
			return effects.Outcome{Result: json.RawMessage(`"sent"`), Invocations: 1}, nil
		})})
	results := make(chan *intent.Result, 20)
	for range 20 {
		go func() { results <- submit(t, b.client, "send", `{"to":"a"}`) }()
	}
	fired := 0
	for range 20 {
		res := <-results
		require.Equal(t, intent.StatusCompleted, res.Status)
		require.JSONEq(t, `"sent"`, string(res.Result))
		require.Equal(t, 2, res.Attempts)
		if !res.Replayed {
			fired++
		}
	}
	require.Equal(t, 1, fired)
	require.EqualValues(t, 2, calls.Load(), "one failure, one firing")
}
