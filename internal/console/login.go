package console

import (
	"net/http"
	"net/netip"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// Bounds of failed console logins.
const (
	// loginFailBurst failed logins from one source address are answered at
	// once; past them, the address gets one more every loginFailEvery, and
	// its logins are refused unchecked until then.
	loginFailBurst = 10
	loginFailEvery = time.Second
	// loginAddrs bounds the addresses remembered; past it, those whose
	// allowance is whole again are forgotten first.
	loginAddrs = 10000
)

// loginLimiter slows failed console logins per source address: what a
// token guesser cannot choose (it knows no token, and a TCP peer's address
// cannot be forged), so a flood of wrong tokens slows its own address only,
// and a client at another address logs in at once. Correct logins spend
// nothing.
type loginLimiter struct {
	mu sync.Mutex
	by map[netip.Prefix]*rate.Limiter
}

func newLoginLimiter() *loginLimiter {
	return &loginLimiter{by: map[netip.Prefix]*rate.Limiter{}}
}

// source is the address a request came from: its IPv4 address, or its
// IPv6 address's /64 (the least a host is given).
func source(r *http.Request) netip.Prefix {
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		return netip.Prefix{}
	}
	a := ap.Addr().Unmap()
	if a.Is4() {
		return netip.PrefixFrom(a, 32)
	}
	p, _ := a.Prefix(64)
	return p
}

// wait returns how long src must wait before its next login is checked;
// 0: now.
func (l *loginLimiter) wait(src netip.Prefix) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	lim := l.by[src]
	if lim == nil {
		return 0
	}
	now := time.Now()
	if lim.TokensAt(now) >= 1 {
		return 0
	}
	r := lim.ReserveN(now, 1)
	d := r.DelayFrom(now)
	r.CancelAt(now)
	return d
}

// failed spends one of src's failed logins.
func (l *loginLimiter) failed(src netip.Prefix) {
	l.mu.Lock()
	defer l.mu.Unlock()
	lim := l.by[src]
	if lim == nil {
		if len(l.by) >= loginAddrs {
			l.forget()
		}
		lim = rate.NewLimiter(rate.Every(loginFailEvery), loginFailBurst)
		l.by[src] = lim
	}
	lim.Allow()
}

// forget drops the addresses whose allowance is whole again, or, when none
// is, one of them; l.mu is held.
func (l *loginLimiter) forget() {
	now := time.Now()
	for src, lim := range l.by {
		if lim.TokensAt(now) >= loginFailBurst {
			delete(l.by, src)
		}
	}
	if len(l.by) >= loginAddrs {
		for src := range l.by {
			delete(l.by, src)
			return
		}
	}
}
