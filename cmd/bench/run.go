package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/pprof"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nuid"
)

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
	stages                  []stageFigures // latency: where the time went
	gcs                     uint32         // latency: collections during the run
	gcPauseMax              time.Duration
	heap, rss, heap0, rss0  uint64 // memory: with MemInflight in flight, and idle
	stacks                  uint64
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
	if !cfg.WorkerInProcess && !cfg.TCP {
		mode += " (workers over TCP loopback)"
	}
	topo := "1 server, R1"
	if cfg.Cluster {
		topo = "3-node cluster, R3"
	}
	fmt.Fprintf(out, "idemgate bench: n=%d inflight=%d concurrency=%d workers=%d payload=%dB %s, %s, sync %s; GOMAXPROCS=%d NumCPU=%d\n",
		cfg.N, cfg.Inflight, cfg.Concurrency, cfg.Workers, cfg.Payload, mode, topo, cfg.Sync, runtime.GOMAXPROCS(0), runtime.NumCPU())
	fmt.Fprintf(out, "load average at start: %s\n", loadAvg())

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
		if cfg.wants("audit") {
			plan = append(plan, step{"audit", b.auditCost})
		}
	}
	for _, s := range []step{{"dup-large", b.dupLarge}, {"client", b.client}, {"latency", b.latency}, {"durable", b.durable}, {"memory", b.memory}} {
		if cfg.wants(s.name) {
			plan = append(plan, s)
		}
	}
	for _, s := range plan {
		var sctx context.Context
		var cancel context.CancelFunc
		if s.name == "durable" || s.name == "dup-large" {
			sctx, cancel = context.WithCancel(ctx) // its rows are bounded one by one
		} else {
			sctx, cancel = context.WithTimeout(ctx, cfg.Timeout)
		}
		err := s.fn(sctx)
		cancel()
		if err != nil {
			return b, fmt.Errorf("%s: %w", s.name, err)
		}
	}
	fmt.Fprintf(out, "load average at end: %s\n", loadAvg())
	b.print()
	return b, nil
}

// loadAvg is the machine's load average over 1, 5 and 15 minutes.
func loadAvg() string {
	la, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	return strings.Join(strings.Fields(string(la))[:3], " ")
}

// profile starts the CPU profile of row name, if asked; the returned
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

// measure runs fn under row name's profiles and returns the CPU time the
// whole process (servers, workers, publisher) used meanwhile.
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
