package jsbackend

import (
	"context"
	"testing"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/stretchr/testify/require"
)

// A batch refused as a whole is sent again after 1, 2, 4 and 8ms, then its
// writes go out one by one.
func TestBatchPauses(t *testing.T) {
	t.Parallel()
	b := batchPauses()
	var got []time.Duration
	for d := b.NextBackOff(); d != backoff.Stop; d = b.NextBackOff() {
		got = append(got, d)
		require.LessOrEqual(t, len(got), maxBatchPauses, "no end to the pauses")
	}
	require.Equal(t, []time.Duration{time.Millisecond, 2 * time.Millisecond, 4 * time.Millisecond, 8 * time.Millisecond}, got)
}

// A compare-and-set refused while its revision is still the latest is sent
// again after 1ms, doubling up to 100ms; the pauses end only with their
// context (casRetryFor bounds them in Update).
func TestCASPauses(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(t.Context())
	b := casPauses(ctx)
	var got []time.Duration
	for range 10 {
		got = append(got, b.NextBackOff())
	}
	ms := time.Millisecond
	require.Equal(t, []time.Duration{1 * ms, 2 * ms, 4 * ms, 8 * ms, 16 * ms, 32 * ms, 64 * ms, 100 * ms, 100 * ms, 100 * ms}, got)
	cancel()
	require.Equal(t, backoff.Stop, b.NextBackOff(), "the pauses end with their context")
}

// A scan's pull that came back empty is sent again after 1ms, doubling up
// to 128ms, maxScanRetries times; the pauses end early with their context.
func TestScanPauses(t *testing.T) {
	t.Parallel()
	b := scanPauses(t.Context())
	var got []time.Duration
	for d := b.NextBackOff(); d != backoff.Stop; d = b.NextBackOff() {
		got = append(got, d)
		require.LessOrEqual(t, len(got), maxScanRetries, "no end to the pauses")
	}
	ms := time.Millisecond
	require.Equal(t, []time.Duration{1 * ms, 2 * ms, 4 * ms, 8 * ms, 16 * ms, 32 * ms, 64 * ms, 128 * ms}, got)

	ctx, cancel := context.WithCancel(t.Context())
	b = scanPauses(ctx)
	require.Equal(t, ms, b.NextBackOff())
	cancel()
	require.Equal(t, backoff.Stop, b.NextBackOff(), "the pauses end with their context")
}
