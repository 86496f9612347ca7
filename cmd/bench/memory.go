package main

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/idemgate/idemgate/internal/worker"
	"github.com/idemgate/idemgate/pkg/effects"
	"github.com/idemgate/idemgate/pkg/effects/noop"
	"github.com/idemgate/idemgate/pkg/intent"
)

// The memory scenario runs its worker in a child process (this executable,
// re-run with these variables set) so that the worker's heap and RSS are
// read apart from the server's and the publisher's.
const (
	roleEnv       = "IDEMGATE_BENCH_ROLE"
	roleMemWorker = "memworker"
	urlEnv        = "IDEMGATE_BENCH_URL"
	inflightEnv   = "IDEMGATE_BENCH_INFLIGHT"
	delayEnv      = "IDEMGATE_BENCH_DELAY"
	batchEnv      = "IDEMGATE_BENCH_LEDGER_BATCH"
	memprofEnv    = "IDEMGATE_BENCH_MEMPROFILE"
)

// memFigures is what the worker process reports, as one JSON line.
type memFigures struct {
	Fired      int64  `json:"fired"`
	HeapInuse  uint64 `json:"heap_inuse"`
	StackInuse uint64 `json:"stack_inuse"`
	RSS        uint64 `json:"rss"`
	Goroutines int    `json:"goroutines"`
}

func readFigures(fired int64) memFigures {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return memFigures{Fired: fired, HeapInuse: ms.HeapInuse, StackInuse: ms.StackInuse, RSS: vmRSS(), Goroutines: runtime.NumGoroutine()}
}

// memWorkerMain is the child: a worker with concurrency n whose noop effect
// waits the delay. It prints "idle <figures>" once consuming, "held
// <figures>" once n effects are in flight, and stops when stdin closes.
func memWorkerMain() error {
	n, err := strconv.Atoi(os.Getenv(inflightEnv))
	if err != nil {
		return fmt.Errorf("%s: %w", inflightEnv, err)
	}
	delay, err := time.ParseDuration(os.Getenv(delayEnv))
	if err != nil {
		return fmt.Errorf("%s: %w", delayEnv, err)
	}
	batch, err := strconv.Atoi(os.Getenv(batchEnv))
	if err != nil {
		return fmt.Errorf("%s: %w", batchEnv, err)
	}
	nc, err := nats.Connect(os.Getenv(urlEnv), nats.Name("bench-mem-worker"))
	if err != nil {
		return err
	}
	defer nc.Close()
	var fired atomic.Int64
	noop, err := noop.New(noop.Config{Delay: delay})
	if err != nil {
		return err
	}
	reg, err := effects.NewRegistry(&effects.Tool{Name: benchTool, Kind: "noop", Effect: effects.EffectFunc(
		func(ctx context.Context, call effects.Call) (effects.Outcome, error) {
			fired.Add(1) // on entry: the effect is running
			return noop.Fire(ctx, call)
		})})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	setup, cancelSetup := context.WithTimeout(ctx, readyTimeout)
	defer cancelSetup()
	w, err := worker.New(setup, nc, reg, nil, worker.Config{Holder: "bench-mem", Concurrency: n, MaxAckPending: n, LedgerBatch: cmp.Or(batch, worker.NoLedgerBatch)})
	if err != nil {
		return err
	}
	stdinClosed := make(chan struct{})
	go func() { _, _ = io.Copy(io.Discard, os.Stdin); close(stdinClosed) }()
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx, 10*time.Millisecond) }()
	if err := emit("idle", readFigures(0)); err != nil {
		cancel()
		return errors.Join(err, <-done)
	}
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
wait:
	for fired.Load() < int64(n) {
		select {
		case <-t.C:
		case <-stdinClosed:
			break wait
		}
	}
	if fired.Load() >= int64(n) {
		f := readFigures(fired.Load())
		if path := os.Getenv(memprofEnv); path != "" {
			if err := writeHeapProfile(path); err != nil {
				fmt.Fprintln(os.Stderr, "bench: memory worker:", err)
			}
		}
		if err := emit("held", f); err != nil {
			fmt.Fprintln(os.Stderr, "bench: memory worker:", err)
		}
	}
	<-stdinClosed
	cancel()
	return <-done
}

func emit(tag string, f memFigures) error {
	data, err := json.Marshal(f)
	if err != nil {
		return err
	}
	_, err = fmt.Printf("%s %s\n", tag, data)
	return err
}

// memory holds MemInflight intents in flight in a worker process of its own
// (a noop effect with a long delay, concurrency and MaxAckPending at least
// MemInflight) and reads that process's heap and RSS.
func (b *bench) memory(ctx context.Context) error {
	n := b.cfg.MemInflight
	e, err := startEnv(b.cfg.StoreDir, b.cfg.Cluster, b.cfg.TCP, b.cfg.Sync)
	if err != nil {
		return err
	}
	defer e.close()
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, exe)
	cmd.Env = append(os.Environ(), roleEnv+"="+roleMemWorker, urlEnv+"="+e.servers[0].ClientURL(),
		inflightEnv+"="+strconv.Itoa(n), delayEnv+"="+b.cfg.MemDelay.String(), batchEnv+"="+strconv.Itoa(b.ledgerBatch(e.sync)))
	if b.cfg.MemProfile != "" {
		cmd.Env = append(cmd.Env, memprofEnv+"="+b.cfg.MemProfile+".memory-worker.pprof")
	}
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	lines := make(chan string)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			select {
			case lines <- sc.Text():
			case <-ctx.Done():
				return
			}
		}
	}()
	stopChild := func() error {
		_ = stdin.Close()
		// Drain until the child closes its stdout.
		for range lines {
		}
		return cmd.Wait()
	}
	idle, err := expectLine(ctx, lines, "idle")
	if err != nil {
		return errors.Join(err, stopChild())
	}
	held, err := b.holdInflight(ctx, e, n)
	if err == nil {
		held, err = expectLine(ctx, lines, "held")
	}
	if err != nil {
		return errors.Join(err, stopChild())
	}
	if err := stopChild(); err != nil {
		return fmt.Errorf("memory worker: %w", err)
	}
	r := &b.res
	r.heap, r.rss, r.heap0, r.rss0, r.stacks = held.HeapInuse, held.RSS, idle.HeapInuse, idle.RSS, held.StackInuse
	r.memInflight, r.memReached, r.haveMemory = n, int(held.Fired), true
	srvHeap, srvRSS := memNow()
	b.add(row{name: "memory", detail: fmt.Sprintf(
		"worker process, %d in flight: heap %s (idle %s), stacks %s, %d goroutines, RSS %s (idle %s); server+publisher process: heap %s, RSS %s",
		held.Fired, mib(held.HeapInuse), mib(idle.HeapInuse), mib(held.StackInuse), held.Goroutines, mib(held.RSS), mib(idle.RSS),
		mib(srvHeap), mib(srvRSS)),
		extra: []float64{float64(held.HeapInuse), float64(held.RSS)}})
	return nil
}

// holdInflight publishes n unique intents and waits until the server has
// them all (their effects then hold them in flight).
func (b *bench) holdInflight(ctx context.Context, e *env, n int) (memFigures, error) {
	data, keys, err := b.intents(n, "memory")
	if err != nil {
		return memFigures{}, err
	}
	pnc, err := e.connect("bench-publisher")
	if err != nil {
		return memFigures{}, err
	}
	p, err := newPublisher(pnc, n)
	if err != nil {
		return memFigures{}, err
	}
	names, err := intent.NewNames("")
	if err != nil {
		return memFigures{}, err
	}
	_, err = b.measure("memory", func() error {
		for _, m := range idemBatch(names, data, keys, true).msgs {
			if _, err := p.js.PublishMsgAsync(m); err != nil {
				return err
			}
		}
		select {
		case <-p.js.PublishAsyncComplete():
		case <-ctx.Done():
			return ctx.Err()
		}
		return p.err()
	})
	return memFigures{}, err
}

// expectLine waits for the child's line tagged tag and decodes its figures.
func expectLine(ctx context.Context, lines <-chan string, tag string) (memFigures, error) {
	for {
		select {
		case line, ok := <-lines:
			if !ok {
				return memFigures{}, fmt.Errorf("memory worker exited before %q", tag)
			}
			rest, found := strings.CutPrefix(line, tag+" ")
			if !found {
				continue
			}
			var f memFigures
			if err := json.Unmarshal([]byte(rest), &f); err != nil {
				return memFigures{}, fmt.Errorf("memory worker: %q: %w", line, err)
			}
			return f, nil
		case <-ctx.Done():
			return memFigures{}, fmt.Errorf("memory worker: waiting for %q: %w", tag, ctx.Err())
		}
	}
}

// memNow returns HeapInuse after a GC and the process's VmRSS, in bytes.
func memNow() (heap, rss uint64) {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse, vmRSS()
}

// vmRSS is the process's resident set size, in bytes (0 when unknown).
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
