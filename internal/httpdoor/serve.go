package httpdoor

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"time"
)

// DefaultDrain and DrainUsage are the front doors' --drain-timeout.
const (
	DefaultDrain = 30 * time.Second
	DrainUsage   = "on SIGTERM, how long requests in progress may take to finish"
)

// Serve serves srv on ln until ctx is done, then shuts it down gracefully:
// it stops accepting, and the requests in progress get up to drain to
// finish before their connections are closed. It returns the error that
// ended serving early (wrapped), and nil after a shutdown.
func Serve(ctx context.Context, srv *http.Server, ln net.Listener, drain time.Duration) error {
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	select {
	case err := <-done:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), drain)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		_ = srv.Close() // the drain ran out: cut the requests still in progress
	}
	<-done
	return nil
}
