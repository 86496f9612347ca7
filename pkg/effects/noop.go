package effects

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/idemgate/idemgate/pkg/intent"
)

// NoopConfig configures a noop effect. The zero value answers at once with
// the echo result.
type NoopConfig struct {
	// Delay is how long each Fire takes (it returns early when its ctx is
	// done). Default 0.
	Delay time.Duration
	// Result is the JSON result of every Fire. Default (nil): the call's args
	// echoed back, {"echo": <args>}.
	Result json.RawMessage
}

// Noop is the effect that does nothing outside the process: it answers with
// a fixed result or echoes its args, optionally after a delay. Demos,
// benchmarks and tests of slow effects use it.
type Noop struct {
	delay  time.Duration
	result json.RawMessage
}

// NewNoop returns a noop effect for cfg, or an error joining a
// *SettingError for every invalid field: Delay must not be negative and
// Result, when set, must be valid JSON.
func NewNoop(cfg NoopConfig) (*Noop, error) {
	var errs []error
	if cfg.Delay < 0 {
		errs = append(errs, &SettingError{Kind: intent.EffectNoop, Field: "delay", Problem: fmt.Sprintf("%s is negative", cfg.Delay), Hint: "write e.g. 100ms"})
	}
	if cfg.Result != nil && !json.Valid(cfg.Result) {
		errs = append(errs, &SettingError{Kind: intent.EffectNoop, Field: "result", Problem: "is not valid JSON", Hint: `write e.g. {"ok": true}`})
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return &Noop{delay: cfg.Delay, result: cfg.Result}, nil
}

// Fire waits the delay, then returns the configured result, or {"echo":
// <args>}, with Invocations 1. When ctx is done during the delay it returns
// ctx's error (transient) with Invocations 0: nothing was done.
func (n *Noop) Fire(ctx context.Context, call Call) (Outcome, error) {
	if err := sleep(ctx, n.delay); err != nil {
		return Outcome{}, fmt.Errorf("noop: %w", err)
	}
	if n.result != nil {
		return Outcome{Result: n.result, Invocations: 1}, nil
	}
	args := call.Args
	if len(args) == 0 {
		args = json.RawMessage("null")
	}
	res := make([]byte, 0, len(args)+10)
	res = append(res, `{"echo":`...)
	res = append(res, args...)
	res = append(res, '}')
	return Outcome{Result: res, Invocations: 1}, nil
}

// MaxDuration is the delay.
func (n *Noop) MaxDuration() time.Duration { return n.delay }
