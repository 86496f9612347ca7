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
	CodeUnauthorized   = "unauthorized"      // no bearer token, or a malformed or unknown one (401)
	CodeForbidden      = "forbidden"         // the token may not make the request (403)
	CodeTooLarge       = intent.CodeTooLarge // the body is over the limit (413)
	CodeTimeout        = "request_timeout"   // the body did not arrive in time (408)
	CodeInvalidRequest = "invalid_request"   // the request is malformed (400)
)

// problemTypePrefix names a problem type by its code: urn:idemgate:problem:<code>.
const problemTypePrefix = "urn:idemgate:problem:"

var titles = map[string]string{
	CodeUnauthorized:   "A valid bearer token is required",
	CodeForbidden:      "Not allowed for this token",
	CodeTooLarge:       "Too large",
	CodeTimeout:        "The request body did not arrive in time",
	CodeInvalidRequest: "The request is malformed",
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
	}{problemTypePrefix + code, Title(code, status), status, fmt.Sprintf(format, args...), code})
	w.Header().Set("Content-Type", "application/problem+json")
	w.Header().Set("Content-Length", strconv.Itoa(b.Len()))
	w.WriteHeader(status)
	_, _ = w.Write(b.Bytes())
}
