package effects

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/cenkalti/backoff/v4"

	"github.com/idemgate/idemgate/pkg/effects/internal/text"
)

// Retry defaults, shared by every effect that retries (webhook, smtp, nats,
// mcp).
const (
	// DefaultMaxAttempts is how many attempts (requests, transactions,
	// calls) one Fire makes at most.
	DefaultMaxAttempts = 4
	// DefaultInitialInterval is the wait before the first retry.
	DefaultInitialInterval = 200 * time.Millisecond
	// DefaultMaxInterval caps every wait between retries, Retry-After included.
	DefaultMaxInterval = 5 * time.Second
)

// RetryPolicy is how an effect retries within one Fire. The zero value means
// the defaults.
type RetryPolicy struct {
	// MaxAttempts is how many attempts one Fire makes at most, the first
	// included; 1 disables retries. Default DefaultMaxAttempts.
	MaxAttempts int
	// InitialInterval is the wait before the first retry; later waits grow
	// exponentially (x1.5, ±50% jitter). Default DefaultInitialInterval.
	InitialInterval time.Duration
	// MaxInterval caps every wait, including one a Retry-After header asks
	// for. Default DefaultMaxInterval.
	MaxInterval time.Duration
}

// WithDefaults returns p with its zero fields set to the defaults.
func (p RetryPolicy) WithDefaults() RetryPolicy {
	if p.MaxAttempts == 0 {
		p.MaxAttempts = DefaultMaxAttempts
	}
	if p.InitialInterval == 0 {
		p.InitialInterval = DefaultInitialInterval
	}
	if p.MaxInterval == 0 {
		p.MaxInterval = max(DefaultMaxInterval, p.InitialInterval)
	}
	return p
}

// Problems returns a *SettingError of an effect of kind for each invalid
// field of p, which has its defaults applied; the fields are named as in
// the tools file ("retry.max_attempts").
func (p RetryPolicy) Problems(kind string) []error {
	var errs []error
	add := func(field, problem, hint string) {
		errs = append(errs, &SettingError{Kind: kind, Field: field, Problem: problem, Hint: hint})
	}
	if p.MaxAttempts < 1 || p.MaxAttempts > 100 {
		add("retry.max_attempts", fmt.Sprintf("%d is not between 1 and 100", p.MaxAttempts), "write e.g. 4; 1 disables retries")
	}
	if p.InitialInterval < 0 {
		add("retry.initial_interval", "is negative", "write e.g. 200ms")
	}
	if p.MaxInterval < p.InitialInterval {
		add("retry.max_interval", fmt.Sprintf("%s is under initial_interval %s", text.FormatDuration(p.MaxInterval), text.FormatDuration(p.InitialInterval)), "make max_interval at least initial_interval")
	}
	return errs
}

// RetryAfter returns err, an attempt's transient error, with the wait the
// other side asked for before the next attempt (an HTTP Retry-After): Retry
// waits that long instead of its backoff, within the policy's MaxInterval.
func RetryAfter(err error, wait time.Duration) error {
	return &retryAfterError{err: err, wait: wait}
}

type retryAfterError struct {
	err  error
	wait time.Duration
}

func (e *retryAfterError) Error() string { return e.err.Error() }
func (e *retryAfterError) Unwrap() error { return e.err }

// Retry runs attempt, one call to the outside world, until it succeeds,
// fails permanently (a *PermanentError) or ctx is done, at most
// policy.MaxAttempts times, waiting between attempts with exponential
// backoff (or as RetryAfter asks). policy has its defaults applied. The
// Outcome counts the attempts and holds the result of the one that
// succeeded. Context errors are wrapped with what (e.g. "smtp relay:25");
// exhausted retries wrap ErrExhausted and the last error, with the count of
// attempts in unit ("request", "transaction"; pluralised as needed).
func Retry(ctx context.Context, policy RetryPolicy, what, unit string, attempt func(ctx context.Context) (json.RawMessage, error)) (Outcome, error) {
	exp := backoff.NewExponentialBackOff(
		backoff.WithInitialInterval(policy.InitialInterval),
		backoff.WithMaxInterval(policy.MaxInterval),
		backoff.WithMaxElapsedTime(0),
	)
	b := backoff.WithContext(backoff.WithMaxRetries(exp, uint64(policy.MaxAttempts-1)), ctx)
	b.Reset()

	var out Outcome
	for {
		if err := ctx.Err(); err != nil {
			return out, fmt.Errorf("%s: %w", what, err)
		}
		out.Invocations++
		result, err := attempt(ctx)
		asked := time.Duration(-1)
		if ra, ok := errors.AsType[*retryAfterError](err); ok {
			err, asked = ra.err, ra.wait
		}
		if err == nil {
			out.Result = result
			return out, nil
		}
		if _, perm := IsPermanent(err); perm {
			return out, err
		}
		if ctxErr := ctx.Err(); ctxErr != nil {
			return out, fmt.Errorf("%s: %w", what, ctxErr)
		}
		wait := b.NextBackOff()
		if wait == backoff.Stop {
			if ctxErr := ctx.Err(); ctxErr != nil {
				return out, fmt.Errorf("%s: %w", what, ctxErr)
			}
			if out.Invocations != 1 {
				unit += "s"
			}
			return out, fmt.Errorf("%w after %d %s: %w", ErrExhausted, out.Invocations, unit, err)
		}
		if asked >= 0 {
			wait = asked
		}
		if err := sleep(ctx, min(wait, policy.MaxInterval)); err != nil {
			return out, fmt.Errorf("%s: %w", what, err)
		}
	}
}

// sleep waits d or until ctx is done.
func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
