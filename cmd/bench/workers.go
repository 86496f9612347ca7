package main

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/idemgate/idemgate/internal/natsrv"
	"github.com/idemgate/idemgate/internal/worker"
	"github.com/idemgate/idemgate/pkg/dedup"
	"github.com/idemgate/idemgate/pkg/effects"
	"github.com/idemgate/idemgate/pkg/effects/noop"
	"github.com/idemgate/idemgate/pkg/intent"
)

// benchTool is the noop tool every idemgate scenario calls.
const benchTool = "bench_noop"

// intents returns the envelope bytes and keys of n unique intents, named by
// tag so that scenarios sharing a store never share a key.
func (b *bench) intents(n int, tag string) (data [][]byte, keys []string, err error) {
	pad := strings.Repeat("x", max(b.cfg.Payload-60, 0))
	data, keys = make([][]byte, n), make([]string, n)
	for i := range n {
		args := fmt.Sprintf(`{"i":%d,"pad":%q,"run":%q}`, i, pad, b.runID+"-"+tag)
		env := &intent.Envelope{Tool: benchTool, Args: json.RawMessage(args), Session: "bench"}
		id, err := intent.Derive(env, intent.KeySpec{}, time.Now())
		if err != nil {
			return nil, nil, err
		}
		if data[i], err = json.Marshal(env); err != nil {
			return nil, nil, err
		}
		keys[i] = id.Key
	}
	return data, keys, nil
}

// idemBatch prepares data as intents for the workers: with Nats-Msg-Id set
// to each key when msgID.
func idemBatch(names intent.Names, data [][]byte, keys []string, msgID bool) batch {
	var id func(int) string
	if msgID {
		id = func(i int) string { return keys[i] }
	}
	return newBatch(len(data), intent.HeaderReplyTo,
		func(int) string { return names.IntentSubject(benchTool) },
		func(i int) []byte { return data[i] }, id)
}

// expect checks an answer's status and replay flag.
func expect(replayed bool) func([]byte) error {
	want := []byte(`"replayed":` + strconv.FormatBool(replayed))
	return func(data []byte) error {
		if !bytes.Contains(data, []byte(`"status":"completed"`)) || !bytes.Contains(data, want) {
			return fmt.Errorf("want completed, %s; got %s", want, data)
		}
		return nil
	}
}

// tally counts the executions of each of a row's operations: by key (the
// effect's) or by index (the baseline's handler). A row whose operations did
// not each run exactly as often as it expects fails.
type tally struct {
	index   map[string]int
	counts  []atomic.Int32
	unknown atomic.Int64
}

func newTally(n int, keys []string) *tally {
	t := &tally{counts: make([]atomic.Int32, n)}
	if keys != nil {
		t.index = make(map[string]int, len(keys))
		for i, k := range keys {
			t.index[k] = i
		}
	}
	return t
}

func (t *tally) ran(key string) {
	if i, ok := t.index[key]; ok {
		t.counts[i].Add(1)
		return
	}
	t.unknown.Add(1)
}

func (t *tally) ranIndex(i int) {
	if i >= 0 && i < len(t.counts) {
		t.counts[i].Add(1)
		return
	}
	t.unknown.Add(1)
}

// check reports operations that did not run want times each, and runs of
// operations not of the row.
func (t *tally) check(want int32) error {
	var missing, extra int
	example := -1
	for i := range t.counts {
		switch c := t.counts[i].Load(); {
		case c < want:
			missing++
		case c > want:
			extra++
		default:
			continue
		}
		if example < 0 {
			example = i
		}
	}
	if missing == 0 && extra == 0 && t.unknown.Load() == 0 {
		return nil
	}
	return fmt.Errorf("executions: %d operations ran fewer than %d times, %d more (e.g. #%d), %d runs of unknown operations",
		missing, want, extra, example, t.unknown.Load())
}

// registry is the noop tool (with delay), counting its executions in
// *fires when it holds a tally.
func registry(delay time.Duration, fires *atomic.Pointer[tally]) (*effects.Registry, error) {
	noop, err := noop.New(noop.Config{Delay: delay})
	if err != nil {
		return nil, err
	}
	eff := effects.EffectFunc(func(ctx context.Context, call effects.Call) (effects.Outcome, error) {
		out, err := noop.Fire(ctx, call)
		if t := fires.Load(); t != nil && err == nil {
			t.ran(call.Key)
		}
		return out, err
	})
	return effects.NewRegistry(&effects.Tool{Name: benchTool, Kind: "noop", Effect: eff})
}

// workerOpts set up a group of workers.
type workerOpts struct {
	concurrency   int
	ledgerBatch   int // 0: off
	batchInFlight int // 0: the worker's default
	answerCache   time.Duration
	syncIntents   bool
	onStages      func(worker.Stages)
	drain         time.Duration
	noAudit       bool // the audit off: no trail, no receipts (worker.Config.DisableAudit)
	noTrail       bool // the trail off, receipts on (worker.Config.DisableTrail)
}

// workerGroup is Workers workers, each on its own connection, running the
// real consume loop, with the bench's noop tool.
type workerGroup struct {
	names   intent.Names
	cancel  context.CancelFunc
	errs    chan error
	n       int
	workers []*worker.Worker
	fires   atomic.Pointer[tally]
}

// expectRuns makes the group's effect count its executions for keys.
func (g *workerGroup) expectRuns(keys []string) *tally {
	t := newTally(len(keys), keys)
	g.fires.Store(t)
	return t
}

// batchStats sums the workers' group-commit counts.
func (g *workerGroup) batchStats() dedup.BatchStats {
	var sum dedup.BatchStats
	for _, w := range g.workers {
		sum = sum.Add(w.LedgerBatchStats())
	}
	return sum
}

// auditDetail says how many receipts one signature covered and how many
// audit appends the events took ("" with the trail off).
func (g *workerGroup) auditDetail() string {
	var events, appends, receipts, sigs uint64
	for _, w := range g.workers {
		st, r, s := w.AuditStats()
		events, appends, receipts, sigs = events+st.Appended, appends+st.Appends, receipts+r, sigs+s
	}
	if sigs == 0 || appends == 0 {
		return ""
	}
	return fmt.Sprintf("; audit: %.1f receipts per signature, %.0f events per append", float64(receipts)/float64(sigs), float64(events)/float64(appends))
}

// batchDetail says what the group commit did, for a row's detail ("" when
// it did nothing).
func batchDetail(st dedup.BatchStats) string {
	if st.Batches == 0 && st.SingleWrites == 0 {
		return ""
	}
	avg := 0.0
	if st.Batches > 0 {
		avg = float64(st.BatchedWrites) / float64(st.Batches)
	}
	return fmt.Sprintf("; %d batches of %.1f writes on average, %d single writes, %d resent, %d fallbacks",
		st.Batches, avg, st.SingleWrites, st.Resent, st.Fallbacks)
}

// ledgerBatch is the workers' ledger batch on a store with the given sync
// policy: -ledger-batch, or by default the embedded worker's choice —
// group commit when the store syncs every write, else off.
func (b *bench) ledgerBatch(sync string) int {
	switch {
	case b.cfg.LedgerBatch >= 0:
		return b.cfg.LedgerBatch
	case sync == natsrv.SyncAlways:
		return worker.DefaultLedgerBatch
	}
	return 0
}

// defaultOpts are the workers of every scenario but durable and memory.
func (b *bench) defaultOpts(e *env) workerOpts {
	return workerOpts{concurrency: b.cfg.Concurrency, ledgerBatch: b.ledgerBatch(e.sync), answerCache: b.cfg.AnswerCache, drain: 5 * time.Second}
}

// startWorkers starts the workers on e as o says.
func (b *bench) startWorkers(ctx context.Context, e *env, o workerOpts) (*workerGroup, error) {
	g := &workerGroup{errs: make(chan error, b.cfg.Workers)}
	reg, err := registry(0, &g.fires)
	if err != nil {
		return nil, err
	}
	batch := o.ledgerBatch
	if batch == 0 {
		batch = worker.NoLedgerBatch
	}
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	g.cancel = cancel
	for i := range b.cfg.Workers {
		nc, err := e.connectWorker(fmt.Sprintf("bench-worker-%d", i+1), !b.cfg.WorkerInProcess)
		if err != nil {
			_ = g.stop()
			return nil, err
		}
		w, err := worker.New(ctx, nc, reg, nil, worker.Config{
			Holder:              fmt.Sprintf("bench-%d", i+1),
			Concurrency:         o.concurrency,
			MaxAckPending:       max(4096, o.concurrency*b.cfg.Workers),
			Replicas:            e.replicas,
			LedgerBatch:         batch,
			LedgerBatchInFlight: o.batchInFlight,
			AnswerCache:         cmp.Or(o.answerCache, worker.NoAnswerCache),
			SyncIntents:         o.syncIntents,
			OnStages:            o.onStages,
			DisableAudit:        o.noAudit,
			DisableTrail:        o.noTrail,
		})
		if err != nil {
			_ = g.stop()
			return nil, err
		}
		g.names = w.Names()
		g.workers = append(g.workers, w)
		g.n++
		go func() { g.errs <- w.Run(runCtx, o.drain) }()
	}
	return g, nil
}

// stop stops every worker and waits for them.
func (g *workerGroup) stop() error {
	g.cancel()
	var errs []error
	for range g.n {
		errs = append(errs, <-g.errs)
	}
	g.n = 0
	return errors.Join(errs...)
}

// idemRun is what an idemgate row runs on: workers with the noop tool on e,
// n prepared intents and a publisher.
type idemRun struct {
	g    *workerGroup
	data [][]byte
	keys []string
	p    *publisher
}

// prepare starts the workers as o says, builds n intents named after name
// and a publisher keeping inflight unanswered. The caller stops r.g.
func (b *bench) prepare(ctx context.Context, e *env, name string, n, inflight int, o workerOpts) (*idemRun, error) {
	g, err := b.startWorkers(ctx, e, o)
	if err != nil {
		return nil, err
	}
	r := &idemRun{g: g}
	if r.data, r.keys, err = b.intents(n, name); err == nil {
		var pnc *nats.Conn
		if pnc, err = e.connect("bench-publisher"); err == nil {
			r.p, err = newPublisher(pnc, inflight)
		}
	}
	if err != nil {
		_ = g.stop()
		return nil, err
	}
	return r, nil
}

// verify is what a row checks once its workers stopped: each operation ran
// as often as the row expects, and no answer came that was not asked for.
type verify struct {
	name string
	runs *tally
	want int32
	a    *answers
}

// verifyAll checks every row of vs.
func verifyAll(p *publisher, vs []verify) error {
	if p != nil {
		_ = p.nc.Flush()
	}
	var errs []error
	for _, v := range vs {
		if v.runs != nil {
			if err := v.runs.check(v.want); err != nil {
				errs = append(errs, fmt.Errorf("row %s: %w", v.name, err))
			}
		}
		if v.a != nil {
			if err := v.a.strays(); err != nil {
				errs = append(errs, fmt.Errorf("row %s: %w", v.name, err))
			}
		}
	}
	return errors.Join(errs...)
}
