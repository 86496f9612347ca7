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
