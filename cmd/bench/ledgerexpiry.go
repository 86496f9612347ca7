package main

// The ledger-expiry scenario: fill a ledger with keys of a short retention,
// then, from the moment the fill ends, offer new keys at a fixed rate
// (open loop: each operation a claim and its completion, timed from its
// scheduled start) while the first wave expires, and print per interval the
// ledger's messages, the operations done, their latency and the server's
// memory; then a summary and a verdict, stall or not.
//
//	bench ledger-expiry -nats-server bin/nats-server -keys 1000000 -ttl 90s -rate 5000
//
// An expired record is not simply removed: the server replaces it by a
// delete marker (the bucket's LimitMarkerTTL, so that a watcher sees the key
// go), which expires in its turn. A wave of N expiring records is so N marker
// writes, then N removals a marker TTL later, on top of the offered load; the
// ledger's steady state is rate × (retention + marker TTL) messages.

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// ledgerExpiryConfig is the scenario's configuration (its flags).
type ledgerExpiryConfig struct {
	Server      string        // nats-server executable
	Keys        int           // keys of the first wave (the fill)
	Concurrency int           // goroutines of the fill
	Partitions  int           // ledger partitions
	ResultBytes int           // bytes of each record's result
	TTL         time.Duration // the records' retention
	MarkerTTL   time.Duration // expired records' delete markers' TTL; 0: the ledger's own
	Rate        float64       // offered operations/s after the fill
	Duration    time.Duration // the load's length; 0: ttl + marker TTL + max(fill time, 3 intervals)
	Interval    time.Duration // one printed row per interval
	Inflight    int           // operations of the load in flight at most
	Stall       stallRule     // what counts as a stall
	StoreDir    string        // parent of the server's fresh store directory
	Sync        string        // the server's sync_interval ("" for its default)
	Keep        bool          // keep the store directory
}

// stallRule is the verdict's rule: every interval of the load (offered at a
// steady rate throughout) must finish its slowest operation within
// MaxLatency and complete at least MinRate × the offered rate, and no
// operation may fail.
type stallRule struct {
	MaxLatency time.Duration // an interval's max latency above it is a stall
	MinRate    float64       // an interval's rate below this fraction of the offered rate is a stall
}

// ledgerExpiryMain runs the scenario with the given flags.
func ledgerExpiryMain(ctx context.Context, args []string, out io.Writer) error {
	fset := flag.NewFlagSet("bench ledger-expiry", flag.ContinueOnError)
	var c ledgerExpiryConfig
	fset.StringVar(&c.Server, "nats-server", "bin/nats-server", "nats-server executable, run as its own process (go build -o bin/nats-server github.com/nats-io/nats-server/v2)")
	fset.IntVar(&c.Keys, "keys", 1_000_000, "keys of the first wave, filled before the load")
	fset.IntVar(&c.Concurrency, "concurrency", 64, "goroutines claiming and completing the first wave")
	fset.IntVar(&c.Partitions, "partitions", 1, "ledger partitions (a power of two)")
	fset.IntVar(&c.ResultBytes, "result-bytes", 48, "bytes of each record's result (a JSON string)")
	fset.DurationVar(&c.TTL, "ttl", 90*time.Second, "the records' retention; longer than the fill, so that some intervals run before expiry begins")
	fset.DurationVar(&c.MarkerTTL, "marker-ttl", 0, "TTL of the delete markers expired records leave: 0 keeps the ledger's own (1m); shorter only for quick checks")
	fset.Float64Var(&c.Rate, "rate", 5000, "offered operations/s (claim + completion of a new key) from the end of the fill")
	fset.DurationVar(&c.Duration, "duration", 0, "how long the load runs: 0 for ttl + marker TTL + the fill's time (at least 3 intervals), so the whole first wave and its markers expire and the steady state shows")
	fset.DurationVar(&c.Interval, "interval", 5*time.Second, "one row per interval")
	fset.IntVar(&c.Inflight, "inflight", 4096, "operations of the load in flight at most (one past it waits, its latency still counted from its scheduled start)")
	fset.DurationVar(&c.Stall.MaxLatency, "stall-latency", time.Second, "verdict: an interval whose max latency exceeds this is a stall")
	fset.Float64Var(&c.Stall.MinRate, "stall-rate", 0.5, "verdict: an interval completing under this fraction of the offered rate is a stall")
	fset.StringVar(&c.StoreDir, "store-dir", os.TempDir(), "parent of the server's fresh store directory (removed afterwards)")
	fset.StringVar(&c.Sync, "sync", "", "the server's sync_interval: empty for its default (lazy, 2m), always, or a duration")
	fset.BoolVar(&c.Keep, "keep", false, "keep the store directory")
	if err := fset.Parse(args); err != nil {
		return err
	}
	if err := c.validate(); err != nil {
		return err
	}
	res, err := runLedgerExpiry(ctx, c, out)
	if err != nil {
		return err
	}
	if res.stall != "" {
		return errors.New("stall: " + res.stall)
	}
	return nil
}

func (c ledgerExpiryConfig) validate() error {
	var errs []error
	if c.Keys < 1 || c.Concurrency < 1 || c.Inflight < 1 {
		errs = append(errs, fmt.Errorf("-keys %d -concurrency %d -inflight %d: give positive numbers", c.Keys, c.Concurrency, c.Inflight))
	}
	if c.ResultBytes < 0 {
		errs = append(errs, fmt.Errorf("-result-bytes %d: give 0 or more", c.ResultBytes))
	}
	if c.TTL < time.Second {
		errs = append(errs, fmt.Errorf("-ttl %s: give at least 1s", c.TTL))
	}
	if c.MarkerTTL != 0 && c.MarkerTTL < time.Second {
		errs = append(errs, fmt.Errorf("-marker-ttl %s: give 0 (the ledger's own) or at least 1s", c.MarkerTTL))
	}
	if !(c.Rate > 0) || c.Rate > 1e6 {
		errs = append(errs, fmt.Errorf("-rate %v: give operations/s above 0 (at most 1e6)", c.Rate))
	}
	if c.Interval < 100*time.Millisecond {
		errs = append(errs, fmt.Errorf("-interval %s: give at least 100ms", c.Interval))
	}
	if c.Duration != 0 && c.Duration < c.Interval {
		errs = append(errs, fmt.Errorf("-duration %s: give 0 (automatic) or at least one interval (%s)", c.Duration, c.Interval))
	}
	if c.Stall.MaxLatency <= 0 || !(c.Stall.MinRate > 0 && c.Stall.MinRate <= 1) {
		errs = append(errs, fmt.Errorf("-stall-latency %s -stall-rate %v: give a positive latency and a fraction in (0, 1]", c.Stall.MaxLatency, c.Stall.MinRate))
	}
	if c.Partitions < 1 || c.Partitions&(c.Partitions-1) != 0 {
		errs = append(errs, fmt.Errorf("-partitions %d: give a power of two (1, 2, 4, ...)", c.Partitions))
	}
	if _, err := os.Stat(c.Server); err != nil {
		errs = append(errs, fmt.Errorf("-nats-server %s: %w (build it: go build -o bin/nats-server github.com/nats-io/nats-server/v2)", c.Server, err))
	}
	return errors.Join(errs...)
}

// Phases of the load, by where an interval lies against the first wave's
// expiry.
const (
	phaseBefore  = "before"  // no record of the first wave has expired yet
	phaseExpire  = "expire"  // the first wave's records expire (replaced by markers, which expire a marker TTL later)
	phaseMarkers = "markers" // the first wave's last markers expire
	phaseSteady  = "steady"  // the first wave is gone
)

// expiryRow is one interval of the load.
type expiryRow struct {
	from, to      time.Duration // the interval, since the load began
	phase         string
	msgs, bytes   uint64 // the ledger's stream messages and bytes, over partitions, at its end
	ops, failed   int    // operations finished in it, and those that failed
	retries       int64  // writes tried again in it (a timeout)
	rate          float64
	p50, p99, max time.Duration
	heap, rss     uint64
}

// expiryResult is what the scenario measured.
type expiryResult struct {
	fill      time.Duration // the first wave's fill
	markerTTL time.Duration
	rows      []expiryRow
	stall     string // why the verdict is stall; "" for no stall
}

func runLedgerExpiry(ctx context.Context, c ledgerExpiryConfig, out io.Writer) (res expiryResult, err error) {
	lc := ledgerSizeConfig{Server: c.Server, StoreDir: c.StoreDir, Sync: c.Sync, TTL: c.TTL, Partitions: c.Partitions, Keep: c.Keep}
	proc, js, ledger, stop, err := startLedgerProc(ctx, lc, "bench-ledger-expiry", out)
	if err != nil {
		return res, err
	}
	defer stop()
	streams := make([]string, 0, c.Partitions)
	for _, b := range ledger.Buckets() {
		streams = append(streams, "KV_"+b)
	}
	if res.markerTTL, err = markerTTL(ctx, js, streams, c.MarkerTTL); err != nil {
		return res, err
	}
	result, _ := json.Marshal(strings.Repeat("r", max(c.ResultBytes-2, 0)))

	_, _ = fmt.Fprintf(out, "ledger-expiry: nats-server %s (own process, pid %d), %d partition(s), sync %s; %d keys filled by %d writers, then %.0f new keys/s offered (open loop, each a claim then a completion, latency from its scheduled start); retention %s, delete markers %s\n",
		c.Server, proc.cmd.Process.Pid, c.Partitions, cmpOr(c.Sync, "lazy (server default)"), c.Keys, c.Concurrency, c.Rate, c.TTL, res.markerTTL)
	fillStart := time.Now()
	retries0 := fillRetries.Load()
	if err := fillLedger(ctx, ledger, 0, c.Keys, c.Concurrency, result); err != nil {
		return res, fmt.Errorf("fill: %w", err)
	}
	res.fill = time.Since(fillStart)
	duration := c.Duration
	if duration == 0 {
		duration = c.TTL + res.markerTTL + max(res.fill, 3*c.Interval)
	}
	duration = duration.Round(c.Interval)
	// The load starts now (t = 0); the fill's records were written over
	// [-fill, 0], so they expire over [ttl - fill, ttl] and their markers
	// over [ttl - fill + markerTTL, ttl + markerTTL].
	expiryFrom := c.TTL - res.fill
	_, _ = fmt.Fprintf(out, "filled %d keys in %s (%.0f/s; %d writes retried); the load runs %s; the first wave expires from t=%s to t=%s, its markers until t=%s\n",
		c.Keys, res.fill.Round(time.Millisecond), float64(c.Keys)/res.fill.Seconds(), fillRetries.Load()-retries0,
		duration, expiryFrom.Round(time.Second), c.TTL, c.TTL+res.markerTTL)
	if expiryFrom <= 0 {
		_, _ = fmt.Fprintf(out, "the fill took longer than the retention: expiry began during it, no interval runs before it (give a longer -ttl or fewer -keys)\n")
	}
	_, _ = fmt.Fprintf(out, "msgs: the ledger's stream messages (records and delete markers); heap: the server's HeapInuse after a GC forced each interval; rss from /proc. Timings are wall-clock on a shared 2-core machine: noisy; judge by worst latency and rate, not absolute throughput.\n")
	_, _ = fmt.Fprintf(out, "%7s %-7s %10s %9s %8s %9s %9s %9s %9s %9s %5s\n",
		"t", "phase", "msgs", "ledger", "done/s", "p50", "p99", "max", "heap", "rss", "errs")

	phase := func(from, to time.Duration) string {
		switch {
		case to <= expiryFrom:
			return phaseBefore
		case from < c.TTL:
			return phaseExpire
		case from < c.TTL+res.markerTTL:
			return phaseMarkers
		}
		return phaseSteady
	}
	var acc latencyAcc
	loadCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	start := time.Now()
	loaded := make(chan struct{})
	go func() {
		defer close(loaded)
		openLoopLoad(loadCtx, start, duration, c.Rate, c.Inflight, func(k int, scheduled time.Time) {
			err := fillOne(loadCtx, ledger, c.Keys+k, result)
			acc.add(time.Since(scheduled), err)
		})
	}()
	prev := time.Duration(0)
	retries := fillRetries.Load()
	for end := c.Interval; ; {
		last := end >= duration
		if last {
			select {
			case <-loaded:
			case <-ctx.Done():
				<-loaded
				return res, ctx.Err()
			}
		} else {
			select {
			case <-time.After(time.Until(start.Add(end))):
			case <-ctx.Done():
				cancel()
				<-loaded
				return res, ctx.Err()
			}
		}
		lat, failed := acc.take()
		now := time.Since(start)
		row := expiryRow{from: prev, to: now, ops: len(lat), failed: failed}
		row.phase = phase(row.from, row.to)
		prev = now
		r := fillRetries.Load()
		row.retries, retries = r-retries, r
		row.rate = float64(row.ops-row.failed) / (row.to - row.from).Seconds()
		slices.Sort(lat)
		row.p50, row.p99 = lsPercentile(lat, .50), lsPercentile(lat, .99)
		if len(lat) > 0 {
			row.max = lat[len(lat)-1]
		}
		if row.msgs, row.bytes, err = ledgerState(ctx, js, streams); err != nil {
			return res, err
		}
		if row.heap, err = proc.heap(ctx); err != nil {
			return res, err
		}
		if row.rss, err = proc.rss(); err != nil {
			return res, err
		}
		_, _ = fmt.Fprintf(out, "%7s %-7s %10d %9s %8.0f %9s %9s %9s %9s %9s %5d\n",
			row.to.Round(100*time.Millisecond), row.phase, row.msgs, lsMiB(row.bytes), row.rate,
			ms(row.p50), ms(row.p99), ms(row.max), lsMiB(row.heap), lsMiB(row.rss), int64(row.failed)+row.retries)
		res.rows = append(res.rows, row)
		if last {
			break
		}
		end = nextEnd(end, time.Since(start), c.Interval)
	}
	if stuck := fillStuck.Load(); stuck > 0 {
		_, _ = fmt.Fprintf(out, "keys left pending by a lost claim acknowledgement: %d\n", stuck)
	}
	res.stall = summarize(out, res, c)
	return res, nil
}

// summarize prints the summary and the verdict, and returns why the verdict
// is a stall ("" for none).
func summarize(out io.Writer, res expiryResult, c ledgerExpiryConfig) string {
	worst := func(phases ...string) (n int, p99, mx expiryRow, minRate float64) {
		minRate = -1
		for _, r := range inPhases(res.rows, phases...) {
			if n == 0 || r.p99 > p99.p99 {
				p99 = r
			}
			if n == 0 || r.max > mx.max {
				mx = r
			}
			if minRate < 0 || r.rate < minRate {
				minRate = r.rate
			}
			n++
		}
		return n, p99, mx, minRate
	}
	line := func(what string, phases ...string) (time.Duration, time.Duration) {
		n, p99, mx, minRate := worst(phases...)
		if n == 0 {
			_, _ = fmt.Fprintf(out, "  %-34s no interval\n", what+":")
			return 0, 0
		}
		_, _ = fmt.Fprintf(out, "  %-34s %3d intervals: worst p99 %s (t=%s), worst max %s (t=%s), lowest rate %.0f/s\n",
			what+":", n, ms(p99.p99), p99.to.Round(time.Second), ms(mx.max), mx.to.Round(time.Second), minRate)
		return p99.p99, mx.max
	}
	_, _ = fmt.Fprintf(out, "summary (offered %.0f/s):\n", c.Rate)
	b99, bmax := line("before expiry", phaseBefore)
	e99, emax := line("first wave expiring", phaseExpire)
	m99, mmax := line("its last markers expiring", phaseMarkers)
	line("after (steady state)", phaseSteady)
	if b99 > 0 && bmax > 0 && max(emax, mmax) > 0 {
		_, _ = fmt.Fprintf(out, "  expiry against before: p99 ×%.1f, max ×%.1f\n",
			float64(max(e99, m99))/float64(b99), float64(max(emax, mmax))/float64(bmax))
	}
	if len(res.rows) > 0 {
		var peak expiryRow
		for _, r := range res.rows {
			if r.msgs > peak.msgs {
				peak = r
			}
		}
		final := res.rows[len(res.rows)-1]
		steady := c.Rate * (c.TTL + res.markerTTL).Seconds()
		_, _ = fmt.Fprintf(out, "  ledger messages: peak %d (t=%s), final %d; steady state rate × (retention + marker TTL) = %.0f: final/steady %.2f",
			peak.msgs, peak.to.Round(time.Second), final.msgs, steady, float64(final.msgs)/steady)
		switch {
		case final.phase != phaseSteady:
			_, _ = fmt.Fprintf(out, " — the run ended before the first wave's markers expired (give a longer -duration)\n")
		case steadyState(final.msgs, steady):
			_, _ = fmt.Fprintf(out, " — fell to about the steady state (within 25%%)\n")
		default:
			_, _ = fmt.Fprintf(out, " — NOT about the steady state (more than 25%% off)\n")
		}
	}
	rule := fmt.Sprintf("rule: every interval's max latency ≤ %s, rate ≥ %.0f%% of the offered %.0f/s, no failed operation, while the first wave expires",
		c.Stall.MaxLatency, 100*c.Stall.MinRate, c.Rate)
	expiring := inPhases(res.rows, phaseExpire, phaseMarkers)
	if len(expiring) == 0 {
		_, _ = fmt.Fprintf(out, "verdict: none: no interval of the expiry was measured (%s)\n", rule)
		return "no interval of the expiry was measured"
	}
	// The same load before and after the expiry is the run's own control: a
	// pause there is the machine's, and said, but not the expiry's.
	if other := c.Stall.stalls(inPhases(res.rows, phaseBefore, phaseSteady), c.Rate); len(other) > 0 {
		_, _ = fmt.Fprintf(out, "  outside the expiry (the same load, nothing expiring), %d interval(s) broke the rule too: %s\n",
			len(other), firstOf(other))
	}
	stalls := c.Stall.stalls(expiring, c.Rate)
	if len(stalls) == 0 {
		_, _ = fmt.Fprintf(out, "verdict: no stall (%s)\n", rule)
		return ""
	}
	why := firstOf(stalls)
	_, _ = fmt.Fprintf(out, "verdict: stall: %s (%s)\n", why, rule)
	return why
}

// inPhases returns the rows of the given phases.
func inPhases(rows []expiryRow, phases ...string) []expiryRow {
	var out []expiryRow
	for _, r := range rows {
		if slices.Contains(phases, r.phase) {
			out = append(out, r)
		}
	}
	return out
}

// firstOf joins the first three of reasons, and counts the rest.
func firstOf(reasons []string) string {
	why := strings.Join(reasons[:min(len(reasons), 3)], "; ")
	if len(reasons) > 3 {
		why += fmt.Sprintf("; and %d more", len(reasons)-3)
	}
	return why
}

// nextEnd is the end of the interval after one that ended at end and was
// printed at now: the next multiple of interval, skipping those a slow
// reading of the server overran, and at least half an interval after now,
// so that no row covers a sliver of time.
func nextEnd(end, now, interval time.Duration) time.Duration {
	next := (now + interval/2 + interval - 1) / interval * interval
	return max(end+interval, next)
}

// steadyState reports whether msgs is within 25% of the steady state.
func steadyState(msgs uint64, steady float64) bool {
	return float64(msgs) >= 0.75*steady && float64(msgs) <= 1.25*steady
}

// stalls returns, for each interval of rows that breaks the rule, why.
func (r stallRule) stalls(rows []expiryRow, offered float64) []string {
	var out []string
	for _, row := range rows {
		var why []string
		if row.max > r.MaxLatency {
			why = append(why, fmt.Sprintf("max latency %s > %s", ms(row.max), r.MaxLatency))
		}
		if row.rate < r.MinRate*offered {
			why = append(why, fmt.Sprintf("rate %.0f/s < %.0f/s", row.rate, r.MinRate*offered))
		}
		if row.failed > 0 {
			why = append(why, fmt.Sprintf("%d operations failed", row.failed))
		}
		if len(why) > 0 {
			out = append(out, fmt.Sprintf("t=%s–%s: %s", row.from.Round(time.Second), row.to.Round(time.Second), strings.Join(why, ", ")))
		}
	}
	return out
}

// latencyAcc collects the latencies of the operations that finish in the
// current interval.
type latencyAcc struct {
	mu     sync.Mutex
	lat    []time.Duration
	failed int
}

func (a *latencyAcc) add(d time.Duration, err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.lat = append(a.lat, d)
	if err != nil {
		a.failed++
	}
}

// take returns what was collected since the last take.
func (a *latencyAcc) take() ([]time.Duration, int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	lat, failed := a.lat, a.failed
	a.lat, a.failed = nil, 0
	return lat, failed
}

// openLoopLoad calls op(k, scheduled) for the k-th operation at start +
// k/rate, for duration, each on its own goroutine, at most inflight at once:
// one past that waits for a free place (its latency, taken from scheduled,
// still counts the wait). It returns when every operation started has
// returned, or ctx is done.
func openLoopLoad(ctx context.Context, start time.Time, duration time.Duration, rate float64, inflight int, op func(k int, scheduled time.Time)) {
	period := time.Duration(float64(time.Second) / rate)
	n := int(duration / period)
	sem := make(chan struct{}, inflight)
	var wg sync.WaitGroup
	defer wg.Wait()
	for k := range n {
		at := start.Add(time.Duration(k) * period)
		if d := time.Until(at); d > 0 {
			time.Sleep(d)
		}
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			return
		}
		wg.Go(func() {
			defer func() { <-sem }()
			op(k, at)
		})
	}
}

// markerTTL sets the delete-marker TTL of the ledger's streams to override
// when it is positive, and returns the TTL in force.
func markerTTL(ctx context.Context, js jetstream.JetStream, streams []string, override time.Duration) (time.Duration, error) {
	var ttl time.Duration
	for _, name := range streams {
		s, err := js.Stream(ctx, name)
		if err != nil {
			return 0, err
		}
		cfg := s.CachedInfo().Config
		if override > 0 && cfg.SubjectDeleteMarkerTTL != override {
			cfg.SubjectDeleteMarkerTTL = override
			if _, err := js.UpdateStream(ctx, cfg); err != nil {
				return 0, fmt.Errorf("marker ttl of %s: %w", name, err)
			}
		}
		ttl = cfg.SubjectDeleteMarkerTTL
	}
	return ttl, nil
}

// ledgerState is the messages and bytes of the ledger's streams.
func ledgerState(ctx context.Context, js jetstream.JetStream, streams []string) (msgs, bytes uint64, err error) {
	for _, name := range streams {
		s, err := js.Stream(ctx, name)
		if err != nil {
			return 0, 0, err
		}
		st := s.CachedInfo().State
		msgs += st.Msgs
		bytes += st.Bytes
	}
	return msgs, bytes, nil
}
