// Package noop is the noop effect kind: it does nothing outside the
// process, answering a fixed result or its args, after an optional delay
// (see Effect). Demos, benchmarks and tests of slow effects use it.
package noop

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/idemgate/idemgate/pkg/effects"
	"github.com/idemgate/idemgate/pkg/intent"
)

// Config configures a noop effect. The zero value answers at once with
// the echo result.
type Config struct {
	// Delay is how long each Fire takes (it returns early when its ctx is
	// done). Default 0.
	Delay time.Duration
	// Result is the JSON result of every Fire. Default (nil): the call's args
	// echoed back, {"echo": <args>}.
	Result json.RawMessage
}

// Effect is the effect that does nothing outside the process: it answers with
// a fixed result or echoes its args, optionally after a delay. Demos,
// benchmarks and tests of slow effects use it.
type Effect struct {
	delay  time.Duration
	result json.RawMessage
}

// New returns a noop effect for cfg, or an error joining a
// *SettingError for every invalid field: Delay must not be negative and
// Result, when set, must be valid JSON.
func New(cfg Config) (*Effect, error) {
	var errs []error
	if cfg.Delay < 0 {
		errs = append(errs, &effects.SettingError{Kind: intent.EffectNoop, Field: "delay", Problem: fmt.Sprintf("%s is negative", cfg.Delay), Hint: "write e.g. 100ms"})
	}
	if cfg.Result != nil && !json.Valid(cfg.Result) {
		errs = append(errs, &effects.SettingError{Kind: intent.EffectNoop, Field: "result", Problem: "is not valid JSON", Hint: `write e.g. {"ok": true}`})
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return &Effect{delay: cfg.Delay, result: cfg.Result}, nil
}

// Fire waits the delay, then returns the configured result, or {"echo":
// <args>}, with Invocations 1. When ctx is done during the delay it returns
// ctx's error (transient) with Invocations 0: nothing was done.
func (n *Effect) Fire(ctx context.Context, call effects.Call) (effects.Outcome, error) {
	if err := n.wait(ctx); err != nil {
		return effects.Outcome{}, fmt.Errorf("noop: %w", err)
	}
	if n.result != nil {
		return effects.Outcome{Result: n.result, Invocations: 1}, nil
	}
	args := call.Args
	if len(args) == 0 {
		args = json.RawMessage("null")
	}
	res := make([]byte, 0, len(args)+10)
	res = append(res, `{"echo":`...)
	res = append(res, args...)
	res = append(res, '}')
	return effects.Outcome{Result: res, Invocations: 1}, nil
}

// wait waits the delay; it returns ctx's error when ctx is done first. A
// timer, not a context with a timeout: a waiting Fire then holds no child
// of ctx (a context, its registration with ctx, its channel).
func (n *Effect) wait(ctx context.Context) error {
	if n.delay <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(n.delay)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
	return ctx.Err()
}

// MaxDuration is the delay.
func (n *Effect) MaxDuration() time.Duration { return n.delay }
