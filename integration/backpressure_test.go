package integration

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/pkg/client"
	"github.com/idemgate/idemgate/pkg/intent"
)

// busyLoops keeps n goroutines spinning on the CPU until the test ends: a
// loaded box, where the workers, the server and their heartbeats run late.
func busyLoops(t *testing.T, n int) {
	t.Helper()
	var stop atomic.Bool
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			x := uint64(1)
			for !stop.Load() {
				for range 1 << 16 {
					x = x*6364136223846793005 + 1442695040888963407
				}
			}
			_ = x
		})
	}
	t.Cleanup(func() { stop.Store(true); wg.Wait() })
}

// Back-pressure never ends an operation unanswered: 200 intents of a tool
// with max_in_flight: 1, on three workers, with two busy loops beside them,
// wait under the cap far longer than the consumer's AckWait. None spends
// its deliveries: every caller is answered completed, nothing is
// dead-lettered, and the downstream (cmd/sink) sees each operation once.
func TestBackPressureUnderLoadAnswersEveryCaller(t *testing.T) {
	t.Parallel()
	skipShort(t, "200 intents held under a tool's cap on a loaded box")
	url := jetStream(t)
	down := startRealSink(t, "--hold", "100ms")
	tools := writeTools(t, fmt.Sprintf(`tools:
  capped:
    effect: webhook
    key_args: [n]
    max_in_flight: 1
    webhook: {url: %s/capped, timeout: 30s}
`, down.url))
	// A short AckWait, as the fault runs use: 200 intents at one a time per
	// worker wait many AckWaits under the cap. Two deliveries: a single
	// delivery spent while an intent waits shows.
	for _, name := range []string{"w1", "w2", "w3"} {
		startWorker(t, name, url, tools, "--ack-wait", "1s", "--max-deliver", "2", "--log-level", "info")
	}
	busyLoops(t, 2)

	nc := connect(t, url)
	cl, err := client.New(nc)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	const n = 200
	results := make([]*intent.Result, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range n {
		wg.Go(func() {
			results[i], errs[i] = cl.Submit(ctx, &intent.Envelope{Tool: "capped", Args: []byte(fmt.Sprintf(`{"n":%d}`, i))})
		})
	}
	wg.Wait()
	t.Logf("all answered after %s", time.Since(start))
	counts := map[intent.Status]int{}
	for i := range n {
		require.NoError(t, errs[i], "caller %d is answered", i)
		counts[results[i].Status]++
		if results[i].Status != intent.StatusCompleted {
			t.Errorf("caller %d: %s %+v", i, results[i].Status, results[i].Error)
		}
	}
	require.Equal(t, map[intent.Status]int{intent.StatusCompleted: n}, counts, "every caller is answered completed")
	for i := range n {
		require.LessOrEqual(t, down.firings(t, results[i].Key), 1, "operation %d fired at most once", i)
	}
	dlq := submit(t, url, "dlq", "list")
	require.Equal(t, 0, dlq.code, dlq.stderr)
	var letters []string
	for _, l := range lines(dlq.stdout) {
		if strings.Contains(l, "idem.intents.capped") {
			letters = append(letters, l)
		}
	}
	require.Zero(t, len(letters), "nothing was dead-lettered; the first: %.600s", strings.Join(letters, "\n"))
}
