package worker

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// ErrNotReady is matched by Check's errors.
var ErrNotReady = errors.New("worker: not ready")

// Check reports whether the worker serves: Run has started, its connection
// is up, and its intent stream, consumer and ledger bucket exist. It asks the
// server, so it takes up to a round trip per resource.
func (w *Worker) Check(ctx context.Context) error {
	select {
	case <-w.ready:
	default:
		return fmt.Errorf("%w: not consuming yet", ErrNotReady)
	}
	if !w.nc.IsConnected() {
		return fmt.Errorf("%w: NATS connection is %s", ErrNotReady, w.nc.Status())
	}
	if _, err := w.res.stream.Info(ctx); err != nil {
		return fmt.Errorf("%w: stream %s: %v", ErrNotReady, w.res.names.Stream, err)
	}
	if _, err := w.res.consumer.Info(ctx); err != nil {
		return fmt.Errorf("%w: consumer %s: %v", ErrNotReady, w.res.names.Consumer, err)
	}
	if err := w.store.Ready(ctx); err != nil {
		return fmt.Errorf("%w: ledger bucket %s: %v", ErrNotReady, w.res.names.Bucket, err)
	}
	return nil
}

// AdminHandler serves the worker's admin endpoints: /metrics (Prometheus,
// from g), /healthz (the process is up: always 200) and /readyz (200 when
// Check passes, 503 with the reason otherwise).
func (w *Worker) AdminHandler(g prometheus.Gatherer) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(rw http.ResponseWriter, _ *http.Request) {
		_, _ = rw.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(rw http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		if err := w.Check(ctx); err != nil {
			http.Error(rw, err.Error(), http.StatusServiceUnavailable)
			return
		}
		_, _ = rw.Write([]byte("ready\n"))
	})
	return mux
}
