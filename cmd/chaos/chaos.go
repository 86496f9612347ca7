package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemgate/idemgate/pkg/client"
	"github.com/idemgate/idemgate/pkg/intent"
)

// runChaos runs one chaos run and returns its verdict. An error means the run
// could not be carried out (not that the system misbehaved).
func runChaos(ctx context.Context, cfg config, logw io.Writer) (*Verdict, error) {
	began := time.Now()
	logf := func(format string, a ...any) {
		fmt.Fprintf(logw, "%s chaos: %s\n", time.Now().Format("15:04:05.000"), fmt.Sprintf(format, a...))
	}
	dir := cfg.workDir
	if dir == "" {
		var err error
		if dir, err = os.MkdirTemp("", "idemgate-chaos-"); err != nil {
			return nil, err
		}
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	keep := cfg.keep
	defer func() {
		if keep {
			logf("work directory kept: %s", dir)
			return
		}
		_ = os.RemoveAll(dir)
	}()
	if cfg.natsServer == "" {
		logf("building nats-server")
		var err error
		if cfg.natsServer, err = buildNATSServer(ctx, dir); err != nil {
			return nil, err
		}
	}
	rng := newRand(cfg.seed)
	mode := "single"
	if cfg.cluster {
		mode = "cluster"
	}

	// JetStream.
	nodes, err := startJetStream(ctx, cfg, dir)
	defer func() {
		for _, n := range nodes {
			if n != nil {
				n.stop(10 * time.Second)
			}
		}
	}()
	if err != nil {
		return nil, err
	}
	urls := make([]string, len(nodes))
	for i, n := range nodes {
		urls[i] = n.url()
	}
	natsURL := strings.Join(urls, ",")
	logf("%s JetStream up: %s (sync %s)", mode, natsURL, cfg.sync)

	// The sink.
	ports, err := freePorts(1)
	if err != nil {
		return nil, err
	}
	sinkAddr := fmt.Sprintf("127.0.0.1:%d", ports[0])
	sinkLog := filepath.Join(dir, "sink.jsonl")
	sink := &proc{name: "sink", path: filepath.Join(cfg.binDir, "sink"), log: filepath.Join(dir, "sink.log"), args: []string{
		"--listen", sinkAddr, "--log", sinkLog,
		"--fail-rate", fmt.Sprint(cfg.failRate), "--hang-rate", fmt.Sprint(cfg.hangRate), "--hang", cfg.hang.String(),
	}}
	if err := sink.start(); err != nil {
		return nil, err
	}
	defer sink.stop(10 * time.Second)
	if err := waitHTTP(ctx, "http://"+sinkAddr+"/stats", sink, 20*time.Second); err != nil {
		return nil, err
	}

	// The workers.
	tools := filepath.Join(dir, "tools.yaml")
	if err := os.WriteFile(tools, []byte(fmt.Sprintf(`tools:
  %s:
    effect: webhook
    lease: %s
    webhook:
      url: http://%s/ops
      allow_private: [127.0.0.1/32]
      timeout: %s
      retry: {max_attempts: 3, initial_interval: 20ms, max_interval: 200ms}
`, toolName, cfg.lease, sinkAddr, cfg.hang+10*time.Second)), 0o644); err != nil {
		return nil, err
	}
	replicas := "1"
	if cfg.cluster {
		replicas = "3"
	}
	wctx, stopWorkers := context.WithCancel(context.WithoutCancel(ctx))
	defer stopWorkers()
	sups := make([]*supervisor, cfg.workers)
	var swg sync.WaitGroup
	stopAll := func() {
		stopWorkers()
		for _, s := range sups {
			if s != nil {
				s.p.stop(10 * time.Second)
			}
		}
		swg.Wait()
		for _, s := range sups { // one may have been started while stopping
			if s != nil {
				s.p.stop(10 * time.Second)
			}
		}
	}
	defer stopAll()
	for i := range sups {
		name := fmt.Sprintf("w%d", i+1)
		sups[i] = &supervisor{delay: 500 * time.Millisecond, p: &proc{
			name: name, path: filepath.Join(cfg.binDir, "worker"), log: filepath.Join(dir, name+".log"),
			args: []string{
				"--nats-url", natsURL, "--holder", name, "--tools", tools, "--replicas", replicas,
				"--ack-wait", cfg.ackWait.String(), "--dup-window", cfg.dupWindow.String(),
				"--concurrency", fmt.Sprint(cfg.concurrency), "--ledger-batch", fmt.Sprint(cfg.ledgerBatch), "--retry-delay", "200ms", "--max-retry-delay", "2s",
				"--drain-timeout", "5s", "--log-level", "info",
			},
		}}
		swg.Add(1)
		go func() {
			defer swg.Done()
			if err := sups[i].run(wctx); err != nil {
				logf("worker %s: %v", name, err)
			}
		}()
		// The first worker creates the stream, consumer and bucket alone.
		if err := waitLog(ctx, sups[i].p, "worker consuming", 60*time.Second); err != nil {
			return nil, err
		}
	}
	logf("%d workers consuming; sink on %s", cfg.workers, sinkAddr)

	// The load.
	nc, err := nats.Connect(natsURL, nats.Name("idemgate-chaos"), nats.MaxReconnects(-1),
		nats.ReconnectWait(100*time.Millisecond), nats.Timeout(5*time.Second))
	if err != nil {
		return nil, fmt.Errorf("connect %s: %w", natsURL, err)
	}
	defer nc.Close()
	cl, err := client.New(nc, client.WithKeySpec(toolName, intent.KeySpec{}))
	if err != nil {
		return nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	session := fmt.Sprintf("chaos-%d", cfg.seed)
	ops, err := plan(cfg, session, rng)
	if err != nil {
		return nil, err
	}
	l := &loader{cfg: cfg, session: session, nc: nc, js: js, cl: cl, subject: cl.Names().IntentSubject(toolName)}
	logf("load: %d operations, %d intents planned", len(ops), planned(ops))

	var (
		evMu   sync.Mutex
		events []event
	)
	record := func(e event) {
		evMu.Lock()
		events = append(events, e)
		evMu.Unlock()
		logf("fault: %s %s", e.Kind, e.Target)
	}
	fctx, stopFaults := context.WithCancel(ctx)
	var fwg sync.WaitGroup
	if cfg.killEvery > 0 {
		fwg.Add(1)
		go func() {
			defer fwg.Done()
			killWorkers(fctx, cfg, sups, rand.New(rand.NewPCG(cfg.seed+1, 7)), record)
		}()
	}
	if cfg.restartAt >= 0 {
		fwg.Add(1)
		go func() {
			defer fwg.Done()
			if err := restartJetStream(fctx, ctx, cfg, nodes, js, l, record); err != nil {
				logf("JetStream restart: %v", err)
			}
		}()
	}
	if cfg.progressEach > 0 {
		fwg.Add(1)
		go func() {
			defer fwg.Done()
			t := time.NewTicker(cfg.progressEach)
			defer t.Stop()
			for {
				select {
				case <-fctx.Done():
					return
				case <-t.C:
					logf("progress: %d published, %d answered, %d publish retries, %.0fs",
						l.published.Load(), l.answered.Load(), l.retries.Load(), time.Since(began).Seconds())
				}
			}
		}()
	}
	l.run(ctx, ops)
	stopFaults()
	fwg.Wait()
	logf("load done: %d published, %d answered in %.0fs", l.published.Load(), l.answered.Load(), time.Since(began).Seconds())
	if ctx.Err() != nil {
		return nil, fmt.Errorf("run timed out during the load: %w", ctx.Err())
	}

	// Every copy gets an answer, at worst from the ledger.
	sctx, cancel := context.WithTimeout(ctx, cfg.settle)
	settled, open := l.settle(sctx, ops)
	cancel()
	logf("settled %d copies from the ledger, %d still open", settled, open)
	gctx, cancel := context.WithTimeout(ctx, cfg.settle)
	notFinal := l.ledgerCheck(gctx, ops)
	cancel()

	// Stop everything so the sink's log is complete.
	stopAll()
	sink.stop(10 * time.Second)
	reqs, err := readSinkLog(sinkLog)
	if err != nil {
		return nil, err
	}
	v := &Verdict{Mode: mode, Seed: cfg.seed, LedgerBatch: cfg.ledgerBatch, PublishDuplicate: int(l.dups.Load()), PublishRetries: int(l.retries.Load()),
		FaultsByKind: map[string]int{}, LedgerNotFinal: notFinal, PublishErrors: l.pubErrors}
	var logs []string
	for _, s := range sups {
		_, crashes := s.counts()
		v.WorkerCrashes += crashes
		v.LeaseTakeovers += countLines(s.p.log, "lease taken over")
		logs = append(logs, s.p.log)
	}
	leases := readLeaseLog(logs)
	v.LiveLeaseLosses = len(leases.lost)
	evMu.Lock()
	judge(v, ops, reqs, events, leases, cfg.allowOutage)
	evMu.Unlock()
	v.DurationSeconds = time.Since(began).Seconds()
	if !v.OK {
		keep = true
	}
	if keep {
		// For a post-mortem: the faults and every repeat, next to the logs.
		for name, x := range map[string]any{"events.json": events, "repeats.json": v.repeats} {
			if b, err := json.MarshalIndent(x, "", "  "); err == nil {
				_ = os.WriteFile(filepath.Join(dir, name), b, 0o644)
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

// killWorkers SIGKILLs a random worker every cfg.killEvery until ctx ends
// (or cfg.maxKills is reached); its supervisor starts it again.
func killWorkers(ctx context.Context, cfg config, sups []*supervisor, rng *rand.Rand, record func(event)) {
	t := time.NewTicker(cfg.killEvery)
	defer t.Stop()
	for kills := 0; cfg.maxKills == 0 || kills < cfg.maxKills; kills++ {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		s := sups[rng.IntN(len(sups))]
		at := time.Now()
		s.kill()
		record(event{Kind: faultWorkerKill, Target: s.p.name, At: at, Until: time.Now()})
	}
}

// restartJetStream waits until cfg.restartAt of the intents are published,
// then SIGKILLs the JetStream process (with --cluster: the node leading the
// intent stream), keeps it down for cfg.downFor and starts it again on the
// same store. The restart itself runs under run, not ctx, so that a node is
// never left down.
func restartJetStream(ctx, run context.Context, cfg config, nodes []*natsNode, js jetstream.JetStream, l *loader, record func(event)) error {
	threshold := int64(cfg.restartAt * float64(cfg.intents))
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for l.published.Load() < threshold {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
	victim, kind := nodes[0], faultJetStream
	if len(nodes) > 1 {
		kind, victim = faultNode, nodes[1]
		ictx, cancel := context.WithTimeout(ctx, 5*time.Second)
		if s, err := js.Stream(ictx, l.cl.Names().Stream); err == nil && s.CachedInfo().Cluster != nil {
			for _, n := range nodes {
				if n.name == s.CachedInfo().Cluster.Leader {
					victim = n
				}
			}
		}
		cancel()
	}
	at := time.Now()
	victim.kill()
	down := time.NewTimer(cfg.downFor)
	select {
	case <-run.Done():
		down.Stop()
	case <-down.C:
	}
	if err := victim.start(); err != nil {
		return err
	}
	err := victim.ready(run, 2*time.Minute)
	l.recovered.Store(time.Now().UnixNano())
	record(event{Kind: kind, Target: victim.name, At: at, Until: time.Now()})
	return err
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

// waitLog waits until p's log holds line.
func waitLog(ctx context.Context, p *proc, line string, d time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		if b, err := os.ReadFile(p.log); err == nil && bytes.Contains(b, []byte(line)) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s did not log %q within %s (see %s)", p.name, line, d, p.log)
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
