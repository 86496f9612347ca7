package worker

import (
	"context"
	"sync"

	"golang.org/x/time/rate"

	"github.com/idemgate/idemgate/pkg/effects"
)

// maxSessionLimiters bounds the per-session limiters kept: past it the oldest
// generation is dropped (a session then starts with a full burst again).
const maxSessionLimiters = 100_000

// sessionLimits rate-limits intents per session (the key's tenant scope) on
// this worker.
type sessionLimits struct {
	every rate.Limit
	burst int
	mu    sync.Mutex
	cur   map[string]*rate.Limiter
	prev  map[string]*rate.Limiter
}

func newSessionLimits(perSecond float64, burst int) *sessionLimits {
	if perSecond <= 0 {
		return nil
	}
	if burst < 1 {
		burst = max(1, int(perSecond))
	}
	return &sessionLimits{every: rate.Limit(perSecond), burst: burst, cur: map[string]*rate.Limiter{}}
}

// allow reports whether session may send one more intent now. A nil
// sessionLimits allows everything.
func (s *sessionLimits) allow(session string) bool {
	if s == nil {
		return true
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	l, ok := s.cur[session]
	if !ok {
		if l, ok = s.prev[session]; !ok {
			l = rate.NewLimiter(s.every, s.burst)
		}
		if len(s.cur) >= maxSessionLimiters {
			s.prev, s.cur = s.cur, map[string]*rate.Limiter{}
		}
		s.cur[session] = l
	}
	return l.Allow()
}

// toolSlots caps the intents of each tool handled at once on this worker
// (effects.Policy.MaxInFlight).
type toolSlots map[string]chan struct{}

func newToolSlots(reg *effects.Registry) toolSlots {
	slots := toolSlots{}
	for _, name := range reg.Names() {
		if t, _ := reg.Lookup(name); t.Policy.MaxInFlight > 0 {
			slots[name] = make(chan struct{}, t.Policy.MaxInFlight)
		}
	}
	return slots
}

// toolSlot takes a slot of j's tool when the tool is capped
// (effects.Policy.MaxInFlight), waiting while it is at its cap: back-pressure
// delays an intent, it never ends one. A waiting intent is held
// (InProgress: no delivery is spent) and, while the worker's queue has room,
// gives its handler's concurrency slot back, so that other tools' intents go
// on meanwhile; past that room it waits in its slot, and the worker takes no
// more intents until one finishes. release gives the tool's slot back. The
// error is stop's, when the worker stops first.
func (w *Worker) toolSlot(stop context.Context, j *job) (release func(), err error) {
	ch, capped := w.slots[j.env.Tool]
	if !capped {
		return func() {}, nil
	}
	release = func() { <-ch }
	select {
	case ch <- struct{}{}:
		return release, nil
	default:
	}
	w.m.limited.WithLabelValues(j.env.Tool, "tool_in_flight").Inc()
	j.detach()
	halt := w.beats.hold(stop, j.msg, w.cfg.AckWait/3)
	defer halt()
	select {
	case w.queued <- struct{}{}:
		defer func() { <-w.queued }()
		if j.free != nil {
			j.free()
		}
	default:
	}
	select {
	case ch <- struct{}{}:
		return release, nil
	case <-stop.Done():
		return nil, stop.Err()
	}
}
