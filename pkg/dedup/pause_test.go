package dedup

import (
	"context"
	"testing"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/stretchr/testify/require"
)

// Forget judges a record again after 1ms, doubling, once a round
// (maxDecideRounds); the pauses end early with their context.
func TestForgetPauses(t *testing.T) {
	t.Parallel()
	b := forgetPauses(t.Context())
	var got []time.Duration
	for d := b.NextBackOff(); d != backoff.Stop; d = b.NextBackOff() {
		got = append(got, d)
		require.LessOrEqual(t, len(got), maxDecideRounds, "no end to the pauses")
	}
	ms := time.Millisecond
	require.Equal(t, []time.Duration{1 * ms, 2 * ms, 4 * ms, 8 * ms, 16 * ms, 32 * ms, 64 * ms, 128 * ms}, got)

	ctx, cancel := context.WithCancel(t.Context())
	b = forgetPauses(ctx)
	require.Equal(t, ms, b.NextBackOff())
	cancel()
	require.Equal(t, backoff.Stop, b.NextBackOff(), "the pauses end with their context")
}

// A spend reads a count again after a pause uniform in [0, d], d 1ms
// doubling up to 32ms, once a round (maxSpendRounds); the pauses end early
// with their context.
func TestSpendPauses(t *testing.T) {
	t.Parallel()
	const draws = 500
	lows, highs := make([]int, maxSpendRounds), make([]int, maxSpendRounds)
	for range draws {
		b := spendPauses(t.Context())
		n := 0
		for d := b.NextBackOff(); d != backoff.Stop; d = b.NextBackOff() {
			require.Less(t, n, maxSpendRounds, "no end to the pauses")
			bound := time.Millisecond << min(n, 5)
			require.GreaterOrEqual(t, d, time.Duration(0), "pause %d", n)
			require.LessOrEqual(t, d, bound, "pause %d", n)
			if d < bound/4 {
				lows[n]++
			}
			if d > bound*3/4 {
				highs[n]++
			}
			n++
		}
		require.Equal(t, maxSpendRounds, n, "one pause a round")
	}
	for n := range maxSpendRounds {
		// A quarter of the draws expected in each: 500 draws miss a
		// tenth only by a fault.
		require.Greater(t, lows[n], draws/10, "pause %d: too few in [0, d/4)", n)
		require.Greater(t, highs[n], draws/10, "pause %d: too few in (3d/4, d]", n)
	}

	ctx, cancel := context.WithCancel(t.Context())
	b := spendPauses(ctx)
	require.NotEqual(t, backoff.Stop, b.NextBackOff())
	cancel()
	require.Equal(t, backoff.Stop, b.NextBackOff(), "the pauses end with their context")
}
