package worker

import (
	"context"
	"fmt"
	"sync"

	"golang.org/x/time/rate"

	"github.com/idemgate/idemgate/pkg/effects"
	"github.com/idemgate/idemgate/pkg/intent"
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

// limit applies this worker's limits to an admitted intent, so that it may
// go on (ok): a session over its rate is answered rate_limited and nothing
// is done; an intent of a tool at its max_in_flight cap waits for a slot
// (toolSlot).
func (w *Worker) limit(stop context.Context, j *job) (h handled, ok bool) {
	if !w.limits.allow(j.env.Session) {
		w.obs.limited(j, "session_rate")
		res := intent.Rejected(intent.CodeRateLimited, fmt.Sprintf(
			"session %q is over its rate of %g intents/s: nothing was done; retry later with the same key", j.env.Session, w.cfg.SessionRate))
		res.Key, res.Tool, res.Fingerprint, res.CallID = j.id.Key, j.env.Tool, j.id.Fingerprint, j.env.CallID
		return answered(res, ack()), false
	}
	if err := w.toolSlot(stop, j); err != nil {
		return unanswered(requeue(0, "worker stopping while the intent waited for its tool")), false
	}
	return handled{}, true
}

// toolSlot takes a slot of j's tool when the tool is capped
// (effects.Policy.MaxInFlight), waiting while it is at its cap: back-pressure
// delays an intent, it never ends one. A waiting intent is held
// (InProgress: no delivery is spent) and, while the worker's queue has room,
// gives its concurrency slot back, so that other tools' intents go on
// meanwhile; past that room it waits in its slot, and the worker takes no
// more intents until one finishes. The slot taken is j's (seat.tool) until
// it is settled. The error is stop's, when the worker stops first.
func (w *Worker) toolSlot(stop context.Context, j *job) error {
	ch, capped := w.slots[j.env.Tool]
	if !capped {
		return nil
	}
	select {
	case ch <- struct{}{}:
		j.seat.tool = ch
		return nil
	default:
	}
	w.obs.limited(j, "tool_in_flight")
	j.detach() // the intent's keep-alive holds its message meanwhile
	select {
	case w.queued <- struct{}{}:
		defer func() { <-w.queued }()
		w.free(j)
	default:
	}
	select {
	case ch <- struct{}{}:
		j.seat.tool = ch
		return nil
	case <-stop.Done():
		return stop.Err()
	}
}
