package client

import (
	"context"
	"net/http"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/propagation"
)

// injectTrace writes the W3C trace context of ctx (a span, or a remote span
// context a front door extracted from its request's traceparent) into h, so
// that the worker's span, the effect and the answer join the caller's trace.
// A ctx without one writes nothing.
func injectTrace(ctx context.Context, h nats.Header) {
	propagation.TraceContext{}.Inject(ctx, propagation.HeaderCarrier(http.Header(h)))
}
