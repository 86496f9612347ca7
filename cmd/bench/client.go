package main

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemgate/idemgate/pkg/client"
	"github.com/idemgate/idemgate/pkg/intent"
)

// client runs N unique intents through pkg/client, then the same N again
// inside the stream's duplicate window: Inflight goroutines each calling
// Client.Submit one after another. A first submission derives the key,
// publishes with Nats-Msg-Id and waits for the pub ack, subscribes a private
// inbox and waits for the answer; a repeat gets PubAck.Duplicate and reads
// the record from the ledger key.
func (b *bench) client(ctx context.Context) error {
	e, err := startEnv(b.cfg.StoreDir, b.cfg.Cluster, b.cfg.TCP, b.cfg.Sync)
	if err != nil {
		return err
	}
	defer e.close()
	g, err := b.startWorkers(ctx, e, b.defaultOpts(e))
	if err != nil {
		return err
	}
	defer func() { _ = g.stop() }()
	data, keys, err := b.intents(b.cfg.N, "client")
	if err != nil {
		return err
	}
	envs := make([]*intent.Envelope, len(data))
	for i, d := range data {
		if envs[i], err = intent.Decode(d, intent.Limits{}); err != nil {
			return err
		}
	}
	pnc, err := e.connect("bench-client")
	if err != nil {
		return err
	}
	cl, err := client.New(pnc, client.WithKeySpec(benchTool, intent.KeySpec{}))
	if err != nil {
		return err
	}
	// Every repeat reads the ledger key with a direct get; the record is
	// final, so none watches it.
	inflight := min(b.cfg.Inflight, maxClientInflight)
	var checks []verify
	for _, pass := range []struct {
		name, ref string
		replayed  bool
	}{{"unique-client", "unique", false}, {"dup-client", "unique-client", true}} {
		runs := g.expectRuns(keys)
		var took time.Duration
		cpu, err := b.measure(pass.name, func() error {
			var err error
			took, err = submitAll(ctx, cl, envs, inflight, pass.replayed)
			return err
		})
		if err != nil {
			return fmt.Errorf("%s: %w", pass.name, err)
		}
		want := int32(1)
		if pass.replayed {
			want = 0
		}
		checks = append(checks, verify{name: pass.name, runs: runs, want: want})
		n := len(envs)
		b.add(row{name: pass.name, ops: float64(n) / took.Seconds(), cpu: cpu / time.Duration(n), ref: pass.ref,
			detail: fmt.Sprintf("%d Client.Submit, %d at once, in %s", n, inflight, took.Round(time.Millisecond))})
	}
	if err := g.stop(); err != nil {
		return err
	}
	return verifyAll(nil, checks)
}

// maxClientInflight bounds the concurrent Client.Submit calls.
const maxClientInflight = 500

// submitAll submits envs from inflight goroutines and checks every answer.
func submitAll(ctx context.Context, cl *client.Client, envs []*intent.Envelope, inflight int, replayed bool) (time.Duration, error) {
	var next atomic.Int64
	errs := make(chan error, inflight)
	var wg sync.WaitGroup
	start := time.Now()
	for range inflight {
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= int64(len(envs)) {
					return
				}
				// A context per call: Submission.Wait stops a ledger watch
				// only when its context ends.
				sctx, cancel := context.WithTimeout(ctx, time.Minute)
				res, err := cl.Submit(sctx, envs[i])
				cancel()
				if err == nil && (res.Status != intent.StatusCompleted || res.Replayed != replayed) {
					err = fmt.Errorf("want completed, replayed %t; got %s, replayed %t", replayed, res.Status, res.Replayed)
				}
				if err != nil {
					errs <- fmt.Errorf("submit %d: %w", i, err)
					return
				}
			}
		})
	}
	wg.Wait()
	took := time.Since(start)
	close(errs)
	return took, <-errs
}
