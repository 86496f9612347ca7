package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemgate/idemgate/pkg/client"
)

// runChaos runs one chaos run and returns its verdict. An error means the run
// could not be carried out (not that the system misbehaved).
//
// A run has five phases: set-up (the work directory, JetStream, the sink,
// the workers, the driver's connection and the plan), load (every
// operation's copies published and answered), faults (injected while the
// load runs), settle (every copy still without an answer gets it from the
// ledger; every record must be final), and judge (everything stopped, the
// logs reconciled into a verdict).
func runChaos(ctx context.Context, cfg config, logw io.Writer) (*Verdict, error) {
	r := &chaosRun{cfg: cfg, began: time.Now(), logw: logw}
	defer r.tearDown()
	if err := r.setUp(ctx); err != nil {
		return nil, err
	}
	if err := r.load(ctx); err != nil {
		return nil, err
	}
	notFinal := r.settle(ctx)
	return r.judge(notFinal)
}

// chaosRun is one run's processes and what its phases share.
type chaosRun struct {
	cfg   config
	began time.Time
	logw  io.Writer
	dir   string
	keep  bool // keep the work directory when the run ends
	mode  string

	nodes    []*natsNode
	natsURL  string
	sink     *proc
	sinkAddr string
	sinkLog  string

	sups        []*supervisor
	stopWorkers context.CancelFunc
	swg         sync.WaitGroup

	nc        *nats.Conn
	js        jetstream.JetStream
	loader    *loader
	ops       []*op
	asyncMu   sync.Mutex
	asyncErrs map[string]int // the driver connection's asynchronous errors, by kind

	evMu        sync.Mutex
	events      []event    // the injected faults
	nodeMu      sync.Mutex // one node fault at a time
	killsPaused atomic.Bool
	// powerLossDone is the power loss, once it happened (under evMu).
	powerLossDone *PowerLoss
	// machineDown is held by a single node's power loss: no worker starts
	// while the machine is down.
	machineDown sync.RWMutex
}

func (r *chaosRun) logf(format string, a ...any) {
	fmt.Fprintf(r.logw, "%s chaos: %s\n", time.Now().Format("15:04:05.000"), fmt.Sprintf(format, a...))
}

// setUp makes the work directory and starts JetStream, the sink and the
// workers, then connects the driver and plans the load.
func (r *chaosRun) setUp(ctx context.Context) error {
	r.mode = "single"
	if r.cfg.cluster {
		r.mode = "cluster"
	}
	r.keep = r.cfg.keep
	r.dir = r.cfg.workDir
	if r.dir == "" {
		dir, err := os.MkdirTemp("", "idemgate-chaos-")
		if err != nil {
			return err
		}
		r.dir = dir
	} else if err := os.MkdirAll(r.dir, 0o755); err != nil {
		return err
	}
	if r.cfg.powerLossAt >= 0 {
		if err := checkDiskBacked(r.dir); err != nil {
			return err
		}
	}
	if r.cfg.natsServer == "" {
		r.logf("building nats-server")
		var err error
		if r.cfg.natsServer, err = buildNATSServer(ctx, r.dir); err != nil {
			return err
		}
	}
	for _, step := range []func(context.Context) error{r.startJetStream, r.startSink, r.startWorkers, r.connect} {
		if err := step(ctx); err != nil {
			return err
		}
	}
	return nil
}

// tearDown stops whatever is still running and removes the work directory
// unless it is kept.
func (r *chaosRun) tearDown() {
	if r.nc != nil {
		r.nc.Close()
	}
	r.stopAllWorkers()
	if r.sink != nil {
		r.sink.stop(10 * time.Second)
	}
	for _, n := range r.nodes {
		if n != nil {
			n.stop(10 * time.Second)
		}
	}
	if r.dir == "" {
		return
	}
	if r.keep {
		r.logf("work directory kept: %s", r.dir)
		return
	}
	_ = os.RemoveAll(r.dir)
}

func (r *chaosRun) startJetStream(ctx context.Context) error {
	nodes, err := startJetStream(ctx, r.cfg, r.dir)
	r.nodes = nodes
	if err != nil {
		return err
	}
	urls := make([]string, len(nodes))
	for i, n := range nodes {
		urls[i] = n.url()
	}
	r.natsURL = strings.Join(urls, ",")
	r.logf("%s JetStream up: %s (sync %s)", r.mode, r.natsURL, r.cfg.sync)
	return nil
}

// startSink starts the webhook sink and waits until it answers.
func (r *chaosRun) startSink(ctx context.Context) error {
	ports, err := freePorts(1)
	if err != nil {
		return err
	}
	addr := fmt.Sprintf("127.0.0.1:%d", ports[0])
	r.sinkAddr = addr
	r.sinkLog = filepath.Join(r.dir, "sink.jsonl")
	r.sink = &proc{name: "sink", path: filepath.Join(r.cfg.binDir, "sink"), log: filepath.Join(r.dir, "sink.log"), args: []string{
		"--listen", addr, "--log", r.sinkLog,
		"--fail-rate", fmt.Sprint(r.cfg.failRate), "--hang-rate", fmt.Sprint(r.cfg.hangRate), "--hang", r.cfg.hang.String(),
	}}
	if err := r.sink.start(); err != nil {
		return err
	}
	if err := waitHTTP(ctx, "http://"+addr+"/stats", r.sink, 20*time.Second); err != nil {
		return err
	}
	return nil
}

// toolsFile is the workers' tools file: chaos_op, and the capped and the
// probed tool when a share of the operations goes to each. All are webhooks
// to the sink; the probed tool's probe asks the sink by key.
func (r *chaosRun) toolsFile() string {
	var b strings.Builder
	b.WriteString("tools:\n")
	tool := func(name, path, extra string) {
		// key_args: all: the load derives each operation's key from all its
		// args (load.go), as the workers must.
		fmt.Fprintf(&b, `  %s:
    effect: webhook
    key_args: all
    lease: %s
%s    webhook:
      url: http://%s/%s
      allow_private: [127.0.0.1/32]
      timeout: %s
      retry: {max_attempts: 3, initial_interval: 20ms, max_interval: 200ms}
`, name, r.cfg.lease, extra, r.sinkAddr, path, r.cfg.hang+10*time.Second)
	}
	tool(toolName, "ops", "")
	if r.cfg.cappedShare > 0 {
		tool(cappedTool, "capped", "    max_in_flight: 1\n")
	}
	if r.cfg.probedShare > 0 {
		tool(probedTool, "probed", fmt.Sprintf("    probe: {url: \"http://%s/probe?key={key}\", timeout: 5s}\n", r.sinkAddr))
	}
	return b.String()
}

// toolCaps are the tools' max_in_flight, for the capped ones.
func (r *chaosRun) toolCaps() map[string]int {
	if r.cfg.cappedShare > 0 {
		return map[string]int{cappedTool: 1}
	}
	return nil
}

// startWorkers writes the tools file and starts the supervised workers, one
// at a time: the first creates the stream, consumer and bucket alone. Every
// start of a worker is a holder of its own name (see supervisor).
func (r *chaosRun) startWorkers(ctx context.Context) error {
	cfg := r.cfg
	tools := filepath.Join(r.dir, "tools.yaml")
	if err := os.WriteFile(tools, []byte(r.toolsFile()), 0o644); err != nil {
		return err
	}
	replicas := "1"
	if cfg.cluster {
		replicas = "3"
	}
	spawn := func(holder string) *proc {
		return &proc{name: holder, path: filepath.Join(cfg.binDir, "worker"), log: filepath.Join(r.dir, holder+".log"),
			args: []string{
				"--nats-url", r.natsURL, "--holder", holder, "--tools", tools, "--replicas", replicas,
				"--ack-wait", cfg.ackWait.String(), "--dup-window", cfg.dupWindow.String(),
				"--concurrency", fmt.Sprint(cfg.concurrency), "--ledger-partitions", fmt.Sprint(cfg.partitions), "--retry-delay", "200ms", "--max-retry-delay", "2s",
				"--drain-timeout", "5s", "--log-level", "info",
			}}
	}
	durability := cfg.workerDurabilityArgs()
	if len(durability) > 0 {
		base := spawn
		spawn = func(holder string) *proc {
			p := base(holder)
			p.args = append(p.args, durability...)
			return p
		}
	}
	wctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	r.stopWorkers = stop
	r.sups = make([]*supervisor, cfg.workers)
	for i := range r.sups {
		s := &supervisor{name: fmt.Sprintf("w%d", i+1), delay: 500 * time.Millisecond, spawn: spawn, hold: &r.machineDown}
		r.sups[i] = s
		r.swg.Add(1)
		go func() {
			defer r.swg.Done()
			if err := s.run(wctx); err != nil {
				r.logf("worker %s: %v", s.name, err)
			}
		}()
		if err := waitLog(ctx, s, "worker consuming", 60*time.Second); err != nil {
			return err
		}
	}
	r.logf("%d workers consuming; sink on %s", cfg.workers, r.sinkAddr)
	return nil
}

// stopAllWorkers stops the supervisors and their workers.
func (r *chaosRun) stopAllWorkers() {
	if r.stopWorkers == nil {
		return
	}
	r.stopWorkers()
	for _, s := range r.sups {
		if s != nil {
			s.stop(10 * time.Second)
		}
	}
	r.swg.Wait()
	for _, s := range r.sups { // one may have been started while stopping
		if s != nil {
			s.stop(10 * time.Second)
		}
	}
}

// connect connects the driver to JetStream and plans the load.
func (r *chaosRun) connect(context.Context) error {
	nc, err := nats.Connect(r.natsURL, nats.Name("idemgate-chaos"), nats.MaxReconnects(-1),
		nats.ReconnectWait(100*time.Millisecond), nats.Timeout(5*time.Second), nats.ErrorHandler(r.asyncError))
	if err != nil {
		return fmt.Errorf("connect %s: %w", r.natsURL, err)
	}
	r.nc = nc
	// The client learns each tool from the workers' catalogue, as callers'
	// clients do: its key spec, and its lease, which the retry rule waits
	// out before it publishes again an intent whose holder died with it.
	cl, err := client.New(nc)
	if err != nil {
		return err
	}
	if r.js, err = jetstream.New(nc); err != nil {
		return err
	}
	session := fmt.Sprintf("chaos-%d", r.cfg.seed)
	if r.ops, err = plan(r.cfg, session, newRand(r.cfg.seed)); err != nil {
		return err
	}
	r.loader = &loader{cfg: r.cfg, session: session, nc: nc, js: r.js, cl: cl}
	r.logf("load: %d operations, %d intents planned", len(r.ops), planned(r.ops))
	return nil
}

// asyncError notes an asynchronous error of the driver's connection (during
// an outage, one per ledger watch): the first of each kind is logged, the
// rest counted.
func (r *chaosRun) asyncError(_ *nats.Conn, _ *nats.Subscription, err error) {
	msg := err.Error()
	if i := strings.Index(msg, " for subscription on "); i >= 0 {
		msg = msg[:i]
	}
	r.asyncMu.Lock()
	defer r.asyncMu.Unlock()
	if r.asyncErrs == nil {
		r.asyncErrs = map[string]int{}
	}
	if r.asyncErrs[msg]++; r.asyncErrs[msg] == 1 {
		r.logf("connection: %s (repeats are counted)", msg)
	}
}

// load publishes every operation's copies and waits for their answers, with
// the faults injected meanwhile.
func (r *chaosRun) load(ctx context.Context) error {
	if r.cfg.powerLossAt >= 0 {
		if err := r.syncStores(); err != nil {
			return err
		}
	}
	stopFaults := r.startFaults(ctx)
	r.loader.run(ctx, r.ops)
	stopFaults()
	l := r.loader
	r.asyncMu.Lock()
	r.logf("load done: %d published, %d answered in %.0fs; connection errors %v", l.published.Load(), l.answered.Load(), time.Since(r.began).Seconds(), r.asyncErrs)
	r.asyncMu.Unlock()
	if ctx.Err() != nil {
		return fmt.Errorf("run timed out during the load: %w", ctx.Err())
	}
	return nil
}

// settle gives every copy still without an answer its answer from the
// ledger, then reads every operation's record: it returns the records not
// final, by status.
func (r *chaosRun) settle(ctx context.Context) map[string]int {
	sctx, cancel := context.WithTimeout(ctx, r.cfg.settle)
	settled, open := r.loader.settle(sctx, r.ops)
	cancel()
	r.logf("settled %d copies from the ledger, %d still open", settled, open)
	gctx, cancel := context.WithTimeout(ctx, r.cfg.settle)
	defer cancel()
	return r.loader.ledgerCheck(gctx, r.ops)
}

// judge stops every process, so that the logs are complete, and reconciles
// them with the answers into the verdict.
func (r *chaosRun) judge(notFinal map[string]int) (*Verdict, error) {
	r.stopAllWorkers()
	r.sink.stop(10 * time.Second)
	reqs, err := readSinkLog(r.sinkLog)
	if err != nil {
		return nil, err
	}
	l := r.loader
	v := &Verdict{Mode: r.mode, Seed: r.cfg.seed, PublishDuplicate: int(l.dups.Load()), PublishRetries: int(l.retries.Load()),
		Republished: int(l.republish.Load()), FaultsByKind: map[string]int{}, LedgerNotFinal: notFinal, PublishErrors: l.pubErrors,
		DurabilityDeclared: r.cfg.declaredDurability()}
	dur := durabilityFacts{replicas: r.cfg.replicas()}
	for _, n := range r.nodes {
		b, err := os.ReadFile(n.conf)
		if err != nil {
			return nil, err
		}
		dur.serverConfs = append(dur.serverConfs, string(b))
	}
	var logs []workerLog
	for _, s := range r.sups {
		v.WorkerCrashes += s.unexpectedExits()
		for _, wl := range s.logs() {
			v.LeaseTakeovers += countLines(wl.path, leaseTakenOverLine)
			logs = append(logs, wl)
			if p := loggedPersist(wl.path); p != "" {
				dur.persist = append(dur.persist, p)
			}
		}
		dur.workerArgs = append(dur.workerArgs, s.args()...)
	}
	r.evMu.Lock()
	judge(v, runFacts{ops: r.ops, reqs: reqs, events: r.events, leases: readLeaseLog(logs),
		concurrency: r.cfg.concurrency, caps: r.toolCaps(), allowOutage: r.cfg.allowOutage,
		durability: dur, powerLoss: r.powerLossDone, powerLossWanted: r.cfg.powerLossAt >= 0})
	r.evMu.Unlock()
	v.DurationSeconds = time.Since(r.began).Seconds()
	if !v.OK {
		r.keep = true
	}
	if r.keep {
		// For a post-mortem: the faults, every repeat and every record not
		// final, next to the logs.
		type notFinal struct {
			Op     string `json:"op"`
			Key    string `json:"key"`
			Status string `json:"status"`
			Holder string `json:"holder,omitempty"`
		}
		var nf []notFinal
		for _, o := range r.ops {
			if o.notFinal != "" {
				nf = append(nf, notFinal{o.id, o.key, o.notFinal, o.recordHolder})
			}
		}
		// Delayed copies publish dedup still caught: when each copy was
		// acknowledged, next to the faults in events.json.
		type deduped struct {
			Op     string    `json:"op"`
			First  time.Time `json:"first_acked"`
			Second time.Time `json:"second_acked"`
		}
		var dd []deduped
		for _, o := range r.ops {
			if o.kind == kindDelayed && len(o.copies) > 1 && o.copies[1].Duplicate {
				dd = append(dd, deduped{o.id, o.copies[0].Acked, o.copies[1].Acked})
			}
		}
		for name, x := range map[string]any{"events.json": r.events, "repeats.json": v.repeats, "not_final.json": nf, "delayed_deduplicated.json": dd} {
			if b, err := json.MarshalIndent(x, "", "  "); err == nil {
				_ = os.WriteFile(filepath.Join(r.dir, name), b, 0o644)
			}
		}
	}
	return v, nil
}

func planned(ops []*op) int {
	n := 0
	for _, o := range ops {
		n += len(o.copies)
	}
	return n
}

// waitHTTP waits until url answers 200.
func waitHTTP(ctx context.Context, url string, p *proc, d time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s did not answer on %s within %s (see %s)", p.name, url, d, p.log)
		case <-p.exited():
			return fmt.Errorf("%s exited (see %s)", p.name, p.log)
		case <-t.C:
		}
	}
}

// waitLog waits until the log of s's current start holds line.
func waitLog(ctx context.Context, s *supervisor, line string, d time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		p := s.current()
		if p != nil {
			if b, err := os.ReadFile(p.log); err == nil && bytes.Contains(b, []byte(line)) {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			where := s.name
			if p != nil {
				where = p.log
			}
			return fmt.Errorf("%s did not log %q within %s (see %s)", s.name, line, d, where)
		case <-t.C:
		}
	}
}

func countLines(path, s string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	return bytes.Count(b, []byte(s))
}
