package main

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/idemgate/idemgate/pkg/intent"
)

// Scenarios, in the order they run.
var allScenarios = []string{"baseline", "unique", "dup", "audit", "dup-large", "client", "latency", "durable", "memory"}

// config is one bench invocation.
type config struct {
	N               int             // intents per throughput run
	DupLargeN       []int           // intents of each unique@N row of the dup-large scenario (dup@N: the first only)
	DurableInflight []int           // intents in flight of the durable rows
	DurableFor      time.Duration   // how long each durable row's measured run lasts, at least
	DurableWarmup   int             // intents of each durable row's unmeasured first run, which sizes the measured one
	Inflight        int             // unanswered intents the publisher keeps (closed loop)
	Concurrency     int             // per worker (and per baseline consumer)
	Workers         int             // worker instances, each on its own connection
	Payload         int             // bytes of an intent's args
	TCP             bool            // connect over TCP loopback instead of in-process
	WorkerInProcess bool            // the workers' (and the baseline handlers') connections in-process; by default over TCP loopback, as the embedded worker
	Cluster         bool            // an in-process 3-node cluster, R3 stream and bucket
	Sync            string          // sync policy of every scenario but durable
	LedgerBatch     int             // the workers' ledger batch in every scenario but durable (0: off; -1: as the worker's embedded default)
	AnswerCache     time.Duration   // the workers' answer cache (0: off)
	Scenarios       []string        // subset of allScenarios
	Rate            float64         // latency: intents/s; 0 = half the unique rate
	LatencyFor      time.Duration   // latency: how long the open-loop load runs
	MemInflight     int             // memory: intents held in flight
	MemDelay        time.Duration   // memory: how long each held effect would take
	PGRates         map[int]float64 // a Postgres ledger's rate (fsync on) measured beside, by connections (intents in flight), for the durable targets
	RiverRate       float64         // a tuned River's jobs/s measured beside, for the unique target; 0: none
	DurableRows     []string        // the durable rows to run, by name without @N; none: all
	StoreDir        string          // parent of each scenario's fresh store dir
	CPUProfile      string          // prefix of per-row CPU profiles
	MemProfile      string          // prefix of per-row heap profiles
	Timeout         time.Duration   // bound of each scenario
	Short           bool            // the short mode, for CI: a check, not a measurement
	Rounds          int             // measurements of baseline, unique, dup and the audit rows (median reported)
}

func (c *config) validate() error {
	var errs []error
	if c.N < 1 || c.DurableWarmup < 1 {
		errs = append(errs, fmt.Errorf("-n %d, -durable-warmup %d: must be at least 1", c.N, c.DurableWarmup))
	}
	if len(c.DupLargeN) == 0 || slices.Min(c.DupLargeN) < 1 {
		errs = append(errs, fmt.Errorf("-dup-large-n %v: give positive whole numbers, e.g. 100000,1000000", c.DupLargeN))
	}
	if c.Inflight < 1 || c.Concurrency < 1 || c.Workers < 1 || c.MemInflight < 1 || c.Rounds < 1 {
		errs = append(errs, errors.New("-inflight, -concurrency, -workers, -mem-inflight and -rounds must be at least 1"))
	}
	if c.Payload < 0 || c.Payload > intent.DefaultMaxBytes/2 {
		errs = append(errs, fmt.Errorf("-payload %d: use 0 to %d bytes", c.Payload, intent.DefaultMaxBytes/2))
	}
	if c.Rate < 0 || c.LatencyFor <= 0 || c.DurableFor <= 0 || c.Timeout <= 0 || c.MemDelay <= 0 {
		errs = append(errs, errors.New("-rate must not be negative; -latency-duration, -durable-duration, -mem-delay and -timeout must be positive"))
	}
	if c.RiverRate != 0 && !finitePositive(c.RiverRate) {
		errs = append(errs, fmt.Errorf("-river-rate %v: give River's jobs/s, e.g. 11058", c.RiverRate))
	}
	for _, s := range c.Scenarios {
		if !slices.Contains(allScenarios, s) {
			errs = append(errs, fmt.Errorf("-scenarios: unknown %q: use %s or all", s, strings.Join(allScenarios, ",")))
		}
	}
	return errors.Join(errs...)
}

func (c *config) wants(s string) bool { return slices.Contains(c.Scenarios, s) }

// wantsRow reports whether the durable row named name (without its @N) is
// to run.
func (c *config) wantsRow(name string) bool {
	return len(c.DurableRows) == 0 || slices.Contains(c.DurableRows, name)
}

// shorten makes every scenario small: the short mode checks that the bench
// works, in seconds.
func (c *config) shorten() {
	c.N = min(c.N, 300)
	c.DupLargeN = []int{600}
	c.DurableWarmup = min(c.DurableWarmup, 100)
	c.DurableFor = min(c.DurableFor, 200*time.Millisecond)
	c.DurableInflight = []int{64}
	c.Inflight = min(c.Inflight, 128)
	c.LatencyFor = min(c.LatencyFor, 500*time.Millisecond)
	c.MemInflight = min(c.MemInflight, 500)
}
