package httpapi

import (
	"errors"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/idemgate/idemgate/pkg/intent"
)

// Request headers of a tool call besides Authorization and traceparent.
const (
	// HeaderIdempotencyKey is the caller's own name for the operation (the
	// IETF Idempotency-Key header): the envelope's key override.
	HeaderIdempotencyKey = "Idempotency-Key"
	// HeaderSession is the session the call runs in (within the token's
	// namespace).
	HeaderSession = "Idem-Session"
	// HeaderCallID is the model's tool_call_id, informational.
	HeaderCallID = "Idem-Call-Id"
	// HeaderSubmission names the call (intent.HeaderSubmission): one
	// random value a client sends on every repeat of one call, so that a
	// repeat is never taken for a new call (a failed operation runs again
	// only for a new call). Without it each request is a call of its own.
	HeaderSubmission = intent.HeaderSubmission
	// HeaderCreatedAt is the operation's creation time (RFC 3339), for tools
	// keyed by a time window; set it once per operation, not per retry.
	HeaderCreatedAt = "Idem-Created-At"
	// HeaderReplayed marks an answer that reports an outcome another call
	// caused.
	HeaderReplayed = "Idempotent-Replayed"
	// HeaderNamespace is the token's namespace, on the catalogue's answer:
	// what scopes the session of every call the token makes ("*": none).
	HeaderNamespace = "Idem-Namespace"
)

// maxSessionBytes bounds the Idem-Session header.
const maxSessionBytes = 256

// idempotencyKey reads the Idempotency-Key header: a Structured Field
// string ("..." with \" and \\ escapes, RFC 8941) as the draft defines it,
// or, as most servers accept, the bare value. Absent is "".
func idempotencyKey(h http.Header) (string, error) {
	vs := h.Values(HeaderIdempotencyKey)
	switch {
	case len(vs) == 0:
		return "", nil
	case len(vs) > 1:
		return "", errors.New("more than one Idempotency-Key header")
	}
	v := strings.TrimSpace(vs[0])
	if v == "" {
		return "", errors.New("Idempotency-Key is empty: leave the header out to derive the key from the arguments")
	}
	if !strings.HasPrefix(v, `"`) {
		return v, nil
	}
	var b strings.Builder
	for i := 1; i < len(v); i++ {
		switch c := v[i]; {
		case c == '\\':
			if i+1 >= len(v) || (v[i+1] != '"' && v[i+1] != '\\') {
				return "", errors.New(`Idempotency-Key: a backslash must escape " or \`)
			}
			i++
			b.WriteByte(v[i])
		case c == '"':
			if i != len(v)-1 {
				return "", errors.New("Idempotency-Key: text after the closing quote")
			}
			if b.Len() == 0 {
				return "", errors.New("Idempotency-Key is empty")
			}
			return b.String(), nil
		case c < 0x20 || c > 0x7e:
			return "", errors.New("Idempotency-Key: a Structured Field string holds printable ASCII only")
		default:
			b.WriteByte(c)
		}
	}
	return "", errors.New("Idempotency-Key: no closing quote")
}

// preferredWait reads the wait preference of Prefer headers (RFC 7240:
// "Prefer: wait=10", possibly among other preferences). ok is false when
// there is none, or when its value is not a number of seconds: RFC 7240
// has a server ignore a preference it cannot honour. Only the first wait
// preference counts, as RFC 7240 says of a repeated one.
func preferredWait(h http.Header) (d time.Duration, ok bool) {
	for _, v := range h.Values("Prefer") {
		for pref := range strings.SplitSeq(v, ",") {
			name, val, _ := strings.Cut(strings.TrimSpace(pref), "=")
			if !strings.EqualFold(strings.TrimSpace(name), "wait") {
				continue
			}
			val, _, _ = strings.Cut(val, ";")
			d, err := seconds(strings.Trim(strings.TrimSpace(val), `"`))
			return d, err == nil
		}
	}
	return 0, false
}

// seconds reads a non-negative number of seconds (a fraction is allowed).
func seconds(s string) (time.Duration, error) {
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || f < 0 || math.IsInf(f, 0) || math.IsNaN(f) || f > 1e6 {
		return 0, errors.New("give a number of seconds, e.g. 30")
	}
	return time.Duration(f * float64(time.Second)), nil
}

// clampWait bounds a requested wait to [1s, max].
func clampWait(d, maxWait time.Duration) time.Duration {
	return min(max(d, time.Second), maxWait)
}

// formatSeconds writes d as whole seconds, rounded up.
func formatSeconds(d time.Duration) string {
	return strconv.FormatInt(int64((d+time.Second-1)/time.Second), 10)
}
