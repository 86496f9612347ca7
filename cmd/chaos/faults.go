package main

import (
	"context"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// record notes an injected fault.
func (r *chaosRun) record(e event) {
	r.evMu.Lock()
	r.events = append(r.events, e)
	r.evMu.Unlock()
	r.logf("fault: %s %s", e.Kind, e.Target)
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
			killWorkers(fctx, cfg, r.sups, rand.New(rand.NewPCG(cfg.seed+1, 7)), r.record)
		}()
	}
	if cfg.restartAt >= 0 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := restartJetStream(fctx, ctx, cfg, r.nodes, r.js, l, r.record); err != nil {
				r.logf("JetStream restart: %v", err)
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
					r.logf("progress: %d published, %d answered, %d publish retries, %.0fs",
						l.published.Load(), l.answered.Load(), l.retries.Load(), time.Since(r.began).Seconds())
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
// (or cfg.maxKills is reached); its supervisor starts it again.
func killWorkers(ctx context.Context, cfg config, sups []*supervisor, rng *rand.Rand, record func(event)) {
	t := time.NewTicker(cfg.killEvery)
	defer t.Stop()
	for kills := 0; cfg.maxKills == 0 || kills < cfg.maxKills; kills++ {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		s := sups[rng.IntN(len(sups))]
		at := time.Now()
		s.kill()
		record(event{Kind: faultWorkerKill, Target: s.p.name, At: at, Until: time.Now()})
	}
}

// restartJetStream waits until cfg.restartAt of the intents are published,
// then SIGKILLs the JetStream process (with --cluster: the node leading the
// intent stream), keeps it down for cfg.downFor and starts it again on the
// same store. The restart itself runs under run, not ctx, so that a node is
// never left down.
func restartJetStream(ctx, run context.Context, cfg config, nodes []*natsNode, js jetstream.JetStream, l *loader, record func(event)) error {
	threshold := int64(cfg.restartAt * float64(cfg.intents))
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for l.published.Load() < threshold {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
	victim, kind := nodes[0], faultJetStream
	if len(nodes) > 1 {
		kind, victim = faultNode, nodes[1]
		ictx, cancel := context.WithTimeout(ctx, 5*time.Second)
		if s, err := js.Stream(ictx, l.cl.Names().Stream); err == nil && s.CachedInfo().Cluster != nil {
			for _, n := range nodes {
				if n.name == s.CachedInfo().Cluster.Leader {
					victim = n
				}
			}
		}
		cancel()
	}
	at := time.Now()
	victim.kill()
	down := time.NewTimer(cfg.downFor)
	select {
	case <-run.Done():
		down.Stop()
	case <-down.C:
	}
	if err := victim.start(); err != nil {
		return err
	}
	err := victim.ready(run, 2*time.Minute)
	l.recovered.Store(time.Now().UnixNano())
	record(event{Kind: kind, Target: victim.name, At: at, Until: time.Now()})
	return err
}
