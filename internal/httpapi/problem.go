package httpapi

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/idemgate/idemgate/internal/hint"
	"github.com/idemgate/idemgate/internal/httpdoor"
	"github.com/idemgate/idemgate/pkg/dedup"
	"github.com/idemgate/idemgate/pkg/intent"
)

// Error codes of the HTTP API besides the protocol's (intent.Code*).
const (
	codeInFlight        = "in_flight"                 // the wait ran out while the operation is still running; a forget of one that may be firing
	codeUnresolved      = "unresolved"                // a forget, not forced, of an unresolved operation
	codeNoAnswer        = "no_answer"                 // no worker answered in time (a read, or a decision)
	codeUnauthorized    = httpdoor.CodeUnauthorized   // no bearer token, or a malformed or unknown one
	codeForbidden       = httpdoor.CodeForbidden      // the token's role or namespace does not allow the request
	codeInvalidRequest  = httpdoor.CodeInvalidRequest // a header or query parameter is malformed
	codeUnavailable     = httpdoor.CodeUnavailable    // NATS, the workers or the ledger cannot be reached
	codeMethod          = "method_not_allowed"
	codeHeadersTooLarge = "headers_too_large"  // the request line and headers are over 16 KiB
	codeNotFoundRoute   = httpdoor.CodeNoRoute // no such endpoint
)

// problem is an RFC 9457 problem details object, with the error code and,
// when the problem is an operation's answer, the answer itself.
type problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
	// Code is the protocol's (or this API's) error code.
	Code string `json:"code"`
	// Key is the operation's key, when there is one.
	Key string `json:"key,omitempty"`
	// Answer is the operation's answer when the problem is one (a conflict,
	// a failure, a denial, a rejection).
	Answer *intent.Result `json:"answer,omitempty"`
	// Hint is what a model reads about the answer, when the problem is one.
	Hint *hint.Hint `json:"hint,omitempty"`
	// Record is the operation's record, as read after a decision was
	// refused for its state (wrong_state).
	Record *dedup.Record `json:"record,omitempty"`
}

// titles are the problems' titles besides those of httpdoor's codes.
var titles = map[string]string{
	intent.CodeInvalidIntent: "The intent is malformed",
	intent.CodeUnknownTool:   "No such tool",
	intent.CodeToolMismatch:  "The intent names another tool",
	intent.CodeConflict:      "The key was used with other arguments",
	intent.CodeEffectFailed:  "The operation failed",
	intent.CodeDenied:        "An operator denied the operation",
	intent.CodeAlreadyDone:   "The operation already ran",
	intent.CodeWrongState:    "The decision does not apply to the operation's state",
	intent.CodeNotFound:      "No such operation",
	codeInFlight:             "The operation is still in flight",
	codeUnresolved:           "The operation is unresolved",
	codeNoAnswer:             "No answer in time",
	codeMethod:               "Method not allowed",
	codeHeadersTooLarge:      "The request headers are too large",
}

func newProblem(status int, code, detail string) *problem {
	title := titles[code]
	if title == "" {
		title = httpdoor.Title(code, status)
	}
	return &problem{Type: httpdoor.ProblemType(code), Title: title, Status: status, Detail: detail, Code: code}
}

// writeProblem answers with p as application/problem+json.
func writeProblem(w http.ResponseWriter, p *problem) {
	writeJSON(w, p.Status, "application/problem+json", p)
}

// fail answers with a problem of status and code.
func fail(w http.ResponseWriter, status int, code, format string, args ...any) {
	writeProblem(w, newProblem(status, code, fmt.Sprintf(format, args...)))
}

// writeJSON answers with v as JSON of the given content type.
func writeJSON(w http.ResponseWriter, status int, contentType string, v any) {
	data, err := json.Marshal(v)
	if err != nil {
		status, contentType = http.StatusInternalServerError, "application/problem+json"
		data, _ = json.Marshal(newProblem(status, "internal", "encode the response: "+err.Error()))
	}
	w.Header().Set("Content-Type", contentType)
	w.Header().Set("Content-Length", strconv.Itoa(len(data)+1))
	w.WriteHeader(status)
	_, _ = w.Write(append(data, '\n'))
}

// retryAfter sets the Retry-After header to d, in whole seconds (at least 1).
func retryAfter(w http.ResponseWriter, d time.Duration) {
	s := int((d + time.Second - 1) / time.Second)
	w.Header().Set("Retry-After", strconv.Itoa(max(s, 1)))
}

// answerStatus is the HTTP status of an operation's answer, and whether it
// is sent as a problem.
func answerStatus(res *intent.Result) (int, bool) {
	switch res.Status {
	case intent.StatusCompleted:
		return http.StatusOK, false
	case intent.StatusAwaitingApproval, intent.StatusUncertain:
		return http.StatusAccepted, false
	case intent.StatusConflict:
		return http.StatusUnprocessableEntity, true
	case intent.StatusFailed:
		return http.StatusBadGateway, true
	case intent.StatusDenied:
		return http.StatusForbidden, true
	case intent.StatusAlreadyDone:
		return http.StatusConflict, true
	}
	if res.Error != nil {
		return codeStatus(res.Error.Code), true
	}
	return http.StatusBadRequest, true
}

// codeStatus is the HTTP status of a rejection with an error code.
func codeStatus(code string) int {
	switch code {
	case intent.CodeUnknownTool, intent.CodeNotFound:
		return http.StatusNotFound
	case intent.CodeTooLarge:
		return http.StatusRequestEntityTooLarge
	case intent.CodeRateLimited, intent.CodeBudgetExceeded:
		return http.StatusTooManyRequests
	case intent.CodeWrongState:
		return http.StatusConflict
	case intent.CodeConflict:
		return http.StatusUnprocessableEntity
	}
	return http.StatusBadRequest
}

// writeAnswer answers with an operation's answer: the result itself for
// completed, awaiting_approval and uncertain, a problem carrying it
// otherwise; either with the hint a model reads (internal/hint). A replay
// has Idempotent-Replayed: true; an answer of a ledger tool has the
// operation's Location, unless it is a rejection, which leaves no record to
// find there. retryFailed is set for a tool whose failed operation runs
// again when called again.
func writeAnswer(w http.ResponseWriter, res *intent.Result, ledger, retryFailed bool) {
	if res.Replayed {
		w.Header().Set("Idempotent-Replayed", "true")
	}
	if ledger && res.Key != "" && res.Status != intent.StatusRejected {
		w.Header().Set("Location", operationPath(res.Key))
	}
	status, isProblem := answerStatus(res)
	if status == http.StatusTooManyRequests {
		retryAfter(w, max(time.Until(res.RetryAt), time.Second))
	}
	h := hint.For(res, hint.Door{Check: checkOperation, RetryFailed: retryFailed})
	if !isProblem {
		writeJSON(w, status, "application/json", struct {
			*intent.Result
			Hint hint.Hint `json:"hint"`
		}{res, h})
		return
	}
	code, detail := string(res.Status), ""
	if res.Error != nil {
		code, detail = res.Error.Code, res.Error.Message
	}
	p := newProblem(status, code, detail)
	p.Key, p.Answer, p.Hint = res.Key, res, &h
	writeProblem(w, p)
}

// checkOperation is how a reader of an answer follows key's operation up.
func checkOperation(key string) string {
	return "GET " + operationPath(key) + " (with ?wait=30 it waits up to 30 s for the final outcome)"
}

// operationPath is the URL path of key's operation.
func operationPath(key string) string { return "/v1/operations/" + key }
