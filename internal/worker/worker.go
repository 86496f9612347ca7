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
	"go.uber.org/zap"

	"github.com/idemgate/idemgate/pkg/audit"
	"github.com/idemgate/idemgate/pkg/dedup"
	"github.com/idemgate/idemgate/pkg/effects"
	"github.com/idemgate/idemgate/pkg/intent"
)

// maxHandlers bounds a worker's handler goroutines (see handlerPool): they
// decode, claim and record; effects run on goroutines of their own, and a
// handler about to wait long leaves the pool.
const maxHandlers = 512

// handlerIdle is how long a handler goroutine waits for an intent before it
// exits.
const handlerIdle = 10 * time.Second

// tracer names the worker's spans.
var tracer = otel.Tracer("github.com/idemgate/idemgate/internal/worker")

// Worker consumes intents from the shared durable consumer, claims each key in
// the ledger, fires the effect of the claim's winner and answers every caller.
// Any number of workers, in any number of processes, share one consumer.
type Worker struct {
	cfg   Config
	nc    *nats.Conn
	tools *effects.Registry
	log   *zap.Logger
	res   *resources
	// ledger is the ledger as the stages use it (ledger.go); store is the
	// same ledger, for what is not handling an intent: the scan, the group
	// commit's counts, closing.
	ledger ledger
	store  *dedup.Ledger
	// tracked is the ledger scan's view of the unresolved records (nil
	// before its first round); only the scan uses it.
	tracked *dedup.Tracker
	// replies publishes answers; letters, dead letters.
	replies publisher
	letters streamPublisher
	m       *Metrics
	reads   coalescer
	// schemas validates the args of tools that declare a schema.
	schemas schemas
	// answers is nil when the answer cache is off.
	answers *answerCache
	beats   *heartbeats
	limits  *sessionLimits
	slots   toolSlots
	// queued counts the intents waiting for a capped tool that gave their
	// concurrency slot back (see toolSlot); at most MaxAckPending.
	queued chan struct{}
	// audit writes the audit trail and signs receipts (audit.go).
	audit *auditor
	// obs records what happens to each intent (observe.go).
	obs observe
	// sem holds one of Config.Concurrency slots for each intent handled
	// (see dispatch); handling counts the intents not finished yet; pool
	// runs their handlers while Run consumes (nil before).
	sem      chan struct{}
	handling sync.WaitGroup
	pool     *handlerPool
	ready    chan struct{}
}

// New checks cfg, creates (or updates) the stream, consumer and ledger bucket,
// and returns a worker ready to Run. log may be nil.
func New(ctx context.Context, nc *nats.Conn, tools *effects.Registry, log *zap.Logger, cfg Config) (*Worker, error) {
	if err := prepare(&cfg, tools); err != nil {
		return nil, err
	}
	if log == nil {
		log = zap.NewNop()
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("worker: jetstream: %w", err)
	}
	// The ledger signs receipts with the auditor's key: the key comes
	// first, the trail once setup has made the ledger (its partitions).
	lopts := []dedup.Option{dedup.WithConfirmedTakeover()}
	var auditor *auditor
	if !cfg.DisableAudit {
		if auditor, err = newAuditor(cfg, log); err != nil {
			return nil, fmt.Errorf("worker: audit: %w", err)
		}
		lopts = append(lopts, dedup.WithReceipts(auditor.holder, auditor.receipt))
	}
	if cfg.LedgerBatch != NoLedgerBatch {
		lopts = append(lopts, dedup.WithBatching(dedup.BatchConfig{Max: cfg.LedgerBatch, InFlight: cfg.LedgerBatchInFlight}))
	}
	res, err := setupRetrying(ctx, js, cfg, log, lopts)
	if err != nil {
		return nil, fmt.Errorf("worker: setup: %w", err)
	}
	ledger := res.ledger
	if auditor != nil {
		if err := auditor.start(ctx, res, cfg); err != nil {
			ledger.Close()
			return nil, fmt.Errorf("worker: audit: %w", err)
		}
	}
	if res.persistMismatch {
		log.Warn(migrateHint(res))
	}
	spreadLeaders(ctx, ledger, log)
	stats, auditStats := ledger.BatchStats, auditor.stats
	cfg.Metrics.batchStats.Store(&stats)
	cfg.Metrics.auditStats.Store(&auditStats)
	w := newWorker(cfg, tools, log, res, dedupLedger{ledger}, nc, js)
	w.nc, w.store, w.audit = nc, ledger, auditor
	return w, nil
}

// prepare sets cfg's defaults and checks it, and the tools.
func prepare(cfg *Config, tools *effects.Registry) error {
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return err
	}
	if tools == nil {
		return errors.New("worker: no tools registry")
	}
	cfg.Metrics.knownTools = map[string]bool{}
	for _, name := range tools.Names() {
		cfg.Metrics.knownTools[name] = true
		t, _ := tools.Lookup(name)
		if err := t.KeySpec.Validate(); err != nil {
			return fmt.Errorf("worker: tool %s: %w", name, err)
		}
		if r := t.Policy.Retention; r > 0 && r < cfg.DuplicateWindow {
			return fmt.Errorf("worker: tool %s: retention %s: must be at least the duplicate window (%s): a publish dropped as a duplicate "+
				"is answered from the record, which must still be there", name, r, cfg.DuplicateWindow)
		}
		if r := t.Policy.Retention; r > cfg.AuditRetention {
			return fmt.Errorf("worker: tool %s: retention %s: must not exceed the audit retention (%s), so that the trail keeps the history of every record still answered",
				name, r, cfg.AuditRetention)
		}
	}
	return nil
}

// newWorker assembles what handling an intent needs: cfg (prepared), the
// tools, res's names, the ledger l, and where answers (replies) and dead
// letters (letters) are published — JetStream's for New, fakes for the
// unit tests.
func newWorker(cfg Config, tools *effects.Registry, log *zap.Logger, res *resources, l ledger, replies publisher, letters streamPublisher) *Worker {
	w := &Worker{cfg: cfg, tools: tools, log: log, res: res, ledger: l, replies: replies, letters: letters, m: cfg.Metrics,
		ready: make(chan struct{}), beats: newHeartbeats(), limits: newSessionLimits(cfg.SessionRate, cfg.SessionBurst),
		slots: newToolSlots(tools), queued: make(chan struct{}, cfg.MaxAckPending), sem: make(chan struct{}, cfg.Concurrency)}
	w.obs = observe{w}
	if cfg.AnswerCache > 0 {
		w.answers = newAnswerCache(cfg.AnswerCache, cfg.AnswerCacheBytes)
	}
	return w
}

// Ready is closed once Run serves the tool catalogue and consumes intents.
func (w *Worker) Ready() <-chan struct{} { return w.ready }

// Names returns the names the worker runs on.
func (w *Worker) Names() intent.Names { return w.res.names }

// LedgerBatchStats reports what the ledger's group commit did so far (all
// zero when it is off).
func (w *Worker) LedgerBatchStats() dedup.BatchStats { return w.store.BatchStats() }

// AuditStats reports what the audit trail did so far, and how many
// receipts were signed with how many signatures (all zero with
// Config.DisableAudit).
func (w *Worker) AuditStats() (trail audit.TrailStats, receipts, signatures uint64) {
	c := w.audit.stats()
	return c.trail, c.receipts, c.signatures
}

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
	forget, err := w.serveForget()
	if err != nil {
		return fmt.Errorf("worker: %w", err)
	}
	defer func() { _ = forget.Unsubscribe() }()
	// The trail outlives every handler: it is closed after the drain, and
	// writes what they queued.
	if w.audit.trailing() {
		w.audit.trail.Start()
		defer w.closeTrail()
		forgotten, err := w.serveForgotten()
		if err != nil {
			return fmt.Errorf("worker: %w", err)
		}
		defer func() { _ = forgotten.Unsubscribe() }()
		checkpoints, err := w.serveCheckpoints()
		if err != nil {
			return fmt.Errorf("worker: %w", err)
		}
		defer func() { _ = checkpoints.Unsubscribe() }()
		cpCtx, stopCheckpoints := context.WithCancel(context.WithoutCancel(ctx))
		cpDone := make(chan struct{})
		go func() { defer close(cpDone); w.checkpointEvery(cpCtx, w.cfg.AuditCheckpoint) }()
		defer func() { stopCheckpoints(); <-cpDone }()
	}
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
	// forget subscriptions before anyone is told.
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
	pool := newHandlerPool(min(w.cfg.Concurrency, maxHandlers), handlerIdle)
	w.pool = pool
	stopReaping := make(chan struct{})
	go pool.reapEvery(handlerIdle, stopReaping)
	defer func() { close(stopReaping); pool.close() }()
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
		w.dispatch(ctx, work, msg)
	}

	done := make(chan struct{})
	go func() { w.handling.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(drain):
		w.log.Warn("drain timed out; cancelling effects in flight", zap.Duration("drain", drain))
		cancelWork()
		<-done
	}
	// Every handler has returned: send what the group commit still holds.
	w.store.Close()
	w.log.Info("worker stopped")
	return nil
}
