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

// retryDefaults fills the zero fields of a retry policy with the defaults.
func retryDefaults(r RetryPolicy) RetryPolicy {
	if r.MaxAttempts == 0 {
		r.MaxAttempts = DefaultMaxAttempts
	}
	if r.InitialInterval == 0 {
		r.InitialInterval = DefaultInitialInterval
	}
	if r.MaxInterval == 0 {
		r.MaxInterval = max(DefaultMaxInterval, r.InitialInterval)
	}
	return r
}

// retryProblems validates a retry policy with its defaults applied; the
// fields are named as in the tools file.
func retryProblems(r RetryPolicy) []problem {
	var ps []problem
	if r.MaxAttempts < 1 || r.MaxAttempts > 100 {
		ps = append(ps, problem{"retry.max_attempts", fmt.Sprintf("%d is not between 1 and 100", r.MaxAttempts), "write e.g. 4; 1 disables retries"})
	}
	if r.InitialInterval < 0 {
		ps = append(ps, problem{"retry.initial_interval", "is negative", "write e.g. 200ms"})
	}
	if r.MaxInterval < r.InitialInterval {
		ps = append(ps, problem{"retry.max_interval", fmt.Sprintf("%s is under initial_interval %s", text.FormatDuration(r.MaxInterval), text.FormatDuration(r.InitialInterval)), "make max_interval at least initial_interval"})
	}
	return ps
}

// readRetry reads a "retry:" block the way the webhook's is read, reporting
// an explicit zero (which would mean "default" in code) as a mistake.
func readRetry(s *section) RetryPolicy {
	r := s.Section("retry")
	p := RetryPolicy{
		MaxAttempts:     r.Int("max_attempts", DefaultMaxAttempts),
		InitialInterval: r.Duration("initial_interval", DefaultInitialInterval),
		MaxInterval:     r.Duration("max_interval", DefaultMaxInterval),
	}
	for _, f := range []struct {
		name string
		zero bool
		hint string
	}{
		{"max_attempts", p.MaxAttempts == 0, "write e.g. 4; 1 disables retries"},
		{"initial_interval", p.InitialInterval == 0, "write e.g. 200ms"},
		{"max_interval", p.MaxInterval == 0, "write e.g. 5s"},
	} {
		if f.zero && r.Has(f.name) {
			r.Invalid(f.name, "must be positive", f.hint)
		}
	}
	return p
}

// positiveDuration reads a duration field that must not be written as zero
// (zero means "default" in code).
func positiveDuration(s *section, name string, def time.Duration) time.Duration {
	d := s.Duration(name, def)
	if d == 0 && s.Has(name) {
		s.Invalid(name, "must be positive", "write e.g. "+text.FormatDuration(def))
	}
	return d
}

// attemptFunc makes one call to the outside world. It returns the result on
// success; otherwise an error, a *PermanentError when retrying cannot help.
type attemptFunc func(ctx context.Context) (json.RawMessage, error)

// retryAfterError is an attempt's transient error together with the wait the
// other side asked for before the next attempt (an HTTP Retry-After); the
// retry loop waits that long instead of its backoff, within MaxInterval.
type retryAfterError struct {
	err  error
	wait time.Duration
}

func (e *retryAfterError) Error() string { return e.err.Error() }
func (e *retryAfterError) Unwrap() error { return e.err }

// retryLoop runs attempt up to policy.MaxAttempts times with exponential
// backoff (or the wait a *retryAfterError asks for), and counts the attempts
// in the Outcome.
// Context errors are wrapped with what (e.g. "smtp relay:25"); exhausted
// retries wrap ErrExhausted and the last error, with the count of attempts
// in unit ("request", "transaction"; pluralised as needed).
func retryLoop(ctx context.Context, policy RetryPolicy, what, unit string, attempt attemptFunc) (Outcome, error) {
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
