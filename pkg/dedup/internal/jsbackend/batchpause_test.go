package jsbackend

import (
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
