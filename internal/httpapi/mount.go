package httpapi

import (
	"fmt"
	"time"

	"github.com/idemgate/idemgate/internal/auth"
	"github.com/idemgate/idemgate/internal/console"
)

// newConsole is the operator console the server mounts under console.Path,
// on its client, tokens and limits.
func newConsole(s *Server) (*console.Console, error) {
	return console.New(s.cl, s.log, console.Config{
		Tokens:             s.cfg.Tokens,
		Limiter:            console.LimiterFunc(s.admit),
		MaxBodyBytes:       s.cfg.MaxBodyBytes,
		ListMaxScan:        s.cfg.ListMaxScan,
		HTTPS:              s.cfg.TLSCert != "" || s.cfg.InsecureListen,
		WorkerMetrics:      s.cfg.WorkerMetrics,
		WorkerMetricsEvery: s.cfg.WorkerMetricsEvery,
	})
}

// admit is the console's limiter: a console request spends its token's
// rate and in-flight allowance as the token's API requests do.
func (s *Server) admit(tok *auth.Token) (leave func(), wait time.Duration, why string) {
	leave, wait, overRate := s.enter(tok)
	switch {
	case leave == nil && overRate:
		return nil, wait, fmt.Sprintf("Token %s is over its rate of %g requests/s: retry after %s.", tok.Name, s.cfg.Rate, wait.Round(time.Millisecond))
	case leave == nil:
		return nil, wait, fmt.Sprintf("Token %s has %d requests in progress, its limit.", tok.Name, s.cfg.MaxInFlight)
	}
	return leave, 0, ""
}
