package httpapi

import (
	"encoding/json"
	"errors"
	"net/http"
	"time"

	"github.com/idemgate/idemgate/internal/auth"

	"github.com/idemgate/idemgate/pkg/audit"
	"github.com/idemgate/idemgate/pkg/intent"
)

// history is the answer of GET /v1/operations/{key}/history.
type history struct {
	Key     string            `json:"key"`
	Entries []json.RawMessage `json:"entries"`
}

// getHistory answers GET /v1/operations/{key}/history: the audit trail's
// entries about the operation, oldest first (docs/audit.md), from ?since=
// (RFC 3339, or a duration back from now; default: an hour before the
// record's creation, or the whole trail when the key has no record). A
// token of one namespace sees an operation's history when its events name
// sessions of that namespace only (a forgotten event names none).
func (s *Server) getHistory(w http.ResponseWriter, r *http.Request, tok *auth.Token, _ []byte) {
	key := r.PathValue("key")
	var since time.Time
	for name, vs := range r.URL.Query() {
		if name != "since" {
			fail(w, http.StatusBadRequest, codeInvalidRequest, "unknown parameter %q: use since", clip(name))
			return
		}
		v := vs[0]
		if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
			since = t
		} else if d, err := time.ParseDuration(v); err == nil && d > 0 {
			since = time.Now().Add(-d)
		} else {
			fail(w, http.StatusBadRequest, codeInvalidRequest, "since=%s: give an RFC 3339 time or a duration back from now (24h)", clip(v))
			return
		}
	}
	lines, err := s.cl.History(r.Context(), key, since)
	switch {
	case errors.Is(err, intent.ErrInvalid):
		fail(w, http.StatusBadRequest, codeInvalidRequest, "%v", err)
		return
	case err != nil:
		s.unavailable(w, err)
		return
	}
	if len(lines) == 0 || !tok.ReachesHistory(lines) {
		fail(w, http.StatusNotFound, intent.CodeNotFound, "no audit history of %s", clip(key))
		return
	}
	out := history{Key: key, Entries: make([]json.RawMessage, len(lines))}
	for i, line := range lines {
		out.Entries[i] = line
	}
	writeJSON(w, http.StatusOK, "application/json", out)
}

// getAuditKeys answers GET /v1/audit/keys: the public keys the workers
// published, as a keys file (audit.ParseKeys reads it). They are as
// trustworthy as this server: an auditor pins its own.
func (s *Server) getAuditKeys(w http.ResponseWriter, r *http.Request, _ *auth.Token, _ []byte) {
	keys, err := s.cl.PublishedKeys(r.Context())
	if err != nil {
		s.unavailable(w, err)
		return
	}
	writeJSON(w, http.StatusOK, "application/json", keys)
}

// getAuditCheckpoint answers GET /v1/audit/checkpoint: signed checkpoints
// of every partition of the trail (a checkpoint file, audit.CheckpointFile)
// — fresh ones a worker makes on request, else the latest stored.
func (s *Server) getAuditCheckpoint(w http.ResponseWriter, r *http.Request, _ *auth.Token, _ []byte) {
	cps, _, err := s.cl.Checkpoints(r.Context())
	if err != nil {
		s.unavailable(w, err)
		return
	}
	if len(cps) == 0 {
		fail(w, http.StatusServiceUnavailable, codeUnavailable, "no checkpoints: no worker answered and none are stored; try again")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(append(audit.MarshalCheckpoints(cps), '\n'))
}
