package httpapi

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/idemgate/idemgate/internal/auth"

	"go.opentelemetry.io/otel/propagation"
	"go.uber.org/zap"

	"github.com/idemgate/idemgate/pkg/client"
	"github.com/idemgate/idemgate/pkg/intent"
)

// How long a catalogue answer is used before it is asked again, and how
// soon an unknown tool makes it ask again.
const (
	catalogueFresh = 10 * time.Second
	catalogueRetry = time.Second
)

// catalogue is the workers' tool catalogue, remembered for a while. One
// request to the workers at a time refreshes it (single flight), and no
// lock is held across that request: a call of a tool the catalogue knows
// never waits for it, and calls that need the new answer wait for the one
// request in flight.
type catalogue struct {
	cl interface {
		Tools(ctx context.Context) (intent.Catalog, error)
	}
	mu     sync.Mutex
	cat    intent.Catalog
	byName map[string]intent.ToolInfo
	at     time.Time   // when cat was fetched; zero before the first answer
	asked  time.Time   // when the latest refresh started
	flight *refreshing // the refresh in flight; nil when none
}

// refreshing is one request to the workers; done is closed once it ended,
// with err its failure.
type refreshing struct {
	done chan struct{}
	err  error
}

func newCatalogue(cl *client.Client) *catalogue { return &catalogue{cl: cl} }

// get returns the catalogue, asking the workers when the one remembered is
// older than maxAge (joining a request already in flight) and waiting for
// their answer. When they do not answer, the last answer is used; with none
// it is an error.
func (c *catalogue) get(ctx context.Context, maxAge time.Duration) (intent.Catalog, error) {
	c.mu.Lock()
	if !c.at.IsZero() && time.Since(c.at) < maxAge {
		defer c.mu.Unlock()
		return c.cat, nil
	}
	f := c.refreshLocked()
	c.mu.Unlock()
	select {
	case <-f.done:
	case <-ctx.Done():
		return intent.Catalog{}, ctx.Err()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.at.IsZero() {
		return intent.Catalog{}, f.err
	}
	return c.cat, nil
}

// refreshLocked returns the refresh in flight, starting one if there is
// none. The request runs on its own goroutine, bounded by the client's
// catalogue timeout, so that a caller who leaves does not end it for the
// others. c.mu must be held.
func (c *catalogue) refreshLocked() *refreshing {
	if c.flight != nil {
		return c.flight
	}
	f := &refreshing{done: make(chan struct{})}
	c.flight, c.asked = f, time.Now()
	go func() {
		cat, err := c.cl.Tools(context.Background())
		c.mu.Lock()
		defer c.mu.Unlock()
		if err == nil {
			c.cat, c.at, c.byName = cat, time.Now(), map[string]intent.ToolInfo{}
			for _, t := range cat.Tools {
				c.byName[t.Name] = t
			}
		}
		f.err, c.flight = err, nil
		close(f.done)
	}()
	return f
}

// tool returns the catalogue's entry for name. A name it knows is answered
// from the catalogue at once, even one older than catalogueFresh (which
// starts a refresh, not waited for). A name it lacks makes it ask the
// workers again, at most once per catalogueRetry, in case the tool is new,
// and waits for that answer.
func (c *catalogue) tool(ctx context.Context, name string) (intent.ToolInfo, bool, error) {
	c.mu.Lock()
	if t, ok := c.byName[name]; ok {
		if time.Since(c.at) >= catalogueFresh {
			c.refreshLocked()
		}
		c.mu.Unlock()
		return t, true, nil
	}
	var f *refreshing
	switch {
	case c.flight != nil:
		f = c.flight
	case c.at.IsZero() || time.Since(c.asked) >= catalogueRetry:
		f = c.refreshLocked()
	}
	c.mu.Unlock()
	if f == nil {
		return intent.ToolInfo{}, false, nil // asked less than catalogueRetry ago
	}
	select {
	case <-f.done:
	case <-ctx.Done():
		return intent.ToolInfo{}, false, ctx.Err()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.at.IsZero() {
		return intent.ToolInfo{}, false, f.err
	}
	t, ok := c.byName[name]
	return t, ok, nil
}

// listTools answers GET /v1/tools: the workers' catalogue, with the
// token's namespace in Idem-Namespace (a client deriving keys needs it: the
// namespace scopes every session).
func (s *Server) listTools(w http.ResponseWriter, r *http.Request, tok *auth.Token, _ []byte) {
	cat, err := s.tools.get(r.Context(), catalogueRetry)
	if err != nil {
		s.unavailable(w, err)
		return
	}
	if cat.Tools == nil {
		cat.Tools = []intent.ToolInfo{}
	}
	w.Header().Set(HeaderNamespace, tok.Namespace)
	writeJSON(w, http.StatusOK, "application/json", cat)
}

// callTool answers POST /v1/tools/{tool}: the body is the tool's args; the
// headers give the key override, session, call id, creation time, trace
// context and how long to wait.
func (s *Server) callTool(w http.ResponseWriter, r *http.Request, tok *auth.Token, body []byte) {
	name := r.PathValue("tool")
	if !intent.ValidTool(name) {
		fail(w, http.StatusNotFound, intent.CodeUnknownTool, "no tool %q: tool names match [a-z0-9_-]{1,64}", clip(name))
		return
	}
	wait := s.wait(w, r)
	env, problem := s.envelope(r, tok, name, body)
	if problem != nil {
		writeProblem(w, problem)
		return
	}
	info, known, err := s.tools.tool(r.Context(), name)
	switch {
	case err != nil:
		s.unavailable(w, err)
		return
	case !known:
		fail(w, http.StatusNotFound, intent.CodeUnknownTool, "no tool %q is configured on the workers (GET /v1/tools lists them)", name)
		return
	}
	if err := env.CheckKeyArgs(info.Class, info.KeySpec()); err != nil {
		fail(w, http.StatusBadRequest, intent.CodeInvalidIntent, "%v", err)
		return
	}
	// The caller's trace context (traceparent) reaches the worker, the
	// effect and the answer.
	ctx := propagation.TraceContext{}.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
	sub, err := s.cl.Publish(ctx, env.Envelope)
	if err != nil {
		if errors.Is(err, intent.ErrInvalid) {
			fail(w, http.StatusBadRequest, intent.CodeInvalidIntent, "%v", err)
			return
		}
		s.unavailable(w, err)
		return
	}
	wctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	res, err := sub.Wait(wctx)
	switch {
	case errors.Is(err, client.ErrNoAnswer) && r.Context().Err() != nil:
		return // the caller left
	case errors.Is(err, client.ErrNoAnswer) && info.Ledger:
		w.Header().Set("Location", operationPath(sub.Key))
		retryAfter(w, time.Second)
		p := newProblem(http.StatusConflict, codeInFlight, fmt.Sprintf(
			"no answer within %s: the operation is still in flight; repeat the request (it is not fired again), "+
				"or GET its Location with ?wait=N, which waits for its record (a plain GET is 404 until a worker has claimed the intent)", wait))
		p.Key = sub.Key
		writeProblem(w, p)
		return
	case errors.Is(err, client.ErrNoAnswer):
		p := newProblem(http.StatusGatewayTimeout, codeNoAnswer, fmt.Sprintf("no answer within %s; %s is safe to call again", wait, name))
		p.Key = sub.Key
		writeProblem(w, p)
		return
	case err != nil:
		s.unavailable(w, err)
		return
	}
	writeAnswer(w, res, info.Ledger)
}

// envelope builds the intent of a tool call and checks it as the workers
// will (intent.Build): the args must be one strict JSON object, and the
// envelope within the size limit and the protocol's rules.
func (s *Server) envelope(r *http.Request, tok *auth.Token, tool string, body []byte) (intent.Decoded, *problem) {
	invalid := func(format string, args ...any) *problem {
		return newProblem(http.StatusBadRequest, intent.CodeInvalidIntent, fmt.Sprintf(format, args...))
	}
	// A header that cannot be read is the request's fault, not the intent's.
	malformed := func(format string, args ...any) *problem {
		return newProblem(http.StatusBadRequest, codeInvalidRequest, fmt.Sprintf(format, args...))
	}
	key, err := idempotencyKey(r.Header)
	if err != nil {
		return intent.Decoded{}, malformed("%v", err)
	}
	sessions := r.Header.Values(HeaderSession)
	if len(sessions) > 1 {
		return intent.Decoded{}, malformed("more than one %s header", HeaderSession)
	}
	session := ""
	if len(sessions) == 1 {
		session = sessions[0]
	}
	if len(session) > maxSessionBytes {
		return intent.Decoded{}, malformed("%s is %d bytes, the limit is %d", HeaderSession, len(session), maxSessionBytes)
	}
	for _, h := range []string{HeaderSession, HeaderCallID, HeaderCreatedAt} {
		if len(r.Header.Values(h)) > 1 {
			return intent.Decoded{}, malformed("more than one %s header", h)
		}
		if v := r.Header.Get(h); !utf8.ValidString(v) {
			return intent.Decoded{}, malformed("%s is not valid UTF-8", h)
		}
	}
	if !utf8.ValidString(key) {
		return intent.Decoded{}, malformed("%s is not valid UTF-8", HeaderIdempotencyKey)
	}
	if len(key) > intent.MaxKeyBytes {
		return intent.Decoded{}, malformed("%s is %d bytes, the limit is %d", HeaderIdempotencyKey, len(key), intent.MaxKeyBytes)
	}
	env := intent.Envelope{Tool: tool, Args: body, Session: tok.Scope(session), Key: key, CallID: r.Header.Get(HeaderCallID)}
	if v := r.Header.Get(HeaderCreatedAt); v != "" {
		t, err := intent.ParseCreatedAt(v)
		if err != nil {
			return intent.Decoded{}, invalid("%v", err)
		}
		env.CreatedAt = t
	}
	d, err := intent.Build(env, intent.Limits{MaxBytes: s.cfg.MaxBodyBytes})
	var syntax *intent.SyntaxError
	switch {
	case errors.Is(err, intent.ErrTooLarge):
		return intent.Decoded{}, newProblem(http.StatusRequestEntityTooLarge, intent.CodeTooLarge, fmt.Sprintf("%v (with its headers)", err))
	case errors.As(err, &syntax):
		return intent.Decoded{}, invalid("the body must be the tool's arguments, one JSON object: %v", err)
	case err != nil:
		return intent.Decoded{}, invalid("%v", err)
	}
	return d, nil
}

// unavailable answers 503: NATS, the workers or the ledger did not answer.
func (s *Server) unavailable(w http.ResponseWriter, err error) {
	s.log.Warn("idemgate unavailable", zap.Error(err))
	retryAfter(w, time.Second)
	fail(w, http.StatusServiceUnavailable, codeUnavailable, "%v", err)
}

// wait is how long the request waits for an answer: Prefer: wait=N bounded
// by the maximum (and then reported in Preference-Applied), else the
// default. A wait preference that is not a number of seconds is ignored
// (RFC 7240), as if there were none.
func (s *Server) wait(w http.ResponseWriter, r *http.Request) time.Duration {
	d, set := preferredWait(r.Header)
	if !set {
		return s.cfg.DefaultWait
	}
	d = clampWait(d, s.cfg.MaxWait)
	w.Header().Set("Preference-Applied", "wait="+formatSeconds(d))
	return d
}
