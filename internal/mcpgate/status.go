package mcpgate

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/idemgate/idemgate/internal/hint"
	"github.com/idemgate/idemgate/pkg/client"
	"github.com/idemgate/idemgate/pkg/dedup"
)

// statusArgs are idemgate_status's arguments.
type statusArgs struct {
	Operation   string  `json:"operation" jsonschema:"the operation reference a tool result gave (its key)"`
	WaitSeconds float64 `json:"wait_seconds,omitempty" jsonschema:"wait up to this many seconds (at most 60) for the operation to move on; default 0: answer at once"`
}

func (g *Gate) addStatusTool() {
	mcp.AddTool(g.server, &mcp.Tool{
		Name:  StatusTool,
		Title: "Operation status",
		Description: "The state of an operation a tool call started, by the operation reference the call's answer gave: " +
			"completed (with its result), failed, denied, awaiting_approval, uncertain or still running. " +
			"Read-only; call it instead of calling the tool again.",
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true, OpenWorldHint: new(false)},
	}, g.status)
}

// status answers idemgate_status: the operation's record, after waiting (at
// most wait_seconds) for it to leave its current state. Over HTTP with
// tokens, a record of a session outside the caller's namespace is answered
// as a missing one, at once as a missing one is.
func (g *Gate) status(ctx context.Context, req *mcp.CallToolRequest, in statusArgs) (*mcp.CallToolResult, any, error) {
	if in.Operation == "" {
		return toolError("Give the operation reference a tool result named, as {\"operation\": \"tool.<hex>\"}."), nil, nil
	}
	if in.WaitSeconds < 0 || in.WaitSeconds > MaxStatusWait.Seconds() {
		return toolError("wait_seconds must be between 0 and %g.", MaxStatusWait.Seconds()), nil, nil
	}
	cl := g.cl
	rec, err := cl.Get(ctx, in.Operation)
	if err == nil && !g.reaches(req, rec.Session) {
		err = client.ErrNotFound
	}
	if err != nil {
		return statusError(in.Operation, err), nil, nil
	}
	if wait := time.Duration(in.WaitSeconds * float64(time.Second)); wait > 0 && !rec.Status.Final() {
		wctx, cancel := context.WithTimeout(ctx, wait)
		defer cancel()
		rec = g.next(wctx, cl, in.Operation, rec)
		if ctx.Err() != nil {
			return nil, nil, ctx.Err()
		}
	}
	return statusResult(in.Operation, rec), nil, nil
}

// reaches reports whether the caller of req may read records of session:
// a token reaches its namespace's sessions; stdio, and HTTP without tokens,
// reach every session.
func (g *Gate) reaches(req *mcp.CallToolRequest, session string) bool {
	if tok := caller(req); tok != nil {
		return tok.Reaches(session)
	}
	return g.cfg.Tokens == nil || req.Extra == nil || req.Extra.Header == nil
}

// next waits (watching, never polling) until key's record leaves from's
// state, or ctx ends, and returns the latest record seen.
func (g *Gate) next(ctx context.Context, cl *client.Client, key string, from dedup.Record) dedup.Record {
	var rec dedup.Record
	var err error
	if from.Status.Answered() {
		// Waiting for a person (awaiting_approval, uncertain): the next
		// state worth reporting is the final one.
		rec, err = cl.WatchFinal(ctx, key)
	} else {
		// Pending or approved: the watch reports the next answered record.
		rec, err = cl.Watch(ctx, key)
	}
	if err != nil && rec.Status == "" {
		return from
	}
	return rec
}

func statusError(key string, err error) *mcp.CallToolResult {
	if errors.Is(err, client.ErrNotFound) {
		return toolError("No operation %s is recorded: it was never submitted, its reference is mistyped, or its record outlived the ledger's retention.", key)
	}
	return note(hint.Unknown(fmt.Sprintf("idemgate could not read operation %s (%v); try again.", key, err)))
}

// statusResult renders a record as idemgate_status's answer: as a call's
// answer, never a replay (the model asked for the record).
func statusResult(key string, rec dedup.Record) *mcp.CallToolResult {
	res := rec.Answer(dedup.Caller{Key: key}, false)
	res.Replayed = false
	return render(&res, statusDoor)
}
