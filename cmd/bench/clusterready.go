package main

// The cluster-ready scenario: start workers together against a fresh
// 3-node cluster with replicas 3, each on its own server, and print each
// one's time from start to ready (its streams, consumer and buckets set up,
// consuming), round after round, each round on a new cluster.
//
//	bench cluster-ready -workers 3 -rounds 5

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/idemgate/idemgate/internal/natsrv"
	"github.com/idemgate/idemgate/internal/worker"
	"github.com/idemgate/idemgate/pkg/effects"
)

// clusterReadyConfig is the scenario's configuration (its flags).
type clusterReadyConfig struct {
	Workers    int           // workers started together
	Rounds     int           // fresh clusters, one after the other
	Partitions int           // the ledger's partitions
	StoreDir   string        // parent of each round's fresh store directory
	Timeout    time.Duration // bound of each round
}

// clusterReadyMain runs the scenario with the given flags.
func clusterReadyMain(ctx context.Context, args []string, out io.Writer) error {
	fset := flag.NewFlagSet("bench cluster-ready", flag.ContinueOnError)
	var c clusterReadyConfig
	fset.IntVar(&c.Workers, "workers", 3, "workers started together, each on its own connection, spread over the three servers")
	fset.IntVar(&c.Rounds, "rounds", 3, "rounds, each on a fresh cluster")
	fset.IntVar(&c.Partitions, "partitions", 1, "the ledger's partitions (a power of two)")
	fset.StringVar(&c.StoreDir, "store-dir", os.TempDir(), "parent of each round's fresh store directory (removed afterwards)")
	fset.DurationVar(&c.Timeout, "timeout", 2*time.Minute, "bound of each round")
	if err := fset.Parse(args); err != nil {
		return err
	}
	if c.Workers < 1 || c.Rounds < 1 {
		return fmt.Errorf("cluster-ready: -workers %d, -rounds %d: give at least 1 of each", c.Workers, c.Rounds)
	}
	reg, err := registry(0, &atomic.Pointer[tally]{})
	if err != nil {
		return err
	}
	_, _ = fmt.Fprintf(out, "cluster-ready: %d workers started together on a fresh 3-node cluster (in one process, TCP loopback), replicas 3, %d ledger partition(s); load average %s\n",
		c.Workers, c.Partitions, loadAvg())
	var slowest []time.Duration
	for r := range c.Rounds {
		times, err := clusterReadyRound(ctx, c, reg)
		if err != nil {
			return fmt.Errorf("cluster-ready: round %d: %w", r+1, err)
		}
		slices.Sort(times)
		shown := make([]string, len(times))
		for i, d := range times {
			shown[i] = fmt.Sprintf("%.2fs", d.Seconds())
		}
		_, _ = fmt.Fprintf(out, "round %d: ready after %s\n", r+1, strings.Join(shown, " "))
		slowest = append(slowest, times[len(times)-1])
	}
	slices.Sort(slowest)
	_, _ = fmt.Fprintf(out, "slowest worker of a round: median %.2fs, max %.2fs over %d round(s); load average %s\n",
		slowest[len(slowest)/2].Seconds(), slowest[len(slowest)-1].Seconds(), len(slowest), loadAvg())
	return nil
}

// clusterReadyRound starts a fresh cluster, then c.Workers workers at once,
// and returns each one's time to ready.
func clusterReadyRound(ctx context.Context, c clusterReadyConfig, reg *effects.Registry) ([]time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, c.Timeout)
	defer cancel()
	e, err := startEnv(c.StoreDir, true, true, natsrv.SyncLazy)
	if err != nil {
		return nil, err
	}
	defer e.close()
	conns := make([]*nats.Conn, c.Workers)
	for i := range conns {
		nc, err := nats.Connect(e.servers[i%len(e.servers)].ClientURL(), nats.Name(fmt.Sprintf("bench-ready-%d", i+1)), nats.MaxReconnects(-1))
		if err != nil {
			return nil, fmt.Errorf("connect: %w", err)
		}
		e.conns = append(e.conns, nc)
		conns[i] = nc
	}
	runCtx, stop := context.WithCancel(context.Background())
	defer stop()
	var (
		wg, runs sync.WaitGroup
		mu       sync.Mutex
		errs     []error
	)
	times := make([]time.Duration, c.Workers)
	start := time.Now()
	for i := range c.Workers {
		wg.Go(func() {
			w, err := worker.New(ctx, conns[i], reg, nil, worker.Config{Holder: fmt.Sprintf("bench-ready-%d", i+1), Replicas: e.replicas,
				LedgerPartitions: c.Partitions})
			if err != nil {
				mu.Lock()
				errs = append(errs, fmt.Errorf("worker %d: %w", i+1, err))
				mu.Unlock()
				return
			}
			done := make(chan error, 1)
			runs.Go(func() { done <- w.Run(runCtx, time.Second) })
			select {
			case <-w.Ready():
				times[i] = time.Since(start)
			case err := <-done:
				mu.Lock()
				errs = append(errs, fmt.Errorf("worker %d stopped before it was ready: %w", i+1, err))
				mu.Unlock()
			case <-ctx.Done():
				mu.Lock()
				errs = append(errs, fmt.Errorf("worker %d not ready after %s", i+1, c.Timeout))
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	stop()
	runs.Wait()
	if len(errs) > 0 {
		return nil, errs[0]
	}
	return times, nil
}
