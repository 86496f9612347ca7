package worker

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"

	"github.com/idemgate/idemgate/internal/tracing"
	"github.com/idemgate/idemgate/pkg/dedup"
	"github.com/idemgate/idemgate/pkg/effects"
	"github.com/idemgate/idemgate/pkg/intent"
)

// tracer names the worker's spans.
var tracer = otel.Tracer("github.com/idemgate/idemgate/internal/worker")

// Worker consumes intents from the shared durable consumer, claims each key in
// the ledger, fires the effect of the claim's winner and answers every caller.
// Any number of workers, in any number of processes, share one consumer.
type Worker struct {
	cfg    Config
	nc     *nats.Conn
	tools  *effects.Registry
	log    *zap.Logger
	res    *resources
	ledger *dedup.Ledger
	m      *Metrics
	reads  coalescer
	// schemas validates the args of tools that declare a schema.
	schemas schemas
	// answers is nil when the answer cache is off.
	answers *answerCache
	beats   *heartbeats
	limits  *sessionLimits
	slots   toolSlots
	// queued counts the intents waiting for a capped tool that gave their
	// handler's slot back (see toolSlot); at most MaxAckPending.
	queued chan struct{}
	ready  chan struct{}
}

// New checks cfg, creates (or updates) the stream, consumer and ledger bucket,
// and returns a worker ready to Run. log may be nil.
func New(ctx context.Context, nc *nats.Conn, tools *effects.Registry, log *zap.Logger, cfg Config) (*Worker, error) {
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if tools == nil {
		return nil, errors.New("worker: no tools registry")
	}
	if log == nil {
		log = zap.NewNop()
	}
	cfg.Metrics.knownTools = map[string]bool{}
	for _, name := range tools.Names() {
		cfg.Metrics.knownTools[name] = true
		t, _ := tools.Lookup(name)
		if err := t.KeySpec.Validate(); err != nil {
			return nil, fmt.Errorf("worker: tool %s: %w", name, err)
		}
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("worker: jetstream: %w", err)
	}
	res, err := setupRetrying(ctx, js, cfg, log)
	if err != nil {
		return nil, fmt.Errorf("worker: setup: %w", err)
	}
	lopts := []dedup.Option{dedup.WithConfirmedTakeover(), dedup.WithRetention(cfg.LedgerTTL)}
	if cfg.LedgerBatch != NoLedgerBatch {
		lopts = append(lopts, dedup.WithBatching(dedup.BatchConfig{Max: cfg.LedgerBatch, InFlight: cfg.LedgerBatchInFlight}))
	}
	if res.persistMismatch {
		log.Warn(migrateHint(res))
	}
	ledger, err := dedup.New(js, res.kv, lopts...)
	if err != nil {
		return nil, fmt.Errorf("worker: ledger: %w", err)
	}
	stats := ledger.BatchStats
	cfg.Metrics.batchStats.Store(&stats)
	w := &Worker{cfg: cfg, nc: nc, tools: tools, log: log, res: res, ledger: ledger, m: cfg.Metrics, ready: make(chan struct{}), beats: newHeartbeats(),
		limits: newSessionLimits(cfg.SessionRate, cfg.SessionBurst), slots: newToolSlots(tools), queued: make(chan struct{}, cfg.MaxAckPending)}
	if cfg.AnswerCache > 0 {
		w.answers = newAnswerCache(cfg.AnswerCache, cfg.AnswerCacheBytes)
	}
	return w, nil
}

// Ready is closed once Run serves the tool catalogue and consumes intents.
func (w *Worker) Ready() <-chan struct{} { return w.ready }

// Names returns the names the worker runs on.
func (w *Worker) Names() intent.Names { return w.res.names }

// LedgerBatchStats reports what the ledger's group commit did so far (all
// zero when it is off).
func (w *Worker) LedgerBatchStats() dedup.BatchStats { return w.ledger.BatchStats() }

// Run consumes intents until ctx is done, then drains: it takes no new
// intents, lets the effects in flight finish for up to drain, and returns.
// Intents still unsettled after drain are left to redelivery (their claims
// are released or expire; the ledger keeps them at most once).
func (w *Worker) Run(ctx context.Context, drain time.Duration) error {
	catalog, err := w.serveCatalog()
	if err != nil {
		return fmt.Errorf("worker: %w", err)
	}
	defer func() { _ = catalog.Stop() }()
	advisories, err := w.watchMaxDeliveries()
	if err != nil {
		return fmt.Errorf("worker: %w", err)
	}
	defer func() { _ = advisories.Unsubscribe() }()
	forget, err := w.serveForget()
	if err != nil {
		return fmt.Errorf("worker: %w", err)
	}
	defer func() { _ = forget.Unsubscribe() }()
	it, err := w.res.consumer.Messages(jetstream.PullMaxMessages(w.cfg.Concurrency))
	if err != nil {
		return fmt.Errorf("worker: consume %s: %w", w.res.names.Consumer, err)
	}
	// work outlives ctx by the drain period so effects in flight can finish
	// and record their results.
	work, cancelWork := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelWork()
	stopped := make(chan struct{})
	go func() {
		select {
		case <-ctx.Done():
			w.log.Info("worker draining: no new intents; finishing those in flight")
			it.Drain()
		case <-stopped:
		}
	}()
	defer close(stopped)

	w.log.Info("worker consuming", zap.String("stream", w.res.names.Stream),
		zap.String("consumer", w.res.names.Consumer), zap.String("holder", w.cfg.Holder),
		zap.Int("concurrency", w.cfg.Concurrency), zap.Int("ledger_batch", w.cfg.LedgerBatch), zap.Stringer("intents_persist", w.res.persist),
		zap.Strings("tools", w.tools.Names()))

	// Ready means served: the server has the catalogue's and the
	// advisories' subscriptions before anyone is told.
	if err := w.nc.FlushTimeout(10 * time.Second); err != nil {
		it.Stop()
		return fmt.Errorf("worker: flush subscriptions: %w", err)
	}
	close(w.ready)
	// The heartbeats outlive every handler: they stop after the drain.
	beatsCtx, stopBeats := context.WithCancel(context.Background())
	beatsDone := make(chan struct{})
	go func() { defer close(beatsDone); w.beats.run(beatsCtx) }()
	defer func() { stopBeats(); <-beatsDone }()
	if w.cfg.LedgerScan > 0 {
		scanCtx, stopScan := context.WithCancel(ctx)
		scanDone := make(chan struct{})
		go func() { defer close(scanDone); w.scanLedger(scanCtx) }()
		defer func() { stopScan(); <-scanDone }()
	}
	sem := make(chan struct{}, w.cfg.Concurrency)
	var wg sync.WaitGroup
	for {
		msg, err := it.Next()
		if errors.Is(err, jetstream.ErrMsgIteratorClosed) {
			break
		}
		if err != nil {
			// Missed heartbeats and the like: the iterator recovers by itself.
			w.log.Warn("next intent", zap.Error(err))
			continue
		}
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			var once sync.Once
			free := func() { once.Do(func() { <-sem }) }
			defer free()
			w.handle(ctx, work, msg, free)
		}()
	}

	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(drain):
		w.log.Warn("drain timed out; cancelling effects in flight", zap.Duration("drain", drain))
		cancelWork()
		<-done
	}
	// Every handler has returned: send what the group commit still holds.
	w.ledger.Close()
	w.log.Info("worker stopped")
	return nil
}

// handle processes one intent message and settles it. stop is cancelled when
// the worker is asked to stop (waits end then); work only when the drain
// period is over (effects and ledger writes use it). free gives the handler's
// concurrency slot back early (see toolSlot).
func (w *Worker) handle(stop, work context.Context, msg jetstream.Msg, free func()) {
	// The intent's trace context (a traceparent header) is the parent of the
	// worker's span; the span reaches the effect and the answer.
	ctx := otel.GetTextMapPropagator().Extract(context.Background(), tracing.Header(msg.Headers()))
	_, span := tracer.Start(ctx, "idemgate.intent", trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(attribute.String("messaging.destination.name", msg.Subject())))
	stop, work = trace.ContextWithSpan(stop, span), trace.ContextWithSpan(work, span)
	v := verdict{verb: verbNak, delay: w.cfg.RetryDelay, reason: "panic"}
	defer func() {
		span.SetAttributes(attribute.String("idemgate.verdict", v.verb.String()))
		span.End()
	}()
	w.m.inFlight.Inc()
	defer w.m.inFlight.Dec()
	meta, err := msg.Metadata()
	if err != nil {
		// Not a JetStream message: nothing to answer, nowhere to redeliver.
		_ = msg.Term()
		return
	}
	j := &job{ctx: work, msg: msg, meta: meta, replyTo: msg.Headers().Get(intent.HeaderReplyTo), seq: meta.Sequence.Stream, free: free}
	w.mark(&j.stages.Delivered)
	defer func() {
		if r := recover(); r != nil {
			w.log.Error("panic handling intent", zap.String("subject", msg.Subject()), zap.Any("panic", r), zap.Stack("stack"))
			v = nak(w.cfg.RetryDelay, "panic")
		}
		w.settle(j, v)
	}()
	v = w.admit(stop, work, j)
}
