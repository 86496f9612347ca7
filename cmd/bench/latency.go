package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"runtime"
	"runtime/metrics"
	"slices"
	"sync"
	"time"

	"github.com/idemgate/idemgate/internal/worker"
)

// latency offers unique intents at a fixed rate (open loop) and reports
// submit-to-answer latency from each intent's scheduled send time, and how
// that time divides among the stages of its handling.
func (b *bench) latency(ctx context.Context) error {
	rate := b.cfg.Rate
	if rate == 0 {
		unique, ok := b.rowOps("unique")
		if !ok {
			return errors.New("no unique rate to take half of: run the unique scenario too, or set -rate")
		}
		rate = unique / 2
	}
	n := max(int(rate*b.cfg.LatencyFor.Seconds()), 1)
	e, err := startEnv(b.cfg.StoreDir, b.cfg.Cluster, b.cfg.TCP, b.cfg.Sync)
	if err != nil {
		return err
	}
	defer e.close()
	st := &stageLog{byKey: map[string]worker.Stages{}}
	o := b.defaultOpts(e)
	o.onStages = st.add
	run, err := b.prepare(ctx, e, "latency", n, n, o)
	if err != nil {
		return err
	}
	g := run.g
	defer func() { _ = g.stop() }()
	runs := g.expectRuns(run.keys)
	var lat []time.Duration
	var received []time.Time
	var sent time.Duration
	var a *answers
	gc0, sched0 := gcNow(), schedLatencies()
	cpu, err := b.measure("latency", func() error {
		var err error
		lat, sent, received, a, err = run.p.openLoop(ctx, idemBatch(g.names, run.data, run.keys, true), rate, expect(false))
		return err
	})
	if err != nil {
		return err
	}
	gc1, sched1 := gcNow(), schedLatencies()
	audit := g.auditDetail()
	if err := g.stop(); err != nil {
		return err
	}
	if err := verifyAll(run.p, []verify{{name: "latency", runs: runs, want: 1, a: a}}); err != nil {
		return err
	}
	r := &b.res
	r.stages = st.figures(run.keys, lat, received)
	r.gcs, r.gcPauseMax = gcPauses(gc0, gc1)
	sorted := slices.Clone(lat)
	slices.Sort(sorted)
	r.rate, r.haveLatency = float64(n)/sent.Seconds(), true
	r.p50, r.p90, r.p99, r.pmax = percentile(sorted, .50), percentile(sorted, .90), percentile(sorted, .99), sorted[len(sorted)-1]
	b.add(row{name: "latency", ops: r.rate, cpu: cpu / time.Duration(n), ref: "unique",
		detail: fmt.Sprintf("%d intents, open loop at %.0f/s: p50 %s p90 %s p99 %s max %s; slowest 1%%: most in %s; %d GCs (longest pause %s), goroutine run-queue wait p99 %s%s",
			n, rate, ms(r.p50), ms(r.p90), ms(r.p99), ms(r.pmax), tailStage(r.stages), r.gcs, ms(r.gcPauseMax), ms(histQuantile(sched0, sched1, .99)), audit),
		extra: []float64{r.p50.Seconds(), r.p90.Seconds(), r.p99.Seconds(), r.pmax.Seconds()}})
	return nil
}

// stageLog collects the workers' stage times by key.
type stageLog struct {
	mu    sync.Mutex
	byKey map[string]worker.Stages
}

func (l *stageLog) add(s worker.Stages) {
	l.mu.Lock()
	l.byKey[s.Key] = s
	l.mu.Unlock()
}

// stageNames are the stages an intent goes through, in order: from its
// scheduled send to the server storing it, to its handler starting, to its
// claim answering, to its effect returning, to its outcome recorded, to its
// answer published, to the answer received.
var stageNames = []string{"publish", "deliver", "claim", "effect", "record", "answer", "return", "total"}

// stageFigures are one stage's latencies over every intent, and its mean
// among the intents at or above the total's p99.
type stageFigures struct {
	name                string
	p50, p90, p99, pmax time.Duration
	tailMean            time.Duration
}

// figures divides each intent's latency (from its scheduled send time,
// received[i]-lat[i], to received[i]) into its stages.
func (l *stageLog) figures(keys []string, lat []time.Duration, received []time.Time) []stageFigures {
	l.mu.Lock()
	defer l.mu.Unlock()
	per := make([][]time.Duration, len(stageNames))
	for i, key := range keys {
		s, ok := l.byKey[key]
		if !ok {
			continue
		}
		points := []time.Time{received[i].Add(-lat[i]), s.Stored, s.Delivered, s.Claimed, s.Fired, s.Recorded, s.Answered, received[i]}
		for k := range len(points) - 1 {
			per[k] = append(per[k], points[k+1].Sub(points[k]))
		}
		per[len(stageNames)-1] = append(per[len(stageNames)-1], lat[i])
	}
	total := per[len(stageNames)-1]
	if len(total) == 0 {
		return nil
	}
	p99 := percentile(sortedCopy(total), .99)
	out := make([]stageFigures, len(stageNames))
	for k, name := range stageNames {
		s := sortedCopy(per[k])
		var tail time.Duration
		var tailN int
		for i, d := range per[k] {
			if total[i] >= p99 {
				tail += d
				tailN++
			}
		}
		out[k] = stageFigures{name: name, p50: percentile(s, .5), p90: percentile(s, .9), p99: percentile(s, .99), pmax: s[len(s)-1],
			tailMean: tail / time.Duration(max(tailN, 1))}
	}
	return out
}

// tailStage names the stage that dominates the slowest 1 %.
func tailStage(st []stageFigures) string {
	if f, ok := dominantStage(st); ok {
		return f.name
	}
	return "(no stages)"
}

// dominantStage is the stage (not the total) with the longest mean among
// the slowest 1 % of intents.
func dominantStage(st []stageFigures) (stageFigures, bool) {
	var top stageFigures
	found := false
	for _, f := range st {
		if f.name != "total" && (!found || f.tailMean > top.tailMean) {
			top, found = f, true
		}
	}
	return top, found
}

func sortedCopy(xs []time.Duration) []time.Duration {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s
}

// gcNow reads the garbage collector's counts (a short stop of the world:
// call it outside a measured phase).
func gcNow() runtime.MemStats {
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m
}

// gcPauses is the number of collections between two readings and the
// longest pause among them (of the last 256 at most).
func gcPauses(before, after runtime.MemStats) (uint32, time.Duration) {
	n := after.NumGC - before.NumGC
	var longest uint64
	for i := range min(n, 256) {
		longest = max(longest, after.PauseNs[(after.NumGC-i+255)%256])
	}
	return n, time.Duration(longest)
}

// schedLatencies reads the runtime's histogram of the time goroutines spend
// runnable before they run.
func schedLatencies() *metrics.Float64Histogram {
	s := []metrics.Sample{{Name: "/sched/latencies:seconds"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindFloat64Histogram {
		return nil
	}
	return s[0].Value.Float64Histogram()
}

// histQuantile is the q-quantile of the samples added to a histogram
// between two readings (the upper bound of its bucket).
func histQuantile(before, after *metrics.Float64Histogram, q float64) time.Duration {
	if before == nil || after == nil || len(before.Counts) != len(after.Counts) {
		return 0
	}
	var total uint64
	for i := range after.Counts {
		total += after.Counts[i] - before.Counts[i]
	}
	var cum uint64
	for i := range after.Counts {
		cum += after.Counts[i] - before.Counts[i]
		if total > 0 && float64(cum) >= q*float64(total) {
			ub := after.Buckets[i+1]
			if math.IsInf(ub, 1) {
				ub = after.Buckets[i]
			}
			return time.Duration(ub * float64(time.Second))
		}
	}
	return 0
}
