package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/idemgate/idemgate/internal/auth"
	"github.com/idemgate/idemgate/internal/console"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemgate/idemgate/pkg/client"
	"github.com/idemgate/idemgate/pkg/dedup"
	"github.com/idemgate/idemgate/pkg/intent"
)

// operation is an operation's record as the API shows it.
type operation struct {
	Key string `json:"key"`
	dedup.Record
}

// getOperation answers GET /v1/operations/{key}: the record as the ledger
// has it; with ?wait=N, the record once final (watched, not polled), or as
// it is when N runs out. A record of a session the token does not reach is
// not found, exactly as a key with no record is: the same answer after the
// same wait, so that a caller cannot tell another namespace's operations
// from none.
func (s *Server) getOperation(w http.ResponseWriter, r *http.Request, tok *auth.Token, _ []byte) {
	key := r.PathValue("key")
	var wait time.Duration
	if v := r.URL.Query().Get("wait"); v != "" {
		d, err := seconds(v)
		if err != nil {
			fail(w, http.StatusBadRequest, codeInvalidRequest, "wait=%s: %v", clip(v), err)
			return
		}
		wait = min(d, s.cfg.MaxWait)
	}
	deadline := time.Now().Add(wait)
	rec, err := s.cl.Get(r.Context(), key)
	if err == nil && !tok.Reaches(rec.Session) {
		err = client.ErrNotFound // another namespace's: as if there were none
	}
	if wait > 0 && (errors.Is(err, client.ErrNotFound) || (err == nil && !rec.Status.Final())) {
		ctx, cancel := context.WithDeadline(r.Context(), deadline)
		rec, err = s.cl.WatchFinal(ctx, key)
		cancel()
		if errors.Is(err, client.ErrForgotten) {
			err = nil // the forgotten record says who forgot it, when and why
		}
		if errors.Is(err, client.ErrNoAnswer) && r.Context().Err() == nil {
			err = nil // the wait ran out: the record as it is
			if rec.Status == "" {
				err = client.ErrNotFound
			}
		}
		if err == nil && !tok.Reaches(rec.Session) {
			err = client.ErrNotFound
		}
	}
	switch {
	case errors.Is(err, client.ErrNotFound):
		if wait > 0 && !sleepUntil(r.Context(), deadline) {
			return // the caller left
		}
		fail(w, http.StatusNotFound, intent.CodeNotFound, "no operation %s", clip(key))
		return
	case errors.Is(err, intent.ErrInvalid): // a key the ledger cannot hold
		fail(w, http.StatusBadRequest, codeInvalidRequest, "%v", err)
		return
	case err != nil:
		s.unavailable(w, err)
		return
	}
	writeJSON(w, http.StatusOK, "application/json", operation{Key: key, Record: rec})
}

// sleepUntil waits until t, or reports false when ctx ends first.
func sleepUntil(ctx context.Context, t time.Time) bool {
	timer := time.NewTimer(time.Until(t))
	defer timer.Stop()
	select {
	case <-timer.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// listOperations answers GET /v1/operations: a page of the records the
// query parameters select, within the token's namespace.
func (s *Server) listOperations(w http.ResponseWriter, r *http.Request, tok *auth.Token, _ []byte) {
	q, err := s.query(r.URL.Query(), tok)
	if err != nil {
		fail(w, http.StatusBadRequest, codeInvalidRequest, "%v", err)
		return
	}
	page, err := s.cl.Records(r.Context(), q)
	if errors.Is(err, dedup.ErrInvalid) {
		fail(w, http.StatusBadRequest, codeInvalidRequest, "%v", err)
		return
	}
	if err != nil {
		s.unavailable(w, err)
		return
	}
	if page.More {
		next := r.URL.Query()
		next.Set("after", strconv.FormatUint(page.Next, 10))
		w.Header().Set("Link", fmt.Sprintf(`</v1/operations?%s>; rel="next"`, next.Encode()))
	}
	writeJSON(w, http.StatusOK, "application/json", page)
}

// query reads a listing's parameters: status (names, or open), tool,
// session, older_than (seconds or a duration such as 1h), past_lease,
// limit, after.
func (s *Server) query(v url.Values, tok *auth.Token) (dedup.Query, error) {
	for name := range v {
		switch name {
		case "status", "tool", "session", "older_than", "past_lease", "limit", "after":
		default:
			return dedup.Query{}, fmt.Errorf("unknown parameter %q: use status, tool, session, older_than, past_lease, limit or after", clip(name))
		}
	}
	q := dedup.Query{Tool: v.Get("tool"), MaxScan: s.cfg.ListMaxScan}
	var err error
	if q.Statuses, err = dedup.ParseStatuses(v.Get("status")); err != nil {
		return q, err
	}
	if v.Has("session") {
		q.Session = tok.Scope(v.Get("session"))
	}
	if o := v.Get("older_than"); o != "" {
		d, err := time.ParseDuration(o)
		if err != nil {
			if d, err = seconds(o); err != nil {
				return q, fmt.Errorf("older_than=%s: give seconds or a duration such as 1h", clip(o))
			}
		}
		q.CreatedBefore = time.Now().Add(-d)
	}
	if p := v.Get("past_lease"); p != "" {
		if q.PastLease, err = strconv.ParseBool(p); err != nil {
			return q, fmt.Errorf("past_lease=%s: give true or false", clip(p))
		}
	}
	if l := v.Get("limit"); l != "" {
		if q.Limit, err = strconv.Atoi(l); err != nil || q.Limit < 1 {
			return q, fmt.Errorf("limit=%s: give 1 to %d", clip(l), dedup.MaxListLimit)
		}
	}
	if a := v.Get("after"); a != "" {
		if q.After, err = strconv.ParseUint(a, 10, 64); err != nil {
			return q, fmt.Errorf("after=%s: give the next cursor of the previous page", clip(a))
		}
	}
	if tok.Namespace != auth.AllNamespaces {
		q.Match = func(_ string, rec dedup.Record) bool { return tok.Reaches(rec.Session) }
	}
	return q, nil
}

// decisionBody is the body of an operator decision.
type decisionBody struct {
	Fingerprint string          `json:"fingerprint,omitempty"`
	Reason      string          `json:"reason,omitempty"`
	Outcome     string          `json:"outcome,omitempty"`
	Result      json.RawMessage `json:"result,omitempty"`
}

// decide answers POST /v1/operations/{key}/{approve|deny|resolve|probe}. The
// decision is recorded as the token's name. The answer is the operation's
// new state (for an approval, the result of the firing it let happen).
func (s *Server) decide(w http.ResponseWriter, r *http.Request, tok *auth.Token, body []byte) {
	key, op := r.PathValue("key"), r.PathValue("decision")
	if op != intent.ControlApprove && op != intent.ControlDeny && op != intent.ControlResolve && op != intent.ControlProbe {
		fail(w, http.StatusNotFound, codeNotFoundRoute, "no decision %q: use approve, deny, resolve or probe", clip(op))
		return
	}
	var d decisionBody
	if len(bytes.TrimSpace(body)) > 0 {
		dec := json.NewDecoder(bytes.NewReader(body))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&d); err != nil {
			fail(w, http.StatusBadRequest, codeInvalidRequest, "the body must be {fingerprint, reason, outcome, result}: %v", err)
			return
		}
	}
	wait := s.wait(w, r)
	if !s.reachable(w, r, tok, key) {
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), wait)
	defer cancel()
	res, err := s.cl.Decide(ctx, op, intent.Control{Key: key, Fingerprint: d.Fingerprint, By: tok.Name, Reason: d.Reason, Outcome: d.Outcome, Result: d.Result})
	switch {
	case errors.Is(err, intent.ErrInvalid):
		fail(w, http.StatusBadRequest, codeInvalidRequest, "%v", err)
		return
	case errors.Is(err, client.ErrNoAnswer):
		w.Header().Set("Location", operationPath(key))
		p := newProblem(http.StatusGatewayTimeout, codeNoAnswer, fmt.Sprintf("the %s was sent and no worker answered within %s; GET the Location for the outcome", op, wait))
		p.Key = key
		writeProblem(w, p)
		return
	case err != nil:
		s.unavailable(w, err)
		return
	}
	w.Header().Set("Location", operationPath(key))
	if res.Status == intent.StatusRejected && res.Error != nil && res.Error.Code == intent.CodeWrongState {
		s.wrongState(w, r, tok, op, key, res)
		return
	}
	if res.Status == intent.StatusRejected {
		writeAnswer(w, res, false, false)
		return
	}
	writeJSON(w, http.StatusOK, "application/json", res)
}

// wrongState answers a decision refused for the operation's state (409
// wrong_state): the record as read after the refusal, and who decided it
// otherwise and when, else the state it is in.
func (s *Server) wrongState(w http.ResponseWriter, r *http.Request, tok *auth.Token, op, key string, res *intent.Result) {
	var after *dedup.Record
	if rec, err := s.cl.Get(r.Context(), key); err == nil && tok.Reaches(rec.Session) {
		after = &rec
	}
	p := newProblem(http.StatusConflict, intent.CodeWrongState, refusedDetail(op, after, res.Error.Message))
	answer := *res
	answer.Error = &intent.Error{Code: intent.CodeWrongState, Message: p.Detail}
	p.Key, p.Answer, p.Record = key, &answer, after
	writeProblem(w, p)
}

// refusedDetail says why decision op does not apply to an operation whose
// record is after (nil: it could not be read): who decided it otherwise and
// when, else its state and the workers' why (msg), when it says more.
func refusedDetail(op string, after *dedup.Record, msg string) string {
	not := "Not " + console.PastTense(op)
	why := msg
	if _, rest, ok := strings.Cut(msg, dedup.ErrWrongState.Error()+": "); ok {
		why = rest
	}
	switch {
	case after == nil:
		return fmt.Sprintf("%s: the operation's state does not allow it (%s); GET the operation for its record. Nothing changed.", not, why)
	case after.Decision != nil:
		return console.DecidedOtherwise(op, after)
	}
	if why == string(after.Status) {
		why = ""
	} else {
		why = " (" + why + ")"
	}
	a, ok := map[string]string{intent.ControlApprove: "an approval", intent.ControlDeny: "a denial", intent.ControlResolve: "a resolution"}[op]
	if !ok {
		a = "a " + op
	}
	return fmt.Sprintf("%s: the operation is %s, and %s does not apply to it%s. Nothing changed.", not, console.StatusLabel(after.Status), a, why)
}

// reachable answers 404 unless key has a record the token reaches.
func (s *Server) reachable(w http.ResponseWriter, r *http.Request, tok *auth.Token, key string) bool {
	rec, err := s.cl.Get(r.Context(), key)
	switch {
	case errors.Is(err, client.ErrNotFound), err == nil && !tok.Reaches(rec.Session):
		fail(w, http.StatusNotFound, intent.CodeNotFound, "no operation %s", clip(key))
		return false
	case errors.Is(err, intent.ErrInvalid): // a key the ledger cannot hold
		fail(w, http.StatusBadRequest, codeInvalidRequest, "%v", err)
		return false
	case err != nil:
		s.unavailable(w, err)
		return false
	}
	return true
}

// forgotten is the answer of a forget.
type forgotten struct {
	Forgotten string       `json:"forgotten"`
	Record    dedup.Record `json:"record"`
}

// forget answers DELETE /v1/operations/{key}[?force=true][&reason=...]: the
// record is deleted so that the operation may run again, and every worker
// drops the key from its answer cache; the audit trail records the token's
// name and the reason. An unresolved operation is refused (409 unresolved)
// unless forced, and one that may be firing now (409 in_flight) even so; a
// forced forget of one pending past its lease answers after one more lease,
// once its record stayed unchanged.
func (s *Server) forget(w http.ResponseWriter, r *http.Request, tok *auth.Token, _ []byte) {
	key := r.PathValue("key")
	reason := ""
	opts := []client.ForgetOption{}
	for name, vs := range r.URL.Query() {
		if len(vs) > 1 {
			fail(w, http.StatusBadRequest, codeInvalidRequest, "%s: give it once", clip(name))
			return
		}
		switch name {
		case "force":
			force, err := strconv.ParseBool(vs[0])
			if err != nil {
				fail(w, http.StatusBadRequest, codeInvalidRequest, "force=%s: give true or false", clip(vs[0]))
				return
			}
			if force {
				opts = append(opts, client.Forced())
			}
		case "reason":
			reason = vs[0]
		default:
			fail(w, http.StatusBadRequest, codeInvalidRequest, "unknown parameter %q: use force or reason", clip(name))
			return
		}
	}
	opts = append(opts, client.ForgetBy(tok.Name, reason))
	if tok.Namespace != auth.AllNamespaces && !s.reachable(w, r, tok, key) {
		return
	}
	rec, err := s.cl.Forget(r.Context(), key, opts...)
	switch {
	case errors.Is(err, client.ErrInFlight):
		retryAfter(w, time.Until(rec.LeaseUntil))
		p := newProblem(http.StatusConflict, codeInFlight, err.Error())
		p.Key = key
		writeProblem(w, p)
	case errors.Is(err, client.ErrUnresolved):
		p := newProblem(http.StatusConflict, codeUnresolved, err.Error()+"; DELETE with ?force=true forgets it anyway")
		p.Key = key
		writeProblem(w, p)
	case errors.Is(err, client.ErrNotFound):
		fail(w, http.StatusNotFound, intent.CodeNotFound, "no operation %s (the workers were told to forget it anyway)", clip(key))
	case errors.Is(err, intent.ErrInvalid):
		fail(w, http.StatusBadRequest, codeInvalidRequest, "%v", err)
	case err != nil && r.Context().Err() != nil:
		return // the caller left during a forced forget's wait
	case err != nil:
		s.unavailable(w, err)
	default:
		writeJSON(w, http.StatusOK, "application/json", forgotten{Forgotten: key, Record: rec})
	}
}

// deadLetterList is the answer of GET /v1/dead-letters.
type deadLetterList struct {
	DeadLetters []client.DeadLetter `json:"dead_letters"`
}

// deadLetters answers GET /v1/dead-letters?limit=N (default 100, at most
// 1000), oldest first. Dead letters carry no trusted session, so only an
// operator of every namespace reads them.
func (s *Server) deadLetters(w http.ResponseWriter, r *http.Request, tok *auth.Token, _ []byte) {
	if !s.allNamespaces(w, r, tok) {
		return
	}
	limit := 100
	for name := range r.URL.Query() {
		if name != "limit" {
			fail(w, http.StatusBadRequest, codeInvalidRequest, "unknown parameter %q: use limit", clip(name))
			return
		}
	}
	if l := r.URL.Query().Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 || n > dedup.MaxListLimit {
			fail(w, http.StatusBadRequest, codeInvalidRequest, "limit=%s: give 1 to %d", clip(l), dedup.MaxListLimit)
			return
		}
		limit = n
	}
	letters, err := s.cl.DeadLetters(r.Context(), limit)
	if err != nil {
		s.unavailable(w, err)
		return
	}
	if letters == nil {
		letters = []client.DeadLetter{}
	}
	writeJSON(w, http.StatusOK, "application/json", deadLetterList{DeadLetters: letters})
}

// replayed is the answer of a dead-letter replay.
type replayed struct {
	Replayed  uint64 `json:"replayed"`
	StreamSeq uint64 `json:"stream_seq"`
}

// replay answers POST /v1/dead-letters/{seq}/replay: the intent is published
// again (the ledger decides whether it fires) and leaves the dead letters.
func (s *Server) replay(w http.ResponseWriter, r *http.Request, tok *auth.Token, _ []byte) {
	if !s.allNamespaces(w, r, tok) {
		return
	}
	seq, err := strconv.ParseUint(r.PathValue("seq"), 10, 64)
	if err != nil || seq == 0 {
		fail(w, http.StatusBadRequest, codeInvalidRequest, "%q is not a dead letter's seq (GET /v1/dead-letters lists them)", clip(r.PathValue("seq")))
		return
	}
	newSeq, err := s.cl.ReplayDeadLetter(r.Context(), seq)
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		fail(w, http.StatusNotFound, intent.CodeNotFound, "no dead letter %d", seq)
	case err != nil:
		s.unavailable(w, err)
	default:
		writeJSON(w, http.StatusOK, "application/json", replayed{Replayed: seq, StreamSeq: newSeq})
	}
}

// allNamespaces answers 403 unless tok reaches every namespace.
func (s *Server) allNamespaces(w http.ResponseWriter, r *http.Request, tok *auth.Token) bool {
	if tok.Namespace == auth.AllNamespaces {
		return true
	}
	s.bearer.Forbid(w, r, "dead letters are for operators of every namespace (*); %s's is %s", tok.Name, tok.Namespace)
	return false
}
