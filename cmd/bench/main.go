// Command bench measures idemgate against a no-ledger baseline on embedded
// JetStream servers and prints one table: baseline, unique intents,
// duplicates (through the answer cache and through the ledger), the client
// library, open-loop latency by stage, the durable modes beside their
// messaging and ledger ceilings, and memory with many intents in flight;
// then whether each performance target is met. Every row counts its
// effect's executions and its answers: a missing or repeated execution, or
// an answer not asked for, fails it. See docs/performance.md.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/idemgate/idemgate/internal/natsrv"
)

func main() {
	if os.Getenv(roleEnv) == roleMemWorker {
		if err := memWorkerMain(); err != nil {
			fmt.Fprintln(os.Stderr, "bench: memory worker:", err)
			os.Exit(1)
		}
		return
	}
	if err := mainErr(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func mainErr(args []string) error {
	if len(args) > 0 && args[0] == "ledger-size" {
		return subcommand(ledgerSizeMain, args[1:])
	}
	if len(args) > 0 && args[0] == "ledger-expiry" {
		return subcommand(ledgerExpiryMain, args[1:])
	}
	if len(args) > 0 && args[0] == "cluster-ready" {
		return subcommand(clusterReadyMain, args[1:])
	}
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	var cfg config
	scenarios := fs.String("scenarios", "all", "comma-separated subset of "+strings.Join(allScenarios, ",")+" (dup runs unique first; latency needs unique or -rate)")
	fs.IntVar(&cfg.N, "n", 20000, "intents per throughput run")
	dupLargeN := fs.String("dup-large-n", "100000,1000000", "dup-large: comma-separated intents of each unique@N row, each on a fresh server (dup@N: the first only)")
	durableInflight := fs.String("durable-inflight", "64,256", "durable: comma-separated intents in flight of each round of rows")
	fs.DurationVar(&cfg.DurableFor, "durable-duration", 10*time.Second, "durable: how long each row's measured run lasts, at least (sized by a first run)")
	fs.IntVar(&cfg.DurableWarmup, "durable-warmup", 2000, "durable: intents of each row's unmeasured first run")
	pgRate := fs.String("pg-rate", "", "durable: the rates of a Postgres ledger table with fsync on measured beside (deployments/bench/pgledger.sh), by connections, as N=rate,...: e.g. 64=3615,256=2006; the durable targets compare the defaults' row at N in flight with it")
	fs.Float64Var(&cfg.RiverRate, "river-rate", 0, "unique: the jobs/s of a tuned River (unique jobs, batched inserts, fsync off) measured beside (deployments/bench/river.sh); the unique target compares the unique row with it")
	durableRows := fs.String("durable-rows", "", "durable: comma-separated rows to run, named without @N (e.g. durable,durable-async-1,baseline-always,ledger-always,durable-half); empty: all")
	fs.BoolVar(&cfg.WorkerInProcess, "worker-inprocess", false, "the workers' own connections (and the baseline handlers') in-process instead of over TCP loopback, which the embedded worker uses")
	fs.IntVar(&cfg.Inflight, "inflight", 1024, "unanswered intents the publisher keeps in flight (closed loop)")
	fs.IntVar(&cfg.Concurrency, "concurrency", 256, "intents each worker (and each baseline consumer) handles at once; the worker's default")
	fs.IntVar(&cfg.Workers, "workers", 1, "worker instances in this process, each on its own connection (baseline: as many consumers)")
	fs.IntVar(&cfg.Payload, "payload", 256, "bytes of each intent's args")
	fs.BoolVar(&cfg.TCP, "tcp", false, "connect over TCP loopback (127.0.0.1) instead of in-process")
	fs.BoolVar(&cfg.Cluster, "cluster", false, "run on an in-process 3-node cluster with R3 stream and bucket")
	fs.IntVar(&cfg.LedgerBatch, "ledger-batch", -1, "the workers' --ledger-batch in every scenario but durable (0: off; -1: as an embedded worker does by default, on at sync always, off otherwise)")
	fs.DurationVar(&cfg.AnswerCache, "answer-cache", 10*time.Second, "the workers' --answer-cache (0: off, every duplicate reads the ledger)")
	fs.StringVar(&cfg.Sync, "sync", natsrv.SyncLazy, "store sync of every scenario but durable: lazy, always, or an interval like 100ms")
	fs.Float64Var(&cfg.Rate, "rate", 0, "latency: offered intents/s (0: half the measured unique rate)")
	fs.DurationVar(&cfg.LatencyFor, "latency-duration", 5*time.Second, "latency: how long the open-loop load runs")
	fs.IntVar(&cfg.MemInflight, "mem-inflight", 10000, "memory: intents held in flight")
	fs.DurationVar(&cfg.MemDelay, "mem-delay", 10*time.Minute, "memory: the noop effect's delay (the intents are cancelled once measured)")
	fs.StringVar(&cfg.StoreDir, "store-dir", os.TempDir(), "parent of each scenario's fresh store directory (removed afterwards)")
	fs.StringVar(&cfg.CPUProfile, "cpuprofile", "", "write a CPU profile of each row's measured phase to PREFIX.<row>.pprof")
	fs.StringVar(&cfg.MemProfile, "memprofile", "", "write a heap profile at the end of each row's measured phase to PREFIX.<row>.pprof")
	fs.DurationVar(&cfg.Timeout, "timeout", 5*time.Minute, "bound of each scenario (of each row of durable)")
	fs.IntVar(&cfg.Rounds, "rounds", 1, "measurements of baseline, unique, dup and the audit rows, alternated; each row reports the median")
	fs.BoolVar(&cfg.Short, "short", false, "small runs of every scenario, to check the bench works (figures are not measurements)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *scenarios == "all" {
		cfg.Scenarios = allScenarios
	} else {
		cfg.Scenarios = strings.Split(*scenarios, ",")
	}
	var err error
	if cfg.DurableInflight, err = positiveInts("-durable-inflight", *durableInflight, "64,256"); err != nil {
		return err
	}
	if cfg.DupLargeN, err = positiveInts("-dup-large-n", *dupLargeN, "100000,1000000"); err != nil {
		return err
	}
	if cfg.PGRates, err = parsePGRates(*pgRate); err != nil {
		return err
	}
	for _, r := range strings.Split(*durableRows, ",") {
		if r = strings.TrimSpace(r); r != "" {
			cfg.DurableRows = append(cfg.DurableRows, r)
		}
	}
	if cfg.Short {
		cfg.shorten()
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	_, err = run(ctx, cfg, os.Stdout)
	return err
}

// subcommand runs a bench subcommand's main on its flags, until it ends or
// the process is interrupted.
func subcommand(main func(ctx context.Context, args []string, out io.Writer) error, args []string) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return main(ctx, args, os.Stdout)
}

// positiveInts parses flag's comma-separated positive whole numbers.
func positiveInts(flag, list, example string) ([]int, error) {
	var ns []int
	for _, f := range strings.Split(list, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("%s %q: give positive whole numbers, e.g. %s", flag, list, example)
		}
		ns = append(ns, n)
	}
	return ns, nil
}

// parsePGRates parses -pg-rate: N=rate pairs, comma-separated.
func parsePGRates(s string) (map[int]float64, error) {
	rates := map[int]float64{}
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		n, rate, ok := strings.Cut(f, "=")
		conns, err1 := strconv.Atoi(n)
		r, err2 := strconv.ParseFloat(rate, 64)
		if !ok || err1 != nil || err2 != nil || conns < 1 || !finitePositive(r) {
			return nil, fmt.Errorf("-pg-rate %q: give connections=rate pairs, e.g. 64=3615,256=2006", s)
		}
		rates[conns] = r
	}
	return rates, nil
}
