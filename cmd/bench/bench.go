package main

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"

	"github.com/idemgate/idemgate/internal/natsrv"
	"github.com/idemgate/idemgate/internal/worker"
	"github.com/idemgate/idemgate/pkg/client"
	"github.com/idemgate/idemgate/pkg/dedup"
	"github.com/idemgate/idemgate/pkg/effects"
	"github.com/idemgate/idemgate/pkg/intent"
)

// Scenarios, in the order they run.
var allScenarios = []string{"baseline", "unique", "dup", "client", "latency", "fsync", "durable", "memory"}

// benchTool is the noop tool every idemgate scenario calls.
const benchTool = "bench_noop"

// config is one bench invocation.
type config struct {
	N               int           // intents per throughput run
	FsyncN          int           // intents (and kv.Create) of the fsync-always runs, and of each durable row
	DurableInflight []int         // intents in flight of the durable rows
	Inflight        int           // unanswered intents the publisher keeps (closed loop)
	Concurrency     int           // per worker (and per baseline consumer)
	Workers         int           // worker instances, each on its own connection
	Payload         int           // bytes of an intent's args
	TCP             bool          // connect over TCP loopback instead of in-process
	Cluster         bool          // an in-process 3-node cluster, R3 stream and bucket
	Sync            string        // sync policy of every scenario but fsync
	LedgerBatch     int           // the workers' ledger batch in every scenario but durable (0: off; -1: as the worker's embedded default)
	AnswerCache     time.Duration // the workers' answer cache (0: off)
	Scenarios       []string      // subset of allScenarios
	Rate            float64       // latency: intents/s; 0 = half the unique rate
	LatencyFor      time.Duration // latency: how long the open-loop load runs
	MemInflight     int           // memory: intents held in flight
	MemDelay        time.Duration // memory: how long each held effect would take
	StoreDir        string        // parent of each scenario's fresh store dir
	CPUProfile      string        // prefix of per-scenario CPU profiles
	MemProfile      string        // prefix of per-scenario heap profiles
	Timeout         time.Duration // bound of each scenario
	Short           bool          // the short mode, for CI: a check, not a measurement
	Rounds          int           // measurements of baseline, unique, dup and fsync (median reported)
}

func (c *config) validate() error {
	var errs []error
	if c.N < 1 || c.FsyncN < 1 {
		errs = append(errs, fmt.Errorf("-n %d, -fsync-n %d: must be at least 1", c.N, c.FsyncN))
	}
	if c.Inflight < 1 || c.Concurrency < 1 || c.Workers < 1 || c.MemInflight < 1 || c.Rounds < 1 {
		errs = append(errs, errors.New("-inflight, -concurrency, -workers, -mem-inflight and -rounds must be at least 1"))
	}
	if c.Payload < 0 || c.Payload > intent.DefaultMaxBytes/2 {
		errs = append(errs, fmt.Errorf("-payload %d: use 0 to %d bytes", c.Payload, intent.DefaultMaxBytes/2))
	}
	if c.Rate < 0 || c.LatencyFor <= 0 || c.Timeout <= 0 || c.MemDelay <= 0 {
		errs = append(errs, errors.New("-rate must not be negative; -latency-duration, -mem-delay and -timeout must be positive"))
	}
	for _, s := range c.Scenarios {
		if !slices.Contains(allScenarios, s) {
			errs = append(errs, fmt.Errorf("-scenarios: unknown %q: use %s or all", s, strings.Join(allScenarios, ",")))
		}
	}
	return errors.Join(errs...)
}

func (c *config) wants(s string) bool { return slices.Contains(c.Scenarios, s) }

// bench runs the scenarios of one invocation and collects their figures.
type bench struct {
	cfg   config
	out   io.Writer
	runID string
	res   results
	rows  []row
}

// results are the latency and memory figures the targets compare (the
// rates are the rows').
type results struct {
	rate                    float64 // latency: offered intents/s
	p50, p90, p99, pmax     time.Duration
	heap, rss, heap0, rss0  uint64 // memory: with MemInflight in flight, and idle
	memInflight, memReached int
	haveLatency, haveMemory bool
}

func run(ctx context.Context, cfg config, out io.Writer) (*bench, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	b := &bench{cfg: cfg, out: out, runID: nuid.Next()}
	mode := "in-process"
	if cfg.TCP {
		mode = "TCP loopback"
	}
	topo := "1 server, R1"
	if cfg.Cluster {
		topo = "3-node cluster, R3"
	}
	fmt.Fprintf(out, "idemgate bench: n=%d inflight=%d concurrency=%d workers=%d payload=%dB %s, %s, sync %s; GOMAXPROCS=%d NumCPU=%d\n",
		cfg.N, cfg.Inflight, cfg.Concurrency, cfg.Workers, cfg.Payload, mode, topo, cfg.Sync, runtime.GOMAXPROCS(0), runtime.NumCPU())
	if la, err := os.ReadFile("/proc/loadavg"); err == nil {
		fmt.Fprintf(out, "load average at start: %s\n", strings.Join(strings.Fields(string(la))[:3], " "))
	}

	type step struct {
		name string
		fn   func(context.Context) error
	}
	// The rates the targets compare alternate round by round, so that a
	// change of load on a shared machine hits both sides.
	var plan []step
	for range cfg.Rounds {
		if cfg.wants("baseline") {
			plan = append(plan, step{"baseline", b.baseline})
		}
		if cfg.wants("unique") || cfg.wants("dup") {
			plan = append(plan, step{"unique", b.uniqueAndDup})
		}
		if cfg.wants("fsync") {
			plan = append(plan, step{"fsync", b.fsync})
		}
	}
	for _, s := range []step{{"client", b.client}, {"latency", b.latency}, {"durable", b.durable}, {"memory", b.memory}} {
		if cfg.wants(s.name) {
			plan = append(plan, s)
		}
	}
	for _, s := range plan {
		sctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
		err := s.fn(sctx)
		cancel()
		if err != nil {
			return b, fmt.Errorf("%s: %w", s.name, err)
		}
	}
	b.print()
	return b, nil
}

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
// to each key when keys is not nil.
func idemBatch(names intent.Names, data [][]byte, keys []string) batch {
	var msgID func(int) string
	if keys != nil {
		msgID = func(i int) string { return keys[i] }
	}
	return newBatch(len(data), intent.HeaderReplyTo,
		func(int) string { return names.IntentSubject(benchTool) },
		func(i int) []byte { return data[i] }, msgID)
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

// registry is the noop tool, optionally wrapped.
func registry(delay time.Duration, wrap func(effects.Effect) effects.Effect) (*effects.Registry, error) {
	noop, err := effects.NewNoop(effects.NoopConfig{Delay: delay})
	if err != nil {
		return nil, err
	}
	var eff effects.Effect = noop
	if wrap != nil {
		eff = wrap(noop)
	}
	return effects.NewRegistry(&effects.Tool{Name: benchTool, Kind: "noop", Effect: eff})
}

// workerGroup is Workers workers, each on its own connection, running the
// real consume loop.
type workerGroup struct {
	names   intent.Names
	cancel  context.CancelFunc
	errs    chan error
	n       int
	workers []*worker.Worker
}

// batchStats sums the workers' group-commit counts.
func (g *workerGroup) batchStats() dedup.BatchStats {
	var sum dedup.BatchStats
	for _, w := range g.workers {
		st := w.LedgerBatchStats()
		sum.Batches += st.Batches
		sum.BatchedWrites += st.BatchedWrites
		sum.SingleWrites += st.SingleWrites
		sum.Resent += st.Resent
		sum.Fallbacks += st.Fallbacks
	}
	return sum
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

// startWorkers starts the workers, group-committing their ledger writes in
// batches of up to ledgerBatch (0: each write on its own).
func (b *bench) startWorkers(ctx context.Context, e *env, reg *effects.Registry, concurrency, ledgerBatch int, drain time.Duration) (*workerGroup, error) {
	if ledgerBatch == 0 {
		ledgerBatch = worker.NoLedgerBatch
	}
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	g := &workerGroup{cancel: cancel, errs: make(chan error, b.cfg.Workers)}
	for i := range b.cfg.Workers {
		nc, err := e.connect(fmt.Sprintf("bench-worker-%d", i+1))
		if err != nil {
			g.stop()
			return nil, err
		}
		w, err := worker.New(ctx, nc, reg, nil, worker.Config{
			Holder:        fmt.Sprintf("bench-%d", i+1),
			Concurrency:   concurrency,
			MaxAckPending: max(4096, concurrency*b.cfg.Workers),
			Replicas:      e.replicas,
			LedgerBatch:   ledgerBatch,
			AnswerCache:   cmp.Or(b.cfg.AnswerCache, worker.NoAnswerCache),
		})
		if err != nil {
			g.stop()
			return nil, err
		}
		g.names = w.Names()
		g.workers = append(g.workers, w)
		g.n++
		go func() { g.errs <- w.Run(runCtx, drain) }()
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

// profile starts the CPU profile of scenario name, if asked; the returned
// function stops it and writes the heap profile, if asked.
func (b *bench) profile(name string) (stop func() error, err error) {
	var cpu *os.File
	if b.cfg.CPUProfile != "" {
		if cpu, err = os.Create(b.cfg.CPUProfile + "." + name + ".pprof"); err != nil {
			return nil, err
		}
		if err := pprof.StartCPUProfile(cpu); err != nil {
			_ = cpu.Close()
			return nil, err
		}
	}
	return func() error {
		var errs []error
		if cpu != nil {
			pprof.StopCPUProfile()
			errs = append(errs, cpu.Close())
		}
		if b.cfg.MemProfile != "" {
			errs = append(errs, writeHeapProfile(b.cfg.MemProfile+"."+name+".pprof"))
		}
		return errors.Join(errs...)
	}, nil
}

func writeHeapProfile(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	runtime.GC()
	if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}

// measure runs fn under scenario name's profiles and returns the CPU time
// the whole process (servers, workers, publisher) used meanwhile.
func (b *bench) measure(name string, fn func() error) (time.Duration, error) {
	stop, err := b.profile(name)
	if err != nil {
		return 0, err
	}
	cpu0 := cpuTime()
	ferr := fn()
	cpu := cpuTime() - cpu0
	return cpu, errors.Join(ferr, stop())
}

// cpuTime is the user and system CPU time of the process so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// baseline is the same messaging without the ledger: async JetStream publish
// to a work-queue stream, the worker's pull consumer settings and
// concurrency, a core-NATS reply, an ack.
func (b *bench) baseline(ctx context.Context) error {
	e, err := startEnv(b.cfg.StoreDir, b.cfg.Cluster, b.cfg.TCP, b.cfg.Sync)
	if err != nil {
		return err
	}
	defer e.close()
	_, err = b.runBaseline(ctx, e, "baseline", b.cfg.N, b.cfg.Inflight)
	return err
}

// runBaseline measures n messages through the baseline with inflight
// unanswered, adds the row and returns its rate.
func (b *bench) runBaseline(ctx context.Context, e *env, name string, n, inflight int) (float64, error) {
	nc, err := e.connect("bench-base-setup")
	if err != nil {
		return 0, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return 0, err
	}
	stream, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:       "BENCH_BASE",
		Subjects:   []string{"bench.base.>"},
		Retention:  jetstream.WorkQueuePolicy,
		Storage:    jetstream.FileStorage,
		Replicas:   e.replicas,
		Duplicates: 2 * time.Minute,
	})
	if err != nil {
		return 0, err
	}
	cons, err := stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
		Durable:       "BENCH_BASE",
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       30 * time.Second,
		MaxDeliver:    10,
		MaxAckPending: max(4096, b.cfg.Concurrency*b.cfg.Workers),
		Replicas:      e.replicas,
	})
	if err != nil {
		return 0, err
	}
	runCtx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	errs := make(chan error, b.cfg.Workers)
	for i := range b.cfg.Workers {
		cnc, err := e.connect(fmt.Sprintf("bench-base-%d", i+1))
		if err != nil {
			cancel()
			wg.Wait()
			return 0, err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- consumeBaseline(runCtx, cons, cnc, b.cfg.Concurrency)
		}()
	}
	defer func() { cancel(); wg.Wait() }()

	data, _, err := b.intents(n, name)
	if err != nil {
		return 0, err
	}
	pnc, err := e.connect("bench-publisher")
	if err != nil {
		return 0, err
	}
	p, err := newPublisher(pnc, inflight)
	if err != nil {
		return 0, err
	}
	bt := newBatch(len(data), intent.HeaderReplyTo,
		func(int) string { return "bench.base." + benchTool },
		func(i int) []byte { return data[i] }, nil)
	var took time.Duration
	cpu, err := b.measure(name, func() error {
		var err error
		took, err = p.closedLoop(ctx, bt, inflight, nil)
		return err
	})
	if err != nil {
		return 0, err
	}
	ops := float64(n) / took.Seconds()
	b.add(row{name: name, ops: ops, cpu: cpu / time.Duration(n),
		detail: fmt.Sprintf("%d msgs, %d in flight, in %s", n, inflight, took.Round(time.Millisecond))})
	cancel()
	wg.Wait()
	for range b.cfg.Workers {
		if err := <-errs; err != nil {
			return 0, err
		}
	}
	return ops, nil
}

// consumeBaseline mirrors the worker's consume loop (pull with
// PullMaxMessages(concurrency), one goroutine per message up to concurrency)
// with a handler that only replies and acks.
func consumeBaseline(ctx context.Context, cons jetstream.Consumer, nc *nats.Conn, concurrency int) error {
	it, err := cons.Messages(jetstream.PullMaxMessages(concurrency))
	if err != nil {
		return err
	}
	stopped := make(chan struct{})
	defer close(stopped)
	go func() {
		select {
		case <-ctx.Done():
			it.Drain()
		case <-stopped:
		}
	}()
	sem := make(chan struct{}, concurrency)
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		msg, err := it.Next()
		if errors.Is(err, jetstream.ErrMsgIteratorClosed) {
			return nil
		}
		if err != nil {
			continue
		}
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if _, err := msg.Metadata(); err != nil {
				_ = msg.Term()
				return
			}
			if reply := msg.Headers().Get(intent.HeaderReplyTo); reply != "" {
				_ = nc.Publish(reply, msg.Data())
			}
			_ = msg.Ack()
		}()
	}
}

// uniqueAndDup runs N unique intents through the workers, then the same N
// again as duplicates (published without Nats-Msg-Id, so that every one
// reaches a worker and is replayed from the ledger).
func (b *bench) uniqueAndDup(ctx context.Context) error {
	e, err := startEnv(b.cfg.StoreDir, b.cfg.Cluster, b.cfg.TCP, b.cfg.Sync)
	if err != nil {
		return err
	}
	defer e.close()
	_, err = b.runUnique(ctx, e, "unique", "baseline", b.cfg.N, b.cfg.wants("dup"))
	return err
}

// idemRun is what an idemgate row runs on: workers with the noop tool on e,
// n prepared intents and a publisher.
type idemRun struct {
	g    *workerGroup
	data [][]byte
	keys []string
	p    *publisher
}

// prepare starts the workers (group-committing the ledger's writes in
// batches of ledgerBatch, 0 for none), builds n intents named after name and
// a publisher keeping inflight unanswered. The caller stops r.g.
func (b *bench) prepare(ctx context.Context, e *env, name string, n, inflight, ledgerBatch int) (*idemRun, error) {
	reg, err := registry(0, nil)
	if err != nil {
		return nil, err
	}
	g, err := b.startWorkers(ctx, e, reg, b.cfg.Concurrency, ledgerBatch, 5*time.Second)
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

// runUnique measures N unique intents on e (and then their duplicates when
// dup) and returns the unique rate.
func (b *bench) runUnique(ctx context.Context, e *env, name, ref string, n int, dup bool) (float64, error) {
	r, err := b.prepare(ctx, e, name, n, b.cfg.Inflight, b.ledgerBatch(e.sync))
	if err != nil {
		return 0, err
	}
	g, data, keys, p := r.g, r.data, r.keys, r.p
	defer func() { _ = g.stop() }()
	var took time.Duration
	cpu, err := b.measure(name, func() error {
		var err error
		took, err = p.closedLoop(ctx, idemBatch(g.names, data, keys), b.cfg.Inflight, expect(false))
		return err
	})
	if err != nil {
		return 0, err
	}
	ops := float64(n) / took.Seconds()
	b.add(row{name: name, ops: ops, cpu: cpu / time.Duration(n), ref: ref,
		detail: fmt.Sprintf("%d intents in %s", n, took.Round(time.Millisecond))})
	if !dup {
		return ops, g.stop()
	}
	cpu, err = b.measure("dup", func() error {
		var err error
		took, err = p.closedLoop(ctx, idemBatch(g.names, data, nil), b.cfg.Inflight, expect(true))
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("duplicates: %w", err)
	}
	b.add(row{name: "dup", ops: float64(n) / took.Seconds(), cpu: cpu / time.Duration(n), ref: "unique",
		detail: fmt.Sprintf("%d replays in %s (no Nats-Msg-Id)", n, took.Round(time.Millisecond))})
	return ops, g.stop()
}

// client runs N unique intents through pkg/client, then the same N again
// inside the stream's duplicate window: Inflight goroutines each calling
// Client.Submit one after another. A first submission derives the key,
// publishes with Nats-Msg-Id and waits for the pub ack, subscribes a private
// inbox and waits for the answer; a repeat gets PubAck.Duplicate and watches
// the ledger key for the record.
func (b *bench) client(ctx context.Context) error {
	e, err := startEnv(b.cfg.StoreDir, b.cfg.Cluster, b.cfg.TCP, b.cfg.Sync)
	if err != nil {
		return err
	}
	defer e.close()
	reg, err := registry(0, nil)
	if err != nil {
		return err
	}
	g, err := b.startWorkers(ctx, e, reg, b.cfg.Concurrency, b.ledgerBatch(e.sync), 5*time.Second)
	if err != nil {
		return err
	}
	defer func() { _ = g.stop() }()
	data, _, err := b.intents(b.cfg.N, "client")
	if err != nil {
		return err
	}
	envs := make([]*intent.Envelope, len(data))
	for i, d := range data {
		if envs[i], err = intent.Decode(d, intent.Limits{}); err != nil {
			return err
		}
	}
	pnc, err := e.connect("bench-client")
	if err != nil {
		return err
	}
	cl, err := client.New(pnc, client.WithKeySpec(benchTool, intent.KeySpec{}))
	if err != nil {
		return err
	}
	// Every repeat watches the ledger key with a consumer of the bucket's
	// stream, and the server allows 1000 consumers per stream by default.
	inflight := min(b.cfg.Inflight, maxClientInflight)
	for _, pass := range []struct {
		name, ref string
		replayed  bool
	}{{"unique-client", "unique", false}, {"dup-client", "unique-client", true}} {
		var took time.Duration
		cpu, err := b.measure(pass.name, func() error {
			var err error
			took, err = submitAll(ctx, cl, envs, inflight, pass.replayed)
			return err
		})
		if err != nil {
			return fmt.Errorf("%s: %w", pass.name, err)
		}
		n := len(envs)
		b.add(row{name: pass.name, ops: float64(n) / took.Seconds(), cpu: cpu / time.Duration(n), ref: pass.ref,
			detail: fmt.Sprintf("%d Client.Submit, %d at once, in %s", n, inflight, took.Round(time.Millisecond))})
	}
	return g.stop()
}

// maxClientInflight bounds the concurrent Client.Submit calls: a repeat's
// ledger watch is a consumer, and nats-server allows 1000 consumers per
// stream unless configured otherwise.
const maxClientInflight = 500

// submitAll submits envs from inflight goroutines and checks every answer.
func submitAll(ctx context.Context, cl *client.Client, envs []*intent.Envelope, inflight int, replayed bool) (time.Duration, error) {
	var next atomic.Int64
	errs := make(chan error, inflight)
	var wg sync.WaitGroup
	start := time.Now()
	for range inflight {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1) - 1
				if i >= int64(len(envs)) {
					return
				}
				// A context per call: Submission.Wait stops a ledger watch
				// only when its context ends.
				sctx, cancel := context.WithTimeout(ctx, time.Minute)
				res, err := cl.Submit(sctx, envs[i])
				cancel()
				if err == nil && (res.Status != intent.StatusCompleted || res.Replayed != replayed) {
					err = fmt.Errorf("want completed, replayed %t; got %s, replayed %t", replayed, res.Status, res.Replayed)
				}
				if err != nil {
					errs <- fmt.Errorf("submit %d: %w", i, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	took := time.Since(start)
	close(errs)
	return took, <-errs
}

// latency offers unique intents at a fixed rate (open loop) and reports
// submit-to-answer latency from each intent's scheduled send time.
func (b *bench) latency(ctx context.Context) error {
	rate := b.cfg.Rate
	if rate == 0 {
		unique, ok := b.rowOps("unique")
		if !ok {
			return errors.New("no unique rate to take half of: run the unique scenario too, or set -rate")
		}
		rate = unique / 2
	}
	n := max(int(rate*b.cfg.LatencyFor.Seconds()), 1)
	e, err := startEnv(b.cfg.StoreDir, b.cfg.Cluster, b.cfg.TCP, b.cfg.Sync)
	if err != nil {
		return err
	}
	defer e.close()
	run, err := b.prepare(ctx, e, "latency", n, n, b.ledgerBatch(e.sync))
	if err != nil {
		return err
	}
	g, data, keys, p := run.g, run.data, run.keys, run.p
	defer func() { _ = g.stop() }()
	var lat []time.Duration
	var sent time.Duration
	cpu, err := b.measure("latency", func() error {
		var err error
		lat, sent, err = p.openLoop(ctx, idemBatch(g.names, data, keys), rate, expect(false))
		return err
	})
	if err != nil {
		return err
	}
	slices.Sort(lat)
	r := &b.res
	r.rate, r.haveLatency = float64(n)/sent.Seconds(), true
	r.p50, r.p90, r.p99, r.pmax = percentile(lat, .50), percentile(lat, .90), percentile(lat, .99), lat[len(lat)-1]
	b.add(row{name: "latency", ops: r.rate, cpu: cpu / time.Duration(n), ref: "unique",
		detail: fmt.Sprintf("%d intents, open loop at %.0f/s: p50 %s p90 %s p99 %s max %s", n, rate,
			ms(r.p50), ms(r.p90), ms(r.p99), ms(r.pmax)),
		extra: []float64{r.p50.Seconds(), r.p90.Seconds(), r.p99.Seconds(), r.pmax.Seconds()}})
	return g.stop()
}

// fsync measures, on a store that syncs before every acknowledgement, the raw
// rate of N kv.Create with the workers' total concurrency, then the unique
// run.
func (b *bench) fsync(ctx context.Context) error {
	e, err := startEnv(b.cfg.StoreDir, b.cfg.Cluster, b.cfg.TCP, natsrv.SyncAlways)
	if err != nil {
		return err
	}
	defer e.close()
	nc, err := e.connect("bench-kv")
	if err != nil {
		return err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	kv, err := dedup.EnsureBucket(ctx, js, dedup.BucketConfig{Bucket: "BENCH_KV", Replicas: e.replicas})
	if err != nil {
		return err
	}
	now := time.Now().UTC()
	value, err := json.Marshal(dedup.Record{
		Status: intent.StatusPending, Tool: benchTool, Fingerprint: strings.Repeat("f", 64),
		Holder: "bench-1", LeaseUntil: now.Add(30 * time.Second), Attempt: 1, IntentSeq: 1,
		CreatedAt: now, UpdatedAt: now,
	})
	if err != nil {
		return err
	}
	conc := b.cfg.Concurrency * b.cfg.Workers
	var next atomic.Int64
	var took time.Duration
	cpu, err := b.measure("kvcreate-always", func() error {
		start := time.Now()
		var wg sync.WaitGroup
		errs := make(chan error, conc)
		for range conc {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					i := next.Add(1)
					if i > int64(b.cfg.FsyncN) {
						return
					}
					if _, err := kv.Create(ctx, "bench."+strconv.FormatInt(i, 10), value); err != nil {
						errs <- err
						return
					}
				}
			}()
		}
		wg.Wait()
		took = time.Since(start)
		close(errs)
		return <-errs
	})
	if err != nil {
		return fmt.Errorf("kv create: %w", err)
	}
	b.add(row{name: "kvcreate-always", ops: float64(b.cfg.FsyncN) / took.Seconds(), cpu: cpu / time.Duration(b.cfg.FsyncN),
		detail: fmt.Sprintf("%d kv.Create, %d at once, in %s", b.cfg.FsyncN, conc, took.Round(time.Millisecond))})
	_, err = b.runUnique(ctx, e, "unique-always", "kvcreate-always", b.cfg.FsyncN, false)
	return err
}

// durableModes are the store settings the durable scenario sets side by side.
var durableModes = []durableMode{
	{name: "durable-unbatched", sync: natsrv.SyncAlways},
	{name: "durable-batched", sync: natsrv.SyncAlways, batch: 500, ref: "durable-unbatched"},
	{name: "lazy", sync: natsrv.SyncLazy},
	{name: "lazy-batched", sync: natsrv.SyncLazy, batch: 500, ref: "lazy"},
	{name: "sync-10ms", sync: "10ms"},
}

// durableMode is a row of the durable scenario: a store sync setting and the
// workers' ledger batch (0: off); ref names the row it is compared with.
type durableMode struct {
	name, sync string
	batch      int
	ref        string
}

// durable runs FsyncN unique intents under each store setting — sync before
// every acknowledgement with the ledger's writes one by one and
// group-committed, the server's lazy default with and without group commit,
// and a 10 ms sync interval — at each of DurableInflight intents in flight,
// and reports the rate and each intent's latency (publish to answer) at p50
// and p99. Each round starts with the baseline's messaging at sync always:
// the intent's publish and ack are durable writes too, whatever the ledger
// does.
func (b *bench) durable(ctx context.Context) error {
	for _, inflight := range b.cfg.DurableInflight {
		// The ceiling: the same messaging, durable, without a ledger.
		e, err := startEnv(b.cfg.StoreDir, b.cfg.Cluster, b.cfg.TCP, natsrv.SyncAlways)
		if err != nil {
			return err
		}
		_, err = b.runBaseline(ctx, e, fmt.Sprintf("baseline-always@%d", inflight), b.cfg.FsyncN, inflight)
		e.close()
		if err != nil {
			return fmt.Errorf("baseline-always at %d in flight: %w", inflight, err)
		}
		for _, m := range durableModes {
			if err := b.durableRun(ctx, m, inflight); err != nil {
				return fmt.Errorf("%s at %d in flight: %w", m.name, inflight, err)
			}
		}
		if err := b.durableHalf(ctx, durableModes[1], inflight); err != nil {
			return fmt.Errorf("%s at half load: %w", durableModes[1].name, err)
		}
	}
	return nil
}

// durableHalf offers intents to mode m's setting in an open loop at half the
// rate its closed loop at inflight reached, for LatencyFor, and reports each
// intent's latency (publish to answer): what a user sees below saturation.
func (b *bench) durableHalf(ctx context.Context, m durableMode, inflight int) error {
	peak, ok := b.rowOps(fmt.Sprintf("%s@%d", m.name, inflight))
	if !ok {
		return errors.New("no closed-loop rate to take half of")
	}
	rate := peak / 2
	name := fmt.Sprintf("%s-half@%d", m.name, inflight)
	n := max(int(rate*b.cfg.LatencyFor.Seconds()), 1)
	res, err := b.durableLoad(ctx, m, name, n, n, func(p *publisher, bt batch) (time.Duration, []time.Duration, error) {
		lat, sent, err := p.openLoop(ctx, bt, rate, expect(false))
		return sent, lat, err
	})
	if err != nil {
		return err
	}
	b.add(row{name: name, ops: float64(n) / res.took.Seconds(), cpu: res.cpu,
		detail: fmt.Sprintf("%d intents, open loop at %.0f/s (half of %s@%d), sync %s, ledger batch %d: p50 %s p99 %s%s",
			n, rate, m.name, inflight, m.sync, m.batch, ms(res.p50), ms(res.p99), batchDetail(res.batch)),
		extra: []float64{res.p50.Seconds(), res.p99.Seconds()}})
	return nil
}

func (b *bench) durableRun(ctx context.Context, m durableMode, inflight int) error {
	name, n := fmt.Sprintf("%s@%d", m.name, inflight), b.cfg.FsyncN
	res, err := b.durableLoad(ctx, m, name, n, inflight, func(p *publisher, bt batch) (time.Duration, []time.Duration, error) {
		return p.closedLoopLatency(ctx, bt, inflight, expect(false))
	})
	if err != nil {
		return err
	}
	ref := ""
	if m.ref != "" {
		ref = fmt.Sprintf("%s@%d", m.ref, inflight)
	}
	b.add(row{name: name, ops: float64(n) / res.took.Seconds(), cpu: res.cpu, ref: ref,
		detail: fmt.Sprintf("%d intents, %d in flight, sync %s, ledger batch %d: p50 %s p99 %s%s",
			n, inflight, m.sync, m.batch, ms(res.p50), ms(res.p99), batchDetail(res.batch)),
		extra: []float64{res.p50.Seconds(), res.p99.Seconds()}})
	return nil
}

// durableLoad runs n unique intents named name through workers set up as m
// says (a fresh store with its sync policy, its ledger batch), with a
// publisher keeping up to inflight unanswered, by load, which returns the
// time it took and each intent's latency.
func (b *bench) durableLoad(ctx context.Context, m durableMode, name string, n, inflight int,
	load func(p *publisher, bt batch) (time.Duration, []time.Duration, error)) (loadResult, error) {
	e, err := startEnv(b.cfg.StoreDir, b.cfg.Cluster, b.cfg.TCP, m.sync)
	if err != nil {
		return loadResult{}, err
	}
	defer e.close()
	r, err := b.prepare(ctx, e, name, n, inflight, m.batch)
	if err != nil {
		return loadResult{}, err
	}
	g := r.g
	defer func() { _ = g.stop() }()
	var res loadResult
	cpu, err := b.measure(name, func() error {
		var err error
		res.took, res.lat, err = load(r.p, idemBatch(g.names, r.data, r.keys))
		return err
	})
	if err != nil {
		return loadResult{}, err
	}
	slices.Sort(res.lat)
	res.p50, res.p99 = percentile(res.lat, .50), percentile(res.lat, .99)
	res.cpu = cpu / time.Duration(n)
	res.batch = g.batchStats()
	return res, g.stop()
}

// loadResult is what durableLoad measured.
type loadResult struct {
	took     time.Duration   // as load reported it
	lat      []time.Duration // each intent's, sorted
	p50, p99 time.Duration
	cpu      time.Duration // per intent
	batch    dedup.BatchStats
}

// memNow returns HeapInuse after a GC and the process's VmRSS, in bytes.
func memNow() (heap, rss uint64) {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse, vmRSS()
}

func vmRSS() uint64 {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for line := range strings.Lines(string(data)) {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			f := strings.Fields(rest)
			if len(f) >= 1 {
				kb, _ := strconv.ParseUint(f[0], 10, 64)
				return kb << 10
			}
		}
	}
	return 0
}

// shorten makes every scenario small: the short mode checks that the bench
// works, in seconds.
func (c *config) shorten() {
	c.N = min(c.N, 300)
	c.FsyncN = min(c.FsyncN, 200)
	c.DurableInflight = []int{64}
	c.Inflight = min(c.Inflight, 128)
	c.LatencyFor = min(c.LatencyFor, 500*time.Millisecond)
	c.MemInflight = min(c.MemInflight, 500)
}
