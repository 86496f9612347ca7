package worker

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemgate/idemgate/internal/natstest"
	"github.com/idemgate/idemgate/pkg/audit"
	"github.com/idemgate/idemgate/pkg/effects"
	"github.com/idemgate/idemgate/pkg/intent"
)

// spans records the spans the package's tests end: the global tracer
// provider, set once (the worker's tracer follows the first one set).
var spans = sync.OnceValue(func() *tracetest.SpanRecorder {
	r := tracetest.NewSpanRecorder()
	otel.SetTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(r)))
	return r
})

// An intent's span is named idemgate.intent, a consumer's, and carries its
// subject, its tool and key once admitted, and the verdict it was settled
// with.
func TestStagesSpan(t *testing.T) {
	t.Parallel()
	rec := spans()
	var calls atomic.Int32
	b := newStages(t, Config{}, &effects.Tool{Name: "send", Effect: counted(&calls, sent)})
	m := b.send(b.intent("send", `{"to":"span"}`))
	require.Equal(t, verbAck, m.settlement(t).verb)
	key := b.answer(t, m).Key
	var got sdktrace.ReadOnlySpan
	require.Eventually(t, func() bool { // the span ends once the message is settled
		for _, s := range rec.Ended() {
			for _, a := range s.Attributes() {
				if a.Key == "idemgate.key" && a.Value.AsString() == key {
					got = s
					return true
				}
			}
		}
		return false
	}, time.Minute, time.Millisecond)
	require.Equal(t, "idemgate.intent", got.Name())
	require.Equal(t, trace.SpanKindConsumer, got.SpanKind())
	require.ElementsMatch(t, []attribute.KeyValue{
		attribute.String("messaging.destination.name", b.names.IntentSubject("send")),
		attribute.String("idemgate.tool", "send"),
		attribute.String("idemgate.key", key),
		attribute.String("idemgate.verdict", "ack"),
	}, got.Attributes())
}

// An answer whose reply subject is not allowed is not published, and
// counted.
func TestStagesRefusedReplySubject(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	b := newStages(t, Config{}, &effects.Tool{Name: "send", Effect: counted(&calls, sent)})
	m := b.intent("send", `{}`)
	m.header.Set(intent.HeaderReplyTo, "$JS.API.STREAM.DELETE.x")
	require.Equal(t, verbAck, b.send(m).settlement(t).verb)
	b.unanswered(t, m)
	require.Equal(t, 1.0, testutil.ToFloat64(b.w.m.badReplies))
}

// A panic in a stage — on the handler's goroutine before the effect (the
// claim), or after it (the outcome's record) — is recovered: the intent is
// delivered again, unanswered, and a key claimed is given back.
func TestStagesPanickingStage(t *testing.T) {
	t.Parallel()
	for _, op := range []string{"claim", "complete"} {
		t.Run(op, func(t *testing.T) {
			t.Parallel()
			var calls atomic.Int32
			b := newStages(t, Config{}, &effects.Tool{Name: "send", Effect: counted(&calls, sent)})
			var once sync.Once
			b.ledger.fault = func(got string) error {
				if got == op {
					once.Do(func() { panic("ledger bug") })
				}
				return nil
			}
			m := b.send(b.intent("send", `{}`))
			require.Equal(t, settlement{verb: verbNak, delay: b.w.cfg.RetryDelay}, m.settlement(t))
			b.unanswered(t, m)
			if op == "complete" {
				require.True(t, b.record(t, b.identity(t, "send", `{}`).Key).Released())
			}
			again := b.send(m.again())
			require.Equal(t, verbAck, again.settlement(t).verb)
			require.Equal(t, intent.StatusCompleted, b.answer(t, again).Status)
		})
	}
}

// A transient failure's key given back is on the trail, between the two
// firings.
func TestTrailRecordsAKeyGivenBack(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	b := start(t, Config{RetryDelay: 10 * time.Millisecond, MaxRetryDelay: 10 * time.Millisecond},
		&effects.Tool{Name: "send", Effect: effects.EffectFunc(func(ctx context.Context, c effects.Call) (effects.Outcome, error) {
			if calls.Add(1) == 1 {
				return effects.Outcome{Invocations: 1}, errors.New("connection refused")
			}
			return effects.Outcome{Result: json.RawMessage(`true`), Invocations: 1}, nil
		})})
	res := submit(t, b.client, "send", `{"to":"a@example.com"}`)
	require.Equal(t, intent.StatusCompleted, res.Status)
	require.NoError(t, b.stop()) // the trail is written

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	js, err := jetstream.New(natstest.Connect(t, b.url))
	require.NoError(t, err)
	lines, err := audit.History(ctx, js, b.worker.Names(), b.worker.res.partitions, res.Key, time.Time{})
	require.NoError(t, err)
	var kinds []audit.Kind
	for _, l := range lines {
		var e struct{ Event audit.Event }
		require.NoError(t, json.Unmarshal(l, &e))
		kinds = append(kinds, e.Event.Kind)
	}
	require.Equal(t, []audit.Kind{audit.KindFired, audit.KindReleased, audit.KindFired, audit.KindOutcome}, kinds)
}

// A new operation over its tool's budget is counted, refused or parked.
func TestOverBudgetIsCounted(t *testing.T) {
	t.Parallel()
	tool := func(name string, over intent.OverBudget) *effects.Tool {
		pol := effects.DefaultPolicy()
		pol.Budget = effects.Budget{Per: intent.BudgetPerTool, Max: 1, Window: time.Hour, OverBudget: over}
		return &effects.Tool{Name: name, Policy: pol, Effect: effects.EffectFunc(func(context.Context, effects.Call) (effects.Outcome, error) {
			return effects.Outcome{Result: json.RawMessage(`true`), Invocations: 1}, nil
		})}
	}
	b := start(t, Config{}, tool("refused", intent.OverBudgetRefuse), tool("parked", intent.OverBudgetApprove))
	for name, over := range map[string]intent.Status{"refused": intent.StatusRejected, "parked": intent.StatusAwaitingApproval} {
		require.Equal(t, intent.StatusCompleted, submit(t, b.client, name, `{"n":1}`).Status)
		require.Equal(t, over, submit(t, b.client, name, `{"n":2}`).Status)
		require.Equal(t, 1.0, testutil.ToFloat64(b.worker.m.overBudget.WithLabelValues(name)), name)
	}
}
