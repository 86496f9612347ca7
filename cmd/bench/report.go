package main

import (
	"fmt"
	"math"
	"slices"
	"text/tabwriter"
	"time"
)

// row is one line of the table. A scenario measured in several rounds has
// one row with every sample; the row reports their median.
type row struct {
	name   string
	ops    float64       // ops/s; 0 when the row is not a rate
	cpu    time.Duration // process CPU time per op (servers, workers, publisher)
	ref    string        // the row ops is compared with ("" for none)
	detail string        // what was measured (of the last sample)
	extra  []float64     // other figures of the row (latencies, bytes)

	samples []float64       // ops of every round
	cpus    []time.Duration // cpu of every round
}

// add records r, or one more sample of the row of its name.
func (b *bench) add(r row) {
	for i := range b.rows {
		if o := &b.rows[i]; o.name == r.name {
			o.samples = append(o.samples, r.ops)
			o.cpus = append(o.cpus, r.cpu)
			o.ops, o.cpu = median(o.samples), median(o.cpus)
			o.detail, o.extra = r.detail, r.extra
			return
		}
	}
	r.samples, r.cpus = []float64{r.ops}, []time.Duration{r.cpu}
	b.rows = append(b.rows, r)
}

func median[T float64 | time.Duration](xs []T) T {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// figures are every figure of the row, for the short mode's check.
func (r row) figures() []float64 {
	if r.ops == 0 && len(r.extra) > 0 {
		return r.extra
	}
	return append([]float64{r.ops, r.cpu.Seconds()}, r.extra...)
}

func (b *bench) row(name string) (row, bool) {
	for _, r := range b.rows {
		if r.name == name {
			return r, true
		}
	}
	return row{}, false
}

func (b *bench) rowOps(name string) (float64, bool) {
	r, ok := b.row(name)
	return r.ops, ok
}

// ratio is name's rate over ref's: the median of the per-round ratios when
// both were measured in the same rounds (a change of load between rounds
// then cancels out), else the ratio of the medians.
func (b *bench) ratio(name, ref string) (float64, bool) {
	r, ok1 := b.row(name)
	o, ok2 := b.row(ref)
	if !ok1 || !ok2 || r.ops <= 0 || o.ops <= 0 {
		return 0, false
	}
	if len(r.samples) != len(o.samples) || len(r.samples) < 2 {
		return r.ops / o.ops, true
	}
	rs := make([]float64, len(r.samples))
	for i := range rs {
		rs[i] = r.samples[i] / o.samples[i]
	}
	return median(rs), true
}

func (b *bench) print() {
	fmt.Fprintln(b.out)
	tw := tabwriter.NewWriter(b.out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "scenario\tops/s\tratio\tof\tcpu µs/op\tmeasured")
	for _, r := range b.rows {
		ops, ratio, vs, cpu := "-", "-", "", "-"
		if r.ops > 0 {
			ops = fmt.Sprintf("%.0f", r.ops)
			cpu = fmt.Sprintf("%.0f", float64(r.cpu)/float64(time.Microsecond))
		}
		if x, ok := b.ratio(r.name, r.ref); ok {
			ratio, vs = fmt.Sprintf("%.2f", x), r.ref
		}
		detail := r.detail
		if len(r.samples) > 1 {
			detail = fmt.Sprintf("median of %d rounds, %.0f-%.0f/s; last: %s", len(r.samples), slices.Min(r.samples), slices.Max(r.samples), detail)
		}
		fmt.Fprintf(tw, "%s\t%8s\t%5s\t%s\t%9s\t%s\n", r.name, ops, ratio, vs, cpu, detail)
	}
	_ = tw.Flush()

	if st := b.res.stages; len(st) > 0 {
		fmt.Fprintln(b.out, "\nlatency by stage (each intent: scheduled send → stored → handler → claim → effect → recorded → answered → received):")
		tw := tabwriter.NewWriter(b.out, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "stage\tp50\tp90\tp99\tmax\tmean in the slowest 1%\t")
		for _, f := range st {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t\n", f.name, ms(f.p50), ms(f.p90), ms(f.p99), ms(f.pmax), ms(f.tailMean))
		}
		_ = tw.Flush()
	}

	fmt.Fprintln(b.out, "\ntargets:")
	res := &b.res
	if u, ok1 := b.row("unique"); ok1 {
		if base, ok2 := b.row("baseline"); ok2 && base.cpu > 0 {
			b.atMost("unique CPU per intent <= 2.5 x baseline's", float64(u.cpu)/float64(base.cpu), 2.5, "x")
		}
	}
	if x, ok := b.ratio("unique", "baseline"); ok {
		fmt.Fprintf(b.out, "  %-48s %.2f\n", "unique / baseline (rate)", x)
	}
	if u, ok := b.row("unique"); ok {
		if river := b.cfg.RiverRate; river > 0 {
			b.atLeast(fmt.Sprintf("unique >= 2 x River (%.0f/s)", river), u.ops/river, 2)
		} else {
			fmt.Fprintf(b.out, "  %-48s %.0f/s: against 2 x a tuned River (unique jobs, batched inserts, fsync off): run deployments/bench/river.sh beside and pass -river-rate RATE\n",
				u.name, u.ops)
		}
	}
	if x, ok := b.ratio("unique", "unique-no-audit"); ok {
		b.atLeast("unique >= 0.90 x unique-no-audit (trail, receipts)", x, 0.90)
		b.cpuBound("unique", "unique-no-audit")
	}
	if x, ok := b.ratio("unique", "unique-no-trail"); ok {
		fmt.Fprintf(b.out, "  %-48s %.2f\n", "the trail: unique / unique-no-trail", x)
		b.cpuBound("unique", "unique-no-trail")
	}
	if x, ok := b.ratio("unique-no-trail", "unique-no-audit"); ok {
		fmt.Fprintf(b.out, "  %-48s %.2f\n", "receipts: unique-no-trail / unique-no-audit", x)
		b.cpuBound("unique-no-trail", "unique-no-audit")
	}
	if x, ok := b.ratio("dup-ledger", "unique"); ok {
		b.atLeast("dup-ledger >= 1.5 x unique", x, 1.5)
		b.cpuBound("dup-ledger", "unique")
	}
	for _, n := range b.cfg.DupLargeN {
		name := fmt.Sprintf("unique@%d", n)
		if x, ok := b.ratio(name, "unique"); ok {
			b.atLeast(name+" >= 0.9 x unique", x, 0.9)
			b.cpuBound(name, "unique")
		}
	}
	if x, ok := b.ratio("dup-client", "unique-client"); ok {
		b.atLeast("dup-client >= 1 x unique-client", x, 1)
		b.cpuBound("dup-client", "unique-client")
	}
	if res.haveLatency {
		b.atMost("p99 <= 5 ms at half the unique rate", res.p99.Seconds()*1000, 5, "ms")
		if f, ok := dominantStage(res.stages); ok {
			fmt.Fprintf(b.out, "  %-48s %s, %s of the slowest 1%%'s %s on average\n", "  the stage that dominates the slowest 1%:", f.name, ms(f.tailMean), ms(res.stages[len(res.stages)-1].tailMean))
		}
	}
	b.durableTargets()
	if res.haveMemory {
		note := ""
		if res.memInflight < 10000 {
			note = fmt.Sprintf(" (%d in flight only)", res.memInflight)
		}
		b.atMost("worker RSS <= 140 MiB at 10k in flight"+note, float64(res.rss)/(1<<20), 140, "MiB")
	}
}

// durableTargets prints the durable targets of the worker's defaults' rows
// (durable@N): at least 1.2 times a Postgres ledger with fsync on measured
// beside at N connections, at every N measured; at 64 in flight, 5000
// intents/s with a p99 of 30 ms at most.
func (b *bench) durableTargets() {
	def := defaultMode(b.cfg.Cluster)
	header := false
	for _, n := range b.cfg.DurableInflight {
		r, ok := b.row(fmt.Sprintf("%s@%d", def.name, n))
		if !ok {
			continue
		}
		if !header {
			fmt.Fprintf(b.out, "  %s (the worker's defaults: %s):\n", def.name, def.describe(b.cfg.Cluster))
			header = true
		}
		if pg, ok := b.cfg.PGRates[n]; ok {
			b.atLeast(fmt.Sprintf("%s >= 1.2 x Postgres@%d (%.0f/s)", r.name, n, pg), r.ops/pg, 1.2)
		} else {
			fmt.Fprintf(b.out, "  %-48s %.0f/s: against 1.2 x a Postgres ledger with fsync on: run deployments/bench/pgledger.sh beside and pass -pg-rate %d=RATE\n",
				r.name, r.ops, n)
		}
		if n == 64 {
			b.atLeast(r.name+" >= 5000 intents/s", r.ops, 5000)
			if len(r.extra) == 2 {
				b.atMost(r.name+" p99 <= 30 ms", r.extra[1]*1000, 30, "ms")
			}
		}
	}
}

func (b *bench) atLeast(what string, got, want float64) {
	if got >= want {
		fmt.Fprintf(b.out, "  %-48s %.2f: met (%.0f%% above)\n", what, got, 100*(got/want-1))
		return
	}
	fmt.Fprintf(b.out, "  %-48s %.2f: NOT MET (%.0f%% short)\n", what, got, 100*(1-got/want))
}

// cpuBound prints the ratio name/ref would have if both were bound by CPU
// alone: ref's CPU per op over name's. On a loaded machine it is steadier
// than the measured rates.
func (b *bench) cpuBound(name, ref string) {
	r, ok1 := b.row(name)
	o, ok2 := b.row(ref)
	if !ok1 || !ok2 || r.cpu <= 0 {
		return
	}
	rounds := ""
	if len(r.cpus) == len(o.cpus) && len(r.cpus) > 1 {
		// Each round's ratio: a change of load between rounds cancels out.
		xs := make([]float64, len(r.cpus))
		for i := range xs {
			xs[i] = float64(o.cpus[i]) / float64(r.cpus[i])
		}
		rounds = fmt.Sprintf("; by round: median %.3f, %.3f-%.3f", median(xs), slices.Min(xs), slices.Max(xs))
	}
	fmt.Fprintf(b.out, "  %-48s %.2f (%s %.0f µs/op, %s %.0f µs/op%s)\n", "  if CPU-bound:", float64(o.cpu)/float64(r.cpu),
		ref, float64(o.cpu)/float64(time.Microsecond), name, float64(r.cpu)/float64(time.Microsecond), rounds)
}

func (b *bench) atMost(what string, got, limit float64, unit string) {
	if got <= limit {
		fmt.Fprintf(b.out, "  %-48s %.2f %s: met (%.0f%% under)\n", what, got, unit, 100*(1-got/limit))
		return
	}
	fmt.Fprintf(b.out, "  %-48s %.2f %s: NOT MET (%.0f%% over)\n", what, got, unit, 100*(got/limit-1))
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2fms", float64(d)/float64(time.Millisecond)) }

func mib(n uint64) string { return fmt.Sprintf("%.1fMiB", float64(n)/(1<<20)) }

func finitePositive(f float64) bool { return f > 0 && !math.IsInf(f, 0) && !math.IsNaN(f) }

// percentiles are the median and the 99th percentile of xs.
func percentiles(xs []time.Duration) (p50, p99 time.Duration) {
	s := sortedCopy(xs)
	return percentile(s, .5), percentile(s, .99)
}
