package mcpgate

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// HTTPPath is where ServeHTTP serves the streamable HTTP transport.
const HTTPPath = "/mcp"

// Load reads the catalogue, trying again until it succeeds or ctx ends: the
// gate may start before the workers. It returns the last error when ctx
// ends first; the gate still serves (Run keeps trying).
func (g *Gate) Load(ctx context.Context) error {
	pause := 100 * time.Millisecond
	for {
		err := g.Refresh(ctx)
		if err == nil {
			return nil
		}
		g.cfg.Logger.Info("waiting for the workers' tool catalogue", "err", err)
		select {
		case <-ctx.Done():
			return err
		case <-time.After(pause):
			pause = min(2*pause, 2*time.Second)
		}
	}
}

// ServeStdio serves one client on the process's stdin and stdout until the
// client closes stdin or ctx ends, keeping the tools current meanwhile.
func (g *Gate) ServeStdio(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { _ = g.Run(ctx) }()
	err := g.server.Run(ctx, &mcp.StdioTransport{})
	if ctx.Err() != nil || errors.Is(err, mcp.ErrConnectionClosed) {
		return nil
	}
	return err
}

// ServeHTTP serves the streamable HTTP transport on addr at HTTPPath until
// ctx ends, then shuts down (calls in flight get up to drain to finish;
// their operations go on regardless). ready, when not nil, receives the
// address listened on.
func (g *Gate) ServeHTTP(ctx context.Context, addr string, drain time.Duration, ready func(net.Addr)) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("mcpgate: listen %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle(HTTPPath, g.HTTPHandler())
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { _ = g.Run(ctx) }()
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	if ready != nil {
		ready(ln.Addr())
	}
	select {
	case err := <-done:
		return fmt.Errorf("mcpgate: serve: %w", err)
	case <-ctx.Done():
	}
	sctx, scancel := context.WithTimeout(context.Background(), drain)
	defer scancel()
	if err := srv.Shutdown(sctx); err != nil {
		_ = srv.Close()
	}
	<-done
	return nil
}
