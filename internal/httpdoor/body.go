package httpdoor

import (
	"errors"
	"io"
	"net/http"
	"os"
	"time"
)

// ReadBody reads r's whole body, at most limit bytes arriving within
// timeout, then lifts the read deadline so that a long wait for the answer
// is not cut. It answers and returns false for a body over limit (413,
// told by its Content-Length before any is read), one that does not arrive
// in time (408, and the connection is closed) or one that cannot be read
// (400).
func ReadBody(w http.ResponseWriter, r *http.Request, limit int64, timeout time.Duration) ([]byte, bool) {
	if r.ContentLength > limit {
		Problem(w, http.StatusRequestEntityTooLarge, CodeTooLarge, "the body is %d bytes, the limit is %d", r.ContentLength, limit)
		return nil, false
	}
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(time.Now().Add(timeout))
	data, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &tooLarge):
		Problem(w, http.StatusRequestEntityTooLarge, CodeTooLarge, "the body is over the limit of %d bytes", limit)
		return nil, false
	case errors.Is(err, os.ErrDeadlineExceeded):
		w.Header().Set("Connection", "close")
		Problem(w, http.StatusRequestTimeout, CodeTimeout, "the body did not arrive within %s", timeout)
		return nil, false
	case err != nil:
		Problem(w, http.StatusBadRequest, CodeInvalidRequest, "read the body: %v", err)
		return nil, false
	}
	_ = rc.SetReadDeadline(time.Time{})
	return data, true
}
