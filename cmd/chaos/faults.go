package main

import (
	"context"
	"errors"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	"github.com/idemgate/idemgate/pkg/dedup"
)

// record notes an injected fault.
func (r *chaosRun) record(e event) {
	r.evMu.Lock()
	r.events = append(r.events, e)
	r.evMu.Unlock()
	if e.Kind == faultWorkerKill {
		r.logf("fault: %s %s", e.Kind, e.Target)
		return
	}
	r.logf("fault: %s %s, over: ready again %.1fs after the kill", e.Kind, e.Target, e.Until.Sub(e.At).Seconds())
}

// startFaults starts the fault injectors (and the progress line); the
// returned stop ends them and waits for them.
func (r *chaosRun) startFaults(ctx context.Context) (stop func()) {
	cfg, l := r.cfg, r.loader
	fctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	if cfg.killEvery > 0 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			killWorkers(fctx, cfg, r.sups, rand.New(rand.NewPCG(cfg.seed+1, 7)), r.killsPaused.Load, r.record)
		}()
	}
	if cfg.restartAt >= 0 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := r.restartJetStream(fctx, ctx); err != nil {
				r.logf("JetStream restart: %v", err)
			}
		}()
	}
	if cfg.outageAt >= 0 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := r.ledgerOutage(fctx, ctx); err != nil {
				r.logf("ledger outage: %v", err)
			}
		}()
	}
	if cfg.powerLossAt >= 0 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := r.powerLoss(fctx, ctx); err != nil {
				r.logf("power loss: %v", err)
			}
		}()
	}
	if cfg.progressEach > 0 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t := time.NewTicker(cfg.progressEach)
			defer t.Stop()
			for {
				select {
				case <-fctx.Done():
					return
				case <-t.C:
					r.logf("progress: %d published, %d answered, %d publish retries, %d republished, %.0fs",
						l.published.Load(), l.answered.Load(), l.retries.Load(), l.republish.Load(), time.Since(r.began).Seconds())
				}
			}
		}()
	}
	return func() {
		cancel()
		wg.Wait()
	}
}

// killWorkers SIGKILLs a random worker every cfg.killEvery until ctx ends
// (or cfg.maxKills is reached), but not while paused says so; its
// supervisor starts it again as a new holder. Each kill event names the
// holder it killed.
func killWorkers(ctx context.Context, cfg config, sups []*supervisor, rng *rand.Rand, paused func() bool, record func(event)) {
	t := time.NewTicker(cfg.killEvery)
	defer t.Stop()
	for kills := 0; cfg.maxKills == 0 || kills < cfg.maxKills; {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if paused() {
			continue
		}
		s := sups[rng.IntN(len(sups))]
		at := time.Now()
		if holder, ok := s.kill(); ok {
			record(event{Kind: faultWorkerKill, Target: holder, At: at, Until: time.Now()})
			kills++
		}
	}
}

// restartJetStream waits until cfg.restartAt of the intents are published,
// then SIGKILLs the JetStream process (with --cluster: the node leading the
// intent stream), keeps it down for cfg.downFor and starts it again on the
// same store. The restart itself runs under run, not ctx, so that a node is
// never left down.
func (r *chaosRun) restartJetStream(ctx, run context.Context) error {
	if !r.waitPublished(ctx, r.cfg.restartAt) {
		return nil
	}
	if len(r.nodes) == 1 {
		return r.nodeFault(run, faultJetStream, r.nodes, r.cfg.downFor)
	}
	return r.nodeFault(run, faultNode, r.victims(ctx, 1), r.cfg.downFor)
}

// ledgerOutage waits until cfg.outageAt of the intents are published, then
// takes the ledger away for cfg.outageFor, longer than a worker retries
// recording an outcome: the JetStream process, or with --cluster two of the
// three nodes (the intent stream's leader among them), so that no stream
// has a quorum. Worker kills pause meanwhile: the holders cut off by the
// outage live through it, so a repeat after it is theirs, not the crash
// window's. Like restartJetStream, the restart runs under run.
func (r *chaosRun) ledgerOutage(ctx, run context.Context) error {
	if !r.waitPublished(ctx, r.cfg.outageAt) {
		return nil
	}
	r.killsPaused.Store(true)
	defer r.killsPaused.Store(false)
	return r.nodeFault(run, faultLedgerOutage, r.victims(ctx, (len(r.nodes)+1)/2), r.cfg.outageFor)
}

// waitPublished waits until share of the intents are published; false when
// ctx ended first.
func (r *chaosRun) waitPublished(ctx context.Context, share float64) bool {
	threshold := int64(share * float64(r.cfg.intents))
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for r.loader.published.Load() < threshold {
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
		}
	}
	return true
}

// victims picks n nodes to kill: the one leading the intent stream first
// (with --partitions, the one leading the most ledger partitions; the
// second node when that is unknown), then the ones after it.
func (r *chaosRun) victims(ctx context.Context, n int) []*natsNode {
	lead := min(1, len(r.nodes)-1)
	ictx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	led := make([]int, len(r.nodes))
	streams := []string{r.loader.cl.Names().Stream}
	if r.cfg.partitions > 1 {
		streams = streams[:0]
		for p := range r.cfg.partitions {
			streams = append(streams, "KV_"+dedup.PartitionBucket(r.loader.cl.Names().Bucket, p))
		}
	}
	for _, name := range streams {
		if s, err := r.js.Stream(ictx, name); err == nil && s.CachedInfo().Cluster != nil {
			for i, node := range r.nodes {
				if node.name == s.CachedInfo().Cluster.Leader {
					led[i]++
				}
			}
		}
	}
	for i := range led {
		if led[i] > 0 && led[i] > led[lead] {
			lead = i
		}
	}
	if r.cfg.partitions > 1 {
		r.logf("ledger partition leaders per node: %v; killing %s", led, r.nodes[lead].name)
	}
	out := make([]*natsNode, 0, n)
	for i := range min(n, len(r.nodes)) {
		out = append(out, r.nodes[(lead+i)%len(r.nodes)])
	}
	return out
}

// nodeFault SIGKILLs victims, keeps them down for down, starts them again on
// their stores and waits until they are ready, then records the fault (kind)
// from the kill to the recovery. One node fault runs at a time.
func (r *chaosRun) nodeFault(run context.Context, kind string, victims []*natsNode, down time.Duration) error {
	r.nodeMu.Lock()
	defer r.nodeMu.Unlock()
	r.loader.nodesDown.Store(true)
	at := time.Now()
	names := make([]string, len(victims))
	for i, v := range victims {
		v.kill()
		names[i] = v.name
	}
	r.logf("fault: %s %s begins, down for %s", kind, strings.Join(names, ","), down)
	t := time.NewTimer(down)
	select {
	case <-run.Done():
		t.Stop()
	case <-t.C:
	}
	var errs []error
	r.loader.epoch.Add(1)
	for _, v := range victims {
		if err := v.start(); err != nil {
			errs = append(errs, err)
		}
	}
	for _, v := range victims {
		if err := v.ready(run, 2*time.Minute); err != nil {
			errs = append(errs, err)
		}
	}
	r.loader.recovered.Store(time.Now().UnixNano())
	r.loader.nodesDown.Store(false)
	r.record(event{Kind: kind, Target: strings.Join(names, ","), At: at, Until: time.Now()})
	return errors.Join(errs...)
}
