// Package retry holds the one pause policy idemgate's own retry loops share
// (talking to the ledger, the audit stream, the catalogue): a pause that
// doubles from a first to a longest one, without jitter, for as long as a
// context lasts — an ExponentialBackOff of github.com/cenkalti/backoff/v4 —
// its randomized twin for writers that contend (Spread), and the wait
// between two tries.
package retry

import (
	"context"
	"time"

	"github.com/cenkalti/backoff/v4"
)

// Doubling returns a backoff whose pauses are first, then twice the one
// before, up to most, and that stops (backoff.Stop) once ctx is done; it has
// no jitter and no bound on the time spent. Wrap it in backoff.WithMaxRetries
// to bound the tries.
func Doubling(ctx context.Context, first, most time.Duration) backoff.BackOffContext {
	return backoff.WithContext(backoff.NewExponentialBackOff(
		backoff.WithInitialInterval(first),
		backoff.WithMultiplier(2),
		backoff.WithRandomizationFactor(0),
		backoff.WithMaxInterval(most),
		backoff.WithMaxElapsedTime(0),
	), ctx)
}

// Spread returns a backoff whose pauses are drawn uniformly from [0, d],
// where d is first, then twice the one before, up to most — a spread that
// keeps contending writers from trying again in step — and that stops
// (backoff.Stop) once ctx is done; it has no bound on the time spent. It is
// an ExponentialBackOff whose intervals double from first/2 to most/2 with
// RandomizationFactor 1 (a pause is within 100% of the interval), so an odd
// nanosecond of first or most is lost.
func Spread(ctx context.Context, first, most time.Duration) backoff.BackOffContext {
	return backoff.WithContext(backoff.NewExponentialBackOff(
		backoff.WithInitialInterval(first/2),
		backoff.WithMultiplier(2),
		backoff.WithRandomizationFactor(1),
		backoff.WithMaxInterval(most/2),
		backoff.WithMaxElapsedTime(0),
	), ctx)
}

// Wait pauses for b's next pause and reports whether to try again: false,
// at once, when b stops, or when ctx is done before the pause is over.
func Wait(ctx context.Context, b backoff.BackOff) bool {
	d := b.NextBackOff()
	if d == backoff.Stop {
		return false
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
