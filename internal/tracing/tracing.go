// Package tracing sets up OpenTelemetry for the worker: W3C trace context is
// always propagated (an intent's traceparent reaches its effect and its
// answer); spans are exported only when an OTLP endpoint is configured.
package tracing

import (
	"context"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.26.0"
)

// Setup installs the W3C trace-context propagator and, when endpoint is not
// empty (an OTLP/HTTP base URL such as http://collector:4318), a tracer
// provider exporting spans there in batches. The returned function flushes
// and stops the exporter.
func Setup(ctx context.Context, service, endpoint string) (shutdown func(context.Context) error, err error) {
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	if endpoint == "" {
		return func(context.Context) error { return nil }, nil
	}
	exp, err := otlptracehttp.New(ctx, otlptracehttp.WithEndpointURL(strings.TrimSuffix(endpoint, "/")+"/v1/traces"))
	if err != nil {
		return nil, fmt.Errorf("tracing: OTLP exporter for %s: %w", endpoint, err)
	}
	res := resource.NewSchemaless(semconv.ServiceName(service))
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	otel.SetTracerProvider(tp)
	return tp.Shutdown, nil
}

// Header adapts NATS message headers to the propagators. NATS header names
// are case-sensitive; traceparent is looked up in any case.
type Header nats.Header

var _ propagation.TextMapCarrier = Header(nil)

// Get returns the first value of key, matched case-insensitively.
func (h Header) Get(key string) string {
	if v, ok := h[key]; ok && len(v) > 0 {
		return v[0]
	}
	for k, v := range h {
		if strings.EqualFold(k, key) && len(v) > 0 {
			return v[0]
		}
	}
	return ""
}

// Set sets key to value.
func (h Header) Set(key, value string) { h[key] = []string{value} }

// Keys lists the header names.
func (h Header) Keys() []string {
	keys := make([]string, 0, len(h))
	for k := range h {
		keys = append(keys, k)
	}
	return keys
}
