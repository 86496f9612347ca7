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

	fmt.Fprintln(b.out, "\ntargets:")
	res := &b.res
	if x, ok := b.ratio("unique", "baseline"); ok {
		b.atLeast("unique >= 0.5 x baseline", x, 0.5)
		b.cpuBound("unique", "baseline")
	}
	if x, ok := b.ratio("dup", "unique"); ok {
		b.atLeast("dup >= 2 x unique", x, 2)
		b.cpuBound("dup", "unique")
	}
	if res.haveLatency {
		b.atMost("p99 <= 5 ms at half load", res.p99.Seconds()*1000, 5, "ms")
	}
	if x, ok := b.ratio("unique-always", "kvcreate-always"); ok {
		b.atLeast("fsync-always unique >= 0.8 x its kv.Create rate", x, 0.8)
		b.cpuBound("unique-always", "kvcreate-always")
	}
	for _, t := range []struct {
		row  string
		want float64
	}{{"durable-batched@64", 3000}, {"durable-batched@256", 6000}} {
		if r, ok := b.row(t.row); ok {
			b.atLeast(fmt.Sprintf("%s >= %.0f intents/s", t.row, t.want), r.ops, t.want)
			if len(r.extra) == 2 {
				fmt.Fprintf(b.out, "  %-48s latency at this load (closed loop): p50 %s, p99 %s\n", "", ms(time.Duration(r.extra[0]*float64(time.Second))), ms(time.Duration(r.extra[1]*float64(time.Second))))
			}
		}
	}
	for _, inflight := range b.cfg.DurableInflight {
		if r, ok := b.row(fmt.Sprintf("durable-batched-half@%d", inflight)); ok && len(r.extra) == 2 {
			b.atMost(fmt.Sprintf("durable p99 <= 50 ms at half of peak (@%d)", inflight), r.extra[1]*1000, 50, "ms")
		}
	}
	if res.haveMemory {
		note := ""
		if res.memInflight < 10000 {
			note = fmt.Sprintf(" (%d in flight only)", res.memInflight)
		}
		b.atMost("worker heap <= 64 MiB at 10k in flight"+note, float64(res.heap)/(1<<20), 64, "MiB")
		b.atMost("worker RSS <= 64 MiB at 10k in flight"+note, float64(res.rss)/(1<<20), 64, "MiB")
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
	fmt.Fprintf(b.out, "  %-48s %.2f (%s %.0f µs/op, %s %.0f µs/op)\n", "  if CPU-bound:", float64(o.cpu)/float64(r.cpu),
		ref, float64(o.cpu)/float64(time.Microsecond), name, float64(r.cpu)/float64(time.Microsecond))
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
