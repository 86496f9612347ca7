package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// TestMain lets the memory scenario re-run the test binary as its worker
// process.
func TestMain(m *testing.M) {
	if os.Getenv(roleEnv) == roleMemWorker {
		if err := memWorkerMain(); err != nil {
			fmt.Fprintln(os.Stderr, "memory worker:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	code := m.Run()
	if natsServer.dir != "" {
		_ = os.RemoveAll(natsServer.dir)
	}
	os.Exit(code)
}

// TestBenchShort runs every scenario of the short mode in-process and checks
// that each row has positive, finite figures. It asserts no speed: the bench
// prints figures, and targets are read from them.
func TestBenchShort(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: skipping every bench scenario (make test runs it)")
	}
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	cfg := config{
		N: 300, DupLargeN: []int{600}, DurableWarmup: 100, DurableFor: time.Second, Inflight: 128, Concurrency: 64, Workers: 1, Payload: 256,
		Sync: "lazy", Scenarios: allScenarios, LatencyFor: time.Second,
		MemInflight: 500, MemDelay: time.Minute, StoreDir: t.TempDir(),
		Timeout: 5 * time.Minute, Short: true, Rounds: 1, LedgerBatch: -1, AnswerCache: 10 * time.Second,
	}
	cfg.shorten()
	// The run is bounded by the test's own deadline (go test -timeout), not
	// by a quiet machine's wall clock: on a loaded CI machine the in-process
	// memory worker alone took over a minute to hold its intents.
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	if d, ok := t.Deadline(); ok {
		var stop context.CancelFunc
		ctx, stop = context.WithDeadline(ctx, d.Add(-10*time.Second))
		defer stop()
		cfg.Timeout = time.Until(d)
	}
	var out bytes.Buffer
	b, err := run(ctx, cfg, &out)
	t.Log("\n" + out.String())
	require.NoError(t, err)
	names := map[string]bool{}
	for _, r := range b.rows {
		names[r.name] = true
		for _, f := range r.figures() {
			require.Truef(t, finitePositive(f), "row %s: figure %v", r.name, f)
		}
	}
	want := []string{"baseline", "unique", "dup", "dup-ledger", "unique-no-trail", "unique-no-audit", "unique@600", "dup@600", "unique-client", "dup-client", "latency", "memory",
		"baseline-always@64", "baseline-always-async@64", "ledger-always@64"}
	want = append(want, "durable@64", "durable-half@64") // the worker's defaults, under the names the targets read
	for _, m := range durableModes {
		if !m.same(defaultMode(false)) {
			want = append(want, m.name+"@64")
		}
	}
	for _, w := range want {
		require.Truef(t, names[w], "no %s row", w)
	}
	require.Len(t, b.rows, len(want), "one row each")
	for _, f := range b.res.stages {
		require.Truef(t, f.p50 > 0 && f.pmax >= f.p99, "stage %s: p50 %s, p99 %s, max %s", f.name, f.p50, f.p99, f.pmax)
	}
	require.Len(t, b.res.stages, len(stageNames))
	require.Contains(t, out.String(), "targets:")
	require.Contains(t, out.String(), "the stage that dominates the slowest 1%")
	require.Contains(t, out.String(), "pass -river-rate RATE") // without the River yardstick's rate, how to get it
}

// The stage named for the slowest 1 % is the one with the longest mean
// there, never the total.
func TestDominantStage(t *testing.T) {
	t.Parallel()
	st := []stageFigures{{name: "publish", tailMean: 2}, {name: "claim", tailMean: 9}, {name: "record", tailMean: 7}, {name: "total", tailMean: 20}}
	f, ok := dominantStage(st)
	require.True(t, ok)
	require.Equal(t, "claim", f.name)
	require.Equal(t, "claim", tailStage(st))
	_, ok = dominantStage([]stageFigures{{name: "total", tailMean: 1}})
	require.False(t, ok)
	require.Equal(t, "(no stages)", tailStage(nil))
}
