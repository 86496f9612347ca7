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
	os.Exit(m.Run())
}

// TestBenchShort runs every scenario of the short mode in-process and checks
// that each row has positive, finite figures. It asserts no speed: the bench
// prints figures, and targets are read from them.
func TestBenchShort(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	cfg := config{
		N: 300, FsyncN: 200, Inflight: 128, Concurrency: 64, Workers: 1, Payload: 256,
		Sync: "lazy", Scenarios: allScenarios, LatencyFor: time.Second,
		MemInflight: 500, MemDelay: time.Minute, StoreDir: t.TempDir(),
		Timeout: 20 * time.Second, Short: true, Rounds: 1, LedgerBatch: -1, AnswerCache: 10 * time.Second,
	}
	cfg.shorten()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
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
	for _, want := range []string{"baseline", "unique", "dup", "unique-client", "dup-client", "latency", "kvcreate-always", "unique-always", "memory",
		"baseline-always@64", "durable-unbatched@64", "durable-batched@64", "lazy@64", "lazy-batched@64", "sync-10ms@64", "durable-batched-half@64"} {
		require.Truef(t, names[want], "no %s row", want)
	}
	require.Contains(t, out.String(), "targets:")
}
