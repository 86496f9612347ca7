package worker

import (
	"context"
	"errors"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/idemgate/idemgate/pkg/effects"
	"github.com/idemgate/idemgate/pkg/intent"
)

// direct fires a tool that does not use the ledger (reads, and idempotent
// writes configured with ledger: false). Identical reads in flight on this
// worker are coalesced into one call; their callers share its answer.
func (w *Worker) direct(work context.Context, j *job) handled {
	j.detach() // the effect runs on the handler's goroutine; the intent's keep-alive holds its message
	fire := func() (effects.Outcome, error) {
		return j.tool.Effect.Fire(work, effects.Call{
			Key: j.id.Key, Tool: j.env.Tool, Session: j.env.Session, CallID: j.env.CallID, Args: j.env.Args, Attempt: 1, Holder: w.cfg.Holder,
			Trace: traceHeaders(work),
		})
	}
	var out effects.Outcome
	var err error
	shared := false
	if j.tool.Policy.Class == intent.ClassRead {
		out, err, shared = w.reads.do(j.id.Key, fire)
	} else {
		out, err = fire()
	}
	o := w.outcomeOf(j, out.Result, err)
	w.obs.directed(j, o, shared)

	res := intent.Result{
		Key: j.id.Key, Tool: j.env.Tool, Replayed: shared, Fingerprint: j.id.Fingerprint,
		Attempts: out.Invocations, CallID: j.env.CallID, CompletedAt: time.Now().UTC(),
	}
	switch o.kind {
	case outcomeDone:
		res.Status, res.Result = intent.StatusCompleted, o.result
	case outcomeFailed:
		res.Status, res.Error = intent.StatusFailed, &o.err
	default:
		w.log.Info("effect failed transiently", zap.String("tool", j.env.Tool), zap.Error(o.cause))
		return unanswered(nak(w.retryDelay(j.meta.NumDelivered), "effect failed transiently"))
	}
	return answered(res, ack())
}

// coalescer runs one call per key at a time; callers that arrive while a
// call for their key is in flight share its outcome.
type coalescer struct {
	mu    sync.Mutex
	calls map[string]*flight
}

type flight struct {
	done    chan struct{}
	out     effects.Outcome
	err     error
	waiting int // callers sharing this call; guarded by coalescer.mu
}

var errFlightAborted = errors.New("worker: coalesced call did not finish")

// do runs fn for key, or waits for the call in flight; shared reports the
// latter.
func (c *coalescer) do(key string, fn func() (effects.Outcome, error)) (out effects.Outcome, err error, shared bool) {
	c.mu.Lock()
	if f, ok := c.calls[key]; ok {
		f.waiting++
		c.mu.Unlock()
		<-f.done
		return f.out, f.err, true
	}
	if c.calls == nil {
		c.calls = map[string]*flight{}
	}
	f := &flight{done: make(chan struct{}), err: errFlightAborted}
	c.calls[key] = f
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		delete(c.calls, key)
		c.mu.Unlock()
		close(f.done)
	}()
	f.out, f.err = fn()
	return f.out, f.err, false
}

// sharing reports how many callers wait on calls in flight.
func (c *coalescer) sharing() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, f := range c.calls {
		n += f.waiting
	}
	return n
}
