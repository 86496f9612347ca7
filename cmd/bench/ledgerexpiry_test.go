package main

import (
	"bytes"
	"context"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestLedgerExpiryShort fills a ledger with a few thousand keys of a
// 3-second retention, offers new keys for a few seconds and checks that every
// interval has finite figures, no operation failed and the first wave really
// expired: the ledger's messages fell far below the keys filled. It asserts no
// speed. Not parallel: the scenario counts writes retried in the fill's
// package counters, which the ledger-size scenario shares.
func TestLedgerExpiryShort(t *testing.T) {
	if testing.Short() {
		t.Skip("builds nats-server")
	}
	server := natsServerBinary(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	c := ledgerExpiryConfig{Server: server, Keys: 3000, Concurrency: 32, Partitions: 2, ResultBytes: 48,
		TTL: 3 * time.Second, MarkerTTL: time.Second, Rate: 50, Interval: time.Second, Inflight: 256,
		Stall: stallRule{MaxLatency: time.Second, MinRate: 0.5}, StoreDir: t.TempDir()}
	require.NoError(t, c.validate())
	var buf bytes.Buffer
	res, err := runLedgerExpiry(ctx, c, &buf)
	t.Log("\n" + buf.String())
	require.NoError(t, err)
	require.Equal(t, time.Second, res.markerTTL)
	require.GreaterOrEqual(t, len(res.rows), 3)
	var peak uint64
	ops := 0
	for _, r := range res.rows {
		require.Zerof(t, r.failed, "interval to %s: failed operations", r.to)
		for _, f := range []float64{r.rate, r.p50.Seconds(), r.p99.Seconds(), r.max.Seconds(), float64(r.heap), float64(r.rss)} {
			require.Truef(t, finitePositive(f), "interval to %s: figure %v", r.to, f)
		}
		peak = max(peak, r.msgs)
		ops += r.ops
	}
	final := res.rows[len(res.rows)-1]
	require.Equal(t, phaseSteady, final.phase)
	require.GreaterOrEqual(t, peak, uint64(c.Keys/2), "the first wave was in the ledger")
	require.Less(t, final.msgs, uint64(c.Keys/4), "the first wave's records and markers expired")
	want := int(c.Rate * (res.rows[len(res.rows)-1].to.Seconds()))
	require.InDelta(t, want, ops, math.Max(5, 0.1*float64(want)), "the load offered rate × duration operations")
	require.Contains(t, buf.String(), "verdict: ")
}

// TestStallRule checks the verdict's rule on made-up intervals: steady ones
// pass; one slow operation, a rate collapse or a failed operation is a stall.
func TestStallRule(t *testing.T) {
	t.Parallel()
	rule := stallRule{MaxLatency: time.Second, MinRate: 0.5}
	steady := func(from int) expiryRow {
		return expiryRow{from: time.Duration(from) * 5 * time.Second, to: time.Duration(from+1) * 5 * time.Second,
			ops: 25000, rate: 5000, p50: 2 * time.Millisecond, p99: 20 * time.Millisecond, max: 80 * time.Millisecond}
	}
	rows := []expiryRow{steady(0), steady(1), steady(2), steady(3)}
	require.Empty(t, rule.stalls(rows, 5000))

	stalled := slices.Clone(rows)
	stalled[2].max = 3 * time.Second
	got := rule.stalls(stalled, 5000)
	require.Len(t, got, 1)
	require.Contains(t, got[0], "t=10s–15s: max latency 3000.00ms > 1s")

	slow := slices.Clone(rows)
	slow[1].rate = 2000
	got = rule.stalls(slow, 5000)
	require.Len(t, got, 1)
	require.Contains(t, got[0], "rate 2000/s < 2500/s")

	edge := slices.Clone(rows)
	edge[1].rate, edge[2].max = 2500, time.Second
	require.Empty(t, rule.stalls(edge, 5000), "at the limits is no stall")

	failed := slices.Clone(rows)
	failed[3].failed = 1
	got = rule.stalls(failed, 5000)
	require.Len(t, got, 1)
	require.Contains(t, got[0], "1 operations failed")
}

// The verdict judges the intervals in which the first wave expires: a stall
// there fails the run; a pause of the same load before or after the expiry
// (the run's own control) is reported, not held against the expiry; a run
// that measured no interval of the expiry gives no verdict of no stall.
func TestExpiryVerdictJudgesTheExpiry(t *testing.T) {
	t.Parallel()
	c := ledgerExpiryConfig{Rate: 1000, TTL: time.Minute, Stall: stallRule{MaxLatency: time.Second, MinRate: 0.5}}
	row := func(i int, phase string) expiryRow {
		return expiryRow{from: time.Duration(i) * 5 * time.Second, to: time.Duration(i+1) * 5 * time.Second, phase: phase,
			ops: 5000, rate: 1000, p50: time.Millisecond, p99: 20 * time.Millisecond, max: 80 * time.Millisecond}
	}
	rows := []expiryRow{row(0, phaseBefore), row(1, phaseBefore), row(2, phaseExpire), row(3, phaseExpire),
		row(4, phaseMarkers), row(5, phaseSteady)}
	verdict := func(rows []expiryRow) (string, string) {
		var out bytes.Buffer
		why := summarize(&out, expiryResult{rows: rows, markerTTL: time.Minute}, c)
		return why, out.String()
	}
	why, out := verdict(rows)
	require.Empty(t, why, out)
	require.Contains(t, out, "verdict: no stall")

	paused := slices.Clone(rows)
	paused[1].max, paused[5].max = 2*time.Second, 1500*time.Millisecond
	why, out = verdict(paused)
	require.Empty(t, why, "a pause outside the expiry is not the expiry's: %s", out)
	require.Contains(t, out, "outside the expiry (the same load, nothing expiring), 2 interval(s) broke the rule too: t=5s–10s: max latency 2000.00ms > 1s")

	for _, i := range []int{3, 4} {
		stalled := slices.Clone(rows)
		stalled[i].max = 3 * time.Second
		why, out = verdict(stalled)
		require.Contains(t, why, "max latency 3000.00ms > 1s", out)
		require.Contains(t, out, "verdict: stall")
	}

	slow := slices.Clone(rows)
	slow[2].rate = 400
	why, _ = verdict(slow)
	require.Contains(t, why, "rate 400/s < 500/s")

	why, out = verdict(rows[:2])
	require.Equal(t, "no interval of the expiry was measured", why, out)
}

// TestLedgerExpiryFlags checks that bad flags get a clear error before any
// server starts.
func TestLedgerExpiryFlags(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-rate", "0", "-nats-server", "/bin/true"}, "-rate 0"},
		{[]string{"-ttl", "500ms", "-nats-server", "/bin/true"}, "-ttl 500ms"},
		{[]string{"-marker-ttl", "10ms", "-nats-server", "/bin/true"}, "-marker-ttl 10ms"},
		{[]string{"-partitions", "3", "-nats-server", "/bin/true"}, "-partitions 3"},
		{[]string{"-stall-rate", "2", "-nats-server", "/bin/true"}, "-stall-rate 2"},
		{[]string{"-duration", "1s", "-nats-server", "/bin/true"}, "-duration 1s"},
		{[]string{"-nats-server", "/nonexistent/nats-server"}, "-nats-server /nonexistent/nats-server"},
	} {
		err := ledgerExpiryMain(context.Background(), tc.args, &bytes.Buffer{})
		require.ErrorContains(t, err, tc.want, "%v", tc.args)
	}
}

// TestNextEnd checks that the rows keep to the interval's grid and skip the
// ticks a slow reading of the server overran, never making a row of a
// sliver of time.
func TestNextEnd(t *testing.T) {
	t.Parallel()
	const iv = 5 * time.Second
	for _, tc := range []struct{ end, now, want time.Duration }{
		{5 * time.Second, 5*time.Second + 100*time.Millisecond, 10 * time.Second},
		{5 * time.Second, 9 * time.Second, 15 * time.Second},  // 10s is under half an interval away
		{5 * time.Second, 21 * time.Second, 25 * time.Second}, // 10s–20s overrun: skipped
		{5 * time.Second, 22*time.Second + 600*time.Millisecond, 30 * time.Second},
	} {
		require.Equalf(t, tc.want, nextEnd(tc.end, tc.now, iv), "end %s now %s", tc.end, tc.now)
	}
}
