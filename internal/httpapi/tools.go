package httpapi

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"
	"unicode/utf8"

	"github.com/idemgate/idemgate/internal/auth"
	"github.com/idemgate/idemgate/internal/hint"

	"go.opentelemetry.io/otel/propagation"
	"go.uber.org/zap"

	"github.com/idemgate/idemgate/pkg/client"
	"github.com/idemgate/idemgate/pkg/intent"
)

// listTools answers GET /v1/tools: the workers' catalogue, with the
// token's namespace in Idem-Namespace (a client deriving keys needs it: the
// namespace scopes every session).
func (s *Server) listTools(w http.ResponseWriter, r *http.Request, tok *auth.Token, _ []byte) {
	cat, err := s.cl.Catalog(r.Context(), client.CatalogRetry)
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
	env, problem := s.envelope(r, tok, name)
	if problem != nil {
		writeProblem(w, problem)
		return
	}
	env.Args = body
	call, problem := submission(r)
	if problem != nil {
		writeProblem(w, problem)
		return
	}
	p, err := s.cl.Prepare(r.Context(), env, intent.Limits{MaxBytes: s.cfg.MaxBodyBytes})
	if err != nil {
		writeProblem(w, invalidIntent(err))
		return
	}
	p.Submission = call
	switch {
	case p.CatalogErr != nil:
		s.unavailable(w, p.CatalogErr)
		return
	case !p.Known:
		writeProblem(w, refused(http.StatusNotFound, intent.CodeUnknownTool, fmt.Sprintf("no tool %q is configured on the workers (GET /v1/tools lists them)", name)))
		return
	}
	if err := p.CheckKeyArgs(); err != nil {
		writeProblem(w, invalidIntent(err))
		return
	}
	info := p.Tool
	// The caller's trace context (traceparent) reaches the worker, the
	// effect and the answer.
	ctx := propagation.TraceContext{}.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
	sub, err := s.cl.PublishPrepared(ctx, p)
	if err != nil {
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
		h := hint.Still(sub.Key, hint.Door{Check: checkOperation})
		p.Key, p.Hint = sub.Key, &h
		writeProblem(w, p)
		return
	case errors.Is(err, client.ErrNoAnswer):
		p := newProblem(http.StatusGatewayTimeout, codeNoAnswer, fmt.Sprintf("no answer within %s; %s is safe to call again", wait, name))
		h := hint.Unknown(fmt.Sprintf("No answer within %s. %s is a read or idempotent: calling it again is safe.", wait, name))
		p.Key, p.Hint = sub.Key, &h
		writeProblem(w, p)
		return
	case err != nil:
		s.unavailable(w, err)
		return
	}
	writeAnswer(w, res, info.Ledger, info.OnFailure == intent.OnFailureRetry)
}

// envelope is the intent of a tool call but its args, from the request's
// headers, the token's namespace scoping its session. The client builds
// and checks it with the args (client.Prepare, intent.Build).
func (s *Server) envelope(r *http.Request, tok *auth.Token, tool string) (intent.Envelope, *problem) {
	invalid := func(format string, args ...any) *problem {
		return newProblem(http.StatusBadRequest, intent.CodeInvalidIntent, fmt.Sprintf(format, args...))
	}
	// A header that cannot be read is the request's fault, not the intent's.
	malformed := func(format string, args ...any) *problem {
		return newProblem(http.StatusBadRequest, codeInvalidRequest, fmt.Sprintf(format, args...))
	}
	key, err := idempotencyKey(r.Header)
	if err != nil {
		return intent.Envelope{}, malformed("%v", err)
	}
	sessions := r.Header.Values(HeaderSession)
	if len(sessions) > 1 {
		return intent.Envelope{}, malformed("more than one %s header", HeaderSession)
	}
	session := ""
	if len(sessions) == 1 {
		session = sessions[0]
	}
	if len(session) > maxSessionBytes {
		return intent.Envelope{}, malformed("%s is %d bytes, the limit is %d", HeaderSession, len(session), maxSessionBytes)
	}
	for _, h := range []string{HeaderSession, HeaderCallID, HeaderCreatedAt} {
		if len(r.Header.Values(h)) > 1 {
			return intent.Envelope{}, malformed("more than one %s header", h)
		}
		if v := r.Header.Get(h); !utf8.ValidString(v) {
			return intent.Envelope{}, malformed("%s is not valid UTF-8", h)
		}
	}
	if !utf8.ValidString(key) {
		return intent.Envelope{}, malformed("%s is not valid UTF-8", HeaderIdempotencyKey)
	}
	if len(key) > intent.MaxKeyBytes {
		return intent.Envelope{}, malformed("%s is %d bytes, the limit is %d", HeaderIdempotencyKey, len(key), intent.MaxKeyBytes)
	}
	env := intent.Envelope{Tool: tool, Session: tok.Scope(session), Key: key, CallID: r.Header.Get(HeaderCallID)}
	if v := r.Header.Get(HeaderCreatedAt); v != "" {
		t, err := intent.ParseCreatedAt(v)
		if err != nil {
			return intent.Envelope{}, invalid("%v", err)
		}
		env.CreatedAt = t
	}
	return env, nil
}

// submission is the call a request names (HeaderSubmission), "" for none.
func submission(r *http.Request) (string, *problem) {
	vs := r.Header.Values(HeaderSubmission)
	switch {
	case len(vs) == 0:
		return "", nil
	case len(vs) > 1:
		return "", newProblem(http.StatusBadRequest, codeInvalidRequest, fmt.Sprintf("more than one %s header", HeaderSubmission))
	case !intent.ValidSubmission(vs[0]):
		return "", newProblem(http.StatusBadRequest, codeInvalidRequest, fmt.Sprintf(
			"%s names the call: 8 to 64 characters of [A-Za-z0-9_-], one random value per call, repeated on its retries", HeaderSubmission))
	}
	return vs[0], nil
}

// invalidIntent is the problem of a call the door refused before publishing
// it (client.Prepare, intent.Build, the schema, the key args).
func invalidIntent(err error) *problem {
	var syntax *intent.SyntaxError
	switch {
	case errors.Is(err, intent.ErrTooLarge):
		return refused(http.StatusRequestEntityTooLarge, intent.CodeTooLarge, fmt.Sprintf("%v (with its headers)", err))
	case errors.As(err, &syntax):
		return refused(http.StatusBadRequest, intent.CodeInvalidIntent, fmt.Sprintf("the body must be the tool's arguments, one JSON object: %v", err))
	}
	return refused(http.StatusBadRequest, intent.CodeInvalidIntent, err.Error())
}

// refused is the problem of a tool call the door refused before publishing
// it, with the hint a model reads of a rejection: nothing was done.
func refused(status int, code, detail string) *problem {
	p := newProblem(status, code, detail)
	h := hint.For(&intent.Result{Status: intent.StatusRejected, Error: &intent.Error{Code: code, Message: detail}}, hint.Door{Check: checkOperation})
	p.Hint = &h
	return p
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
