package retry

import (
	"context"
	"testing"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/stretchr/testify/require"
)

func TestDoublingDoublesUpToMost(t *testing.T) {
	t.Parallel()
	b := Doubling(t.Context(), 100*time.Millisecond, time.Second)
	var got []time.Duration
	for range 6 {
		got = append(got, b.NextBackOff())
	}
	require.Equal(t, []time.Duration{
		100 * time.Millisecond, 200 * time.Millisecond, 400 * time.Millisecond,
		800 * time.Millisecond, time.Second, time.Second,
	}, got)
	b.Reset()
	require.Equal(t, 100*time.Millisecond, b.NextBackOff(), "Reset starts again at first")
}

func TestDoublingStopsWithItsContext(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(t.Context())
	b := Doubling(ctx, time.Millisecond, time.Second)
	require.Equal(t, time.Millisecond, b.NextBackOff())
	cancel()
	require.Equal(t, backoff.Stop, b.NextBackOff())
}

func TestWaitEndsWithItsContext(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	// A pause of an hour: Wait returns only because ctx is done.
	require.False(t, Wait(ctx, backoff.NewConstantBackOff(time.Hour)))
}

func TestWaitStopsWhenTheBackoffDoes(t *testing.T) {
	t.Parallel()
	b := backoff.WithMaxRetries(Doubling(t.Context(), 0, 0), 2)
	require.True(t, Wait(t.Context(), b))
	require.True(t, Wait(t.Context(), b))
	require.False(t, Wait(t.Context(), b), "the third pause is past WithMaxRetries(2)")
}

// Spread's pauses are uniform in [0, d], d doubling from first up to most:
// over many draws each step stays within its bound and reaches both its
// lower and its upper quarter.
func TestSpreadIsUniformBelowADoublingBound(t *testing.T) {
	t.Parallel()
	const draws = 2000
	bounds := []time.Duration{
		time.Millisecond, 2 * time.Millisecond, 4 * time.Millisecond,
		8 * time.Millisecond, 8 * time.Millisecond,
	}
	lows, highs := make([]int, len(bounds)), make([]int, len(bounds))
	for range draws {
		b := Spread(t.Context(), time.Millisecond, 8*time.Millisecond)
		for i, d := range bounds {
			p := b.NextBackOff()
			require.GreaterOrEqual(t, p, time.Duration(0), "pause %d", i)
			require.LessOrEqual(t, p, d, "pause %d", i)
			if p < d/4 {
				lows[i]++
			}
			if p > d*3/4 {
				highs[i]++
			}
		}
	}
	for i := range bounds {
		// A quarter of the draws expected in each: 2000 draws miss a
		// tenth only by a fault.
		require.Greater(t, lows[i], draws/10, "pause %d: too few in [0, d/4)", i)
		require.Greater(t, highs[i], draws/10, "pause %d: too few in (3d/4, d]", i)
	}
}

func TestSpreadStopsWithItsContext(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(t.Context())
	b := Spread(ctx, time.Millisecond, time.Second)
	require.NotEqual(t, backoff.Stop, b.NextBackOff())
	cancel()
	require.Equal(t, backoff.Stop, b.NextBackOff())
}
