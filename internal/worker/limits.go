package worker

import (
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

// take reserves a slot for tool; ok is false when the tool is at its cap.
// release gives the slot back.
func (s toolSlots) take(tool string) (release func(), ok bool) {
	ch, capped := s[tool]
	if !capped {
		return func() {}, true
	}
	select {
	case ch <- struct{}{}:
		return func() { <-ch }, true
	default:
		return nil, false
	}
}
