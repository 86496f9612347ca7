package worker

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/internal/natstest"
	"github.com/idemgate/idemgate/pkg/effects"
	"github.com/idemgate/idemgate/pkg/intent"
)

// BenchmarkIntents measures one worker's handling of an intent on an
// embedded JetStream, the server and the publisher included (their share is
// the same whatever the worker does): unique intents (each fires), and
// duplicates of fired ones, answered from the answer cache (dup) or from the
// ledger (dup-ledger). Its allocs/op are the process's allocations per
// intent: run it with a fixed count to compare two versions of the worker,
//
//	go test -run '^$' -bench BenchmarkIntents -benchtime 20000x ./internal/worker
func BenchmarkIntents(b *testing.B) {
	b.Run("unique", func(b *testing.B) { benchIntents(b, Config{}, false) })
	b.Run("dup", func(b *testing.B) { benchIntents(b, Config{}, true) })
	b.Run("dup-ledger", func(b *testing.B) { benchIntents(b, Config{AnswerCache: NoAnswerCache}, true) })
}

// benchInflight is how many intents the benchmark keeps unanswered.
const benchInflight = 1024

func benchIntents(b *testing.B, cfg Config, dup bool) {
	s := natstest.RunServer(b)
	reg, err := effects.NewRegistry(&effects.Tool{Name: "send", KeySpec: intent.KeySpec{KeyArgs: []string{"n"}},
		Effect: effects.EffectFunc(func(context.Context, effects.Call) (effects.Outcome, error) {
			return effects.Outcome{Result: json.RawMessage(`true`), Invocations: 1}, nil
		})})
	require.NoError(b, err)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg.Holder = "bench"
	w, err := New(ctx, natstest.Connect(b, s.ClientURL()), reg, nil, cfg)
	require.NoError(b, err)
	runCtx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(runCtx, 5*time.Second) }()
	defer func() { stop(); require.NoError(b, <-done) }()
	<-w.Ready()

	pub := natstest.Connect(b, s.ClientURL())
	inbox := pub.NewRespInbox()
	answers := make(chan struct{}, b.N+benchInflight)
	sub, err := pub.Subscribe(inbox, func(*nats.Msg) { answers <- struct{}{} })
	require.NoError(b, err)
	defer func() { _ = sub.Unsubscribe() }()
	subject := w.Names().IntentSubject("send")
	round := func() {
		for i := range b.N {
			if i >= benchInflight {
				<-answers
			}
			msg := nats.NewMsg(subject)
			msg.Data = fmt.Appendf(nil, `{"tool":"send","args":{"n":%d}}`, i)
			msg.Header.Set(intent.HeaderReplyTo, inbox)
			require.NoError(b, pub.PublishMsg(msg))
		}
		for range min(b.N, benchInflight) {
			<-answers
		}
	}
	if dup {
		round() // the records the duplicates are answered from
	}
	b.ReportAllocs()
	b.ResetTimer()
	round()
	b.StopTimer()
}
