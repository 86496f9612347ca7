package httpdoor

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"

	"github.com/idemgate/idemgate/pkg/intent"
)

// Codes of the problems the doors answer a fault of this package with.
const (
	CodeUnauthorized   = "unauthorized"         // no bearer token, or a malformed or unknown one (401)
	CodeForbidden      = "forbidden"            // the token may not make the request (403)
	CodeTooLarge       = intent.CodeTooLarge    // the body is over the limit (413)
	CodeTimeout        = "request_timeout"      // the body did not arrive in time (408)
	CodeInvalidRequest = "invalid_request"      // the request is malformed (400)
	CodeRateLimited    = intent.CodeRateLimited // the caller is over a rate or a count of requests (429)
	CodeNoRoute        = "no_route"             // no such endpoint (404)
	CodeUnavailable    = "unavailable"          // NATS, the workers or the ledger cannot be reached (503)
)

// ProblemType is the type of a problem of code: urn:idemgate:problem:<code>.
func ProblemType(code string) string { return "urn:idemgate:problem:" + code }

var titles = map[string]string{
	CodeUnauthorized:   "A valid bearer token is required",
	CodeForbidden:      "Not allowed for this token",
	CodeTooLarge:       "Too large",
	CodeTimeout:        "The request body did not arrive in time",
	CodeInvalidRequest: "The request is malformed",
	CodeRateLimited:    "Rate limited",
	CodeNoRoute:        "No such endpoint",
	CodeUnavailable:    "The idemgate installation cannot be reached",
}

// Title is the title of a problem of code: this package's own for its
// codes, else the status text of status.
func Title(code string, status int) string {
	if t := titles[code]; t != "" {
		return t
	}
	return http.StatusText(status)
}

// Problem answers with an RFC 9457 problem of status and code
// (application/problem+json: type, title, status, detail, code), the form
// both doors answer a fault in (docs/http.md).
func Problem(w http.ResponseWriter, status int, code, format string, args ...any) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(struct {
		Type   string `json:"type"`
		Title  string `json:"title"`
		Status int    `json:"status"`
		Detail string `json:"detail,omitempty"`
		Code   string `json:"code"`
	}{ProblemType(code), Title(code, status), status, fmt.Sprintf(format, args...), code})
	w.Header().Set("Content-Type", "application/problem+json")
	w.Header().Set("Content-Length", strconv.Itoa(b.Len()))
	w.WriteHeader(status)
	_, _ = w.Write(b.Bytes())
}
