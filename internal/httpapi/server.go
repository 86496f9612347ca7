package httpapi

import (
	"context"
	"crypto/tls"
	_ "embed"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/idemgate/idemgate/internal/auth"
	"github.com/idemgate/idemgate/internal/console"
	"github.com/idemgate/idemgate/internal/httpdoor"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"
	"golang.org/x/time/rate"

	"github.com/idemgate/idemgate/pkg/client"
	"github.com/idemgate/idemgate/pkg/intent"
)

// openAPI is the API's OpenAPI 3.1 document, served at /v1/openapi.json.
//
//go:embed openapi.json
var openAPI []byte

// Server is the HTTP front door of one idemgate installation.
type Server struct {
	cfg     Config
	cl      *client.Client
	nc      *nats.Conn
	log     *zap.Logger
	bearer  httpdoor.Bearer
	callers sync.Map // token hash → *caller
	handler http.Handler
	console *console.Console
}

// caller is a token's rate limiter and count of requests in progress.
type caller struct {
	limiter  *rate.Limiter
	mu       sync.Mutex
	inFlight int
}

// New checks cfg and returns a server calling idemgate through cl (on nc,
// whose state /healthz reports), logging to log (nil: no logging).
func New(nc *nats.Conn, cl *client.Client, log *zap.Logger, cfg Config) (*Server, error) {
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if nc == nil || cl == nil {
		return nil, errors.New("httpapi: no NATS connection or client")
	}
	if log == nil {
		log = zap.NewNop()
	}
	s := &Server{cfg: cfg, cl: cl, nc: nc, log: log, bearer: httpdoor.Bearer{Tokens: cfg.Tokens}}
	var err error
	if s.console, err = newConsole(s); err != nil {
		return nil, fmt.Errorf("httpapi: %w", err)
	}
	s.handler = s.routes()
	return s, nil
}

// Handler is the API as an http.Handler.
func (s *Server) Handler() http.Handler { return s.handler }

// Serve serves the API on ln (over TLS when the config has a certificate)
// until ctx is done, then shuts down gracefully: requests in progress get
// up to drain to finish.
func (s *Server) Serve(ctx context.Context, ln net.Listener, drain time.Duration) error {
	srv := &http.Server{
		Handler:           s.handler,
		ReadHeaderTimeout: s.cfg.ReadHeaderTimeout,
		IdleTimeout:       s.cfg.IdleTimeout,
		MaxHeaderBytes:    hardHeaderBytes,
		ErrorLog:          zap.NewStdLog(s.log.Named("http")),
		BaseContext:       func(net.Listener) context.Context { return context.WithoutCancel(ctx) },
	}
	s.console.Start(ctx, srv)
	if s.cfg.TLSCert != "" {
		cert, err := tls.LoadX509KeyPair(s.cfg.TLSCert, s.cfg.TLSKey)
		if err != nil {
			return fmt.Errorf("httpapi: TLS certificate: %w", err)
		}
		srv.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}}
		ln = tls.NewListener(ln, srv.TLSConfig)
	}
	if err := httpdoor.Serve(ctx, srv, ln, drain); err != nil {
		return fmt.Errorf("httpapi: %w", err)
	}
	return nil
}

// Listen opens the configured address.
func (s *Server) Listen() (net.Listener, error) {
	ln, err := net.Listen("tcp", s.cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("httpapi: listen %s: %w", s.cfg.Addr, err)
	}
	return ln, nil
}

// Scheme is https when the server serves TLS, else http.
func (s *Server) Scheme() string {
	if s.cfg.TLSCert != "" {
		return "https"
	}
	return "http"
}

// access is who may use a route.
type access int

const (
	anyToken     access = iota // agents and operators
	operatorOnly               // operators
)

// handlerFunc is a route's handler: it gets the caller's token and the
// request body, already read.
type handlerFunc func(w http.ResponseWriter, r *http.Request, tok *auth.Token, body []byte)

func (s *Server) routes() http.Handler {
	mux := http.NewServeMux()
	route := func(pattern string, who access, h handlerFunc) {
		mux.Handle(pattern, s.guard(who, h))
		method, path, _ := strings.Cut(pattern, " ")
		mux.Handle(path, methodNotAllowed(method))
	}
	// Each path is registered once with its methods, then once without a
	// method for the 405 answer; /v1/operations/{key} has two methods.
	mux.Handle("POST /v1/tools/{tool}", s.guard(anyToken, s.callTool))
	mux.Handle("/v1/tools/{tool}", methodNotAllowed(http.MethodPost))
	route("GET /v1/tools", anyToken, s.listTools)
	mux.Handle("GET /v1/operations/{key}", s.guard(anyToken, s.getOperation))
	mux.Handle("DELETE /v1/operations/{key}", s.guard(operatorOnly, s.forget))
	mux.Handle("/v1/operations/{key}", methodNotAllowed(http.MethodGet, http.MethodDelete))
	route("GET /v1/operations", operatorOnly, s.listOperations)
	route("POST /v1/operations/{key}/{decision}", operatorOnly, s.decide)
	// POST .../history is a decision named history: no such decision (404).
	mux.Handle("GET /v1/operations/{key}/history", s.guard(operatorOnly, s.getHistory))
	route("GET /v1/audit/keys", anyToken, s.getAuditKeys)
	route("GET /v1/audit/checkpoint", operatorOnly, s.getAuditCheckpoint)
	route("GET /v1/dead-letters", operatorOnly, s.deadLetters)
	route("POST /v1/dead-letters/{seq}/replay", operatorOnly, s.replay)
	mux.HandleFunc("GET /v1/openapi.json", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(openAPI)
	})
	mux.Handle("/v1/openapi.json", methodNotAllowed(http.MethodGet))
	mux.HandleFunc("GET /healthz", s.health)
	mux.Handle("/healthz", methodNotAllowed(http.MethodGet))
	s.console.Mount(mux)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		fail(w, http.StatusNotFound, codeNotFoundRoute, "no endpoint %s %s (see /v1/openapi.json)", r.Method, r.URL.Path)
	})
	return s.bound(mux)
}

// methodNotAllowed answers 405 with the methods the path allows (Allow, as
// RFC 9110 requires; a GET route takes HEAD too).
func methodNotAllowed(methods ...string) http.Handler {
	if slices.Contains(methods, http.MethodGet) {
		methods = append(methods, http.MethodHead)
	}
	allow := strings.Join(methods, ", ")
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Allow", allow)
		fail(w, http.StatusMethodNotAllowed, codeMethod, "%s is not allowed on %s: use %s", r.Method, r.URL.Path, allow)
	})
}

// bound refuses a request whose headers are over their limit (431), gives
// every request a deadline for its body (cleared once a handler has read
// it) and a write deadline, and logs it.
func (s *Server) bound(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		rc := http.NewResponseController(w)
		_ = rc.SetReadDeadline(start.Add(s.cfg.BodyTimeout))
		_ = rc.SetWriteDeadline(start.Add(s.cfg.BodyTimeout + s.cfg.MaxWait + 30*time.Second))
		sw := &statusWriter{ResponseWriter: w}
		if n := headerBytes(r); n > maxHeaderBytes {
			w.Header().Set("Connection", "close")
			fail(sw, http.StatusRequestHeaderFieldsTooLarge, codeHeadersTooLarge,
				"the request line and headers are %d bytes, the limit is %d", n, maxHeaderBytes)
		} else {
			next.ServeHTTP(sw, r)
		}
		lvl := zap.DebugLevel
		if sw.status >= 500 {
			lvl = zap.WarnLevel
		}
		s.log.Check(lvl, "request").Write(zap.String("method", r.Method), zap.String("path", r.URL.Path),
			zap.Int("status", sw.status), zap.Duration("took", time.Since(start)), zap.String("remote", r.RemoteAddr))
	})
}

// headerBytes is the size of r's request line and header fields as an
// HTTP/1.1 client sent them (the Host header included), which
// maxHeaderBytes bounds.
func headerBytes(r *http.Request) int {
	n := len(r.Method) + 1 + len(r.RequestURI) + 1 + len(r.Proto) + 2 + len("Host: ") + len(r.Host) + 2 + 2
	for name, vs := range r.Header {
		for _, v := range vs {
			n += len(name) + 2 + len(v) + 2
		}
	}
	return n
}

// statusWriter remembers the status a handler wrote.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection's deadlines.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// guard authenticates the request, applies the token's role, rate limit and
// in-flight cap, reads the body (bounded in size and time) and calls h.
func (s *Server) guard(who access, h handlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tok, ok := s.bearer.Authenticate(w, r)
		if !ok {
			return
		}
		if who == operatorOnly && tok.Role != auth.RoleOperator {
			s.bearer.Forbid(w, r, "%s needs an operator token; %s is an agent's", r.URL.Path, tok.Name)
			return
		}
		leave, wait, overRate := s.enter(tok)
		switch {
		case leave == nil && overRate:
			retryAfter(w, wait)
			fail(w, http.StatusTooManyRequests, intent.CodeRateLimited, "token %s is over its rate of %g requests/s: retry after %s", tok.Name, s.cfg.Rate, wait.Round(time.Millisecond))
			return
		case leave == nil:
			retryAfter(w, wait)
			fail(w, http.StatusTooManyRequests, intent.CodeRateLimited, "token %s has %d requests in progress, its limit", tok.Name, s.cfg.MaxInFlight)
			return
		}
		defer leave()
		body, ok := httpdoor.ReadBody(w, r, int64(s.cfg.MaxBodyBytes), s.cfg.BodyTimeout)
		if !ok {
			return
		}
		h(w, r, tok, body)
	})
}

// enter admits a request of tok within its rate and in-flight cap, the
// API's and the console's alike: leave ends it; when refused (leave nil),
// wait is how long to wait and overRate whether the rate refused it (else
// the cap).
func (s *Server) enter(tok *auth.Token) (leave func(), wait time.Duration, overRate bool) {
	c := s.caller(tok)
	if res := c.limiter.Reserve(); res.Delay() > 0 {
		d := res.Delay()
		res.Cancel()
		return nil, d, true
	}
	if !c.enter(s.cfg.MaxInFlight) {
		return nil, time.Second, false
	}
	return c.leave, 0, false
}

func (s *Server) caller(tok *auth.Token) *caller {
	if c, ok := s.callers.Load(tok.Hash()); ok {
		return c.(*caller)
	}
	c, _ := s.callers.LoadOrStore(tok.Hash(), &caller{limiter: rate.NewLimiter(rate.Limit(s.cfg.Rate), s.cfg.Burst)})
	return c.(*caller)
}

func (c *caller) enter(limit int) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.inFlight >= limit {
		return false
	}
	c.inFlight++
	return true
}

func (c *caller) leave() {
	c.mu.Lock()
	c.inFlight--
	c.mu.Unlock()
}

// health answers 200 while the NATS connection is up, 503 otherwise.
func (s *Server) health(w http.ResponseWriter, r *http.Request) {
	if !s.nc.IsConnected() {
		fail(w, http.StatusServiceUnavailable, codeUnavailable, "NATS connection %s", s.nc.Status())
		return
	}
	writeJSON(w, http.StatusOK, "application/json", map[string]string{"status": "ok"})
}
