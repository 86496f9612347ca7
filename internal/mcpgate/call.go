package mcpgate

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.uber.org/zap"

	"github.com/idemgate/idemgate/internal/hint"
	"github.com/idemgate/idemgate/pkg/client"
	"github.com/idemgate/idemgate/pkg/intent"
)

// The names the gate reads on a call.
const (
	// MetaSession is the _meta field of a tools/call that names the stable
	// session (run, conversation, tenant) scoping the call's key. The agent
	// runtime sets it, never the model.
	MetaSession = "io.idemgate/session"
	// HeaderSession is the HTTP header naming the session when the call's
	// _meta does not.
	HeaderSession = "Idem-Session"
	// MetaOperation is the _meta field of a tool result describing the
	// operation: key, status, replayed, attempts.
	MetaOperation = "io.idemgate/operation"
	// approveInput names the elicitation in a call's input requests.
	approveInput = "approve"
)

// handler is the tools/call handler of the catalogue tool name.
func (g *Gate) handler(name string) mcp.ToolHandler {
	return func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		s, ok := g.lookup(name)
		if !ok {
			return toolError("Tool %s is no longer offered: the workers' catalogue does not list it. Nothing was done; list the tools again.", name), nil
		}
		session, err := g.scope(req)
		if err != nil {
			return toolError("%v. Nothing was done.", err), nil
		}
		args, problem := g.arguments(s, req.Params.Arguments)
		if problem != "" {
			return toolError("Invalid arguments for %s: %s. Nothing was done; fix the arguments and call again.", name, problem), nil
		}
		p, err := g.cl.Prepare(ctx, intent.Envelope{Tool: name, Args: args, Session: session}, intent.Limits{})
		if err == nil {
			err = p.CheckKeyArgs()
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return toolError("Invalid arguments for %s: %v. Nothing was done; fix the arguments and call again.", name, err), nil
		}
		return g.call(ctx, req, s, p)
	}
}

// scope is the session of a call: the one it names (see named) within its
// token's namespace over HTTP — "<namespace>" or "<namespace>/<session>",
// as the HTTP front door scopes a call — so that no caller runs in, or is
// replayed from, another namespace's session.
func (g *Gate) scope(req *mcp.CallToolRequest) (string, error) {
	s, err := named(req, g.cfg.Session)
	if err != nil {
		return "", err
	}
	if tok := caller(req); tok != nil {
		return tok.Scope(s), nil
	}
	if g.cfg.Tokens != nil && req.Extra != nil && req.Extra.Header != nil {
		// Over HTTP the door admits no request without a token.
		return "", errors.New("the request carries no token")
	}
	return s, nil
}

// named is the session a call names: its _meta field, else the HTTP header,
// else the gate's configured session. Never the MCP session id or the
// request id, which change on every reconnect and every retry.
func named(req *mcp.CallToolRequest, def string) (string, error) {
	if v, ok := req.Params.Meta[MetaSession]; ok && v != nil {
		s, isString := v.(string)
		if !isString {
			return "", fmt.Errorf("_meta %q must be a string", MetaSession)
		}
		return s, nil
	}
	if req.Extra != nil && req.Extra.Header != nil {
		if vs := req.Extra.Header.Values(HeaderSession); len(vs) > 0 {
			return vs[0], nil
		}
	}
	return def, nil
}

// keyLike are argument names, compared without case, '-' and '_', that
// callers use for idempotency keys of their own. The gate derives keys: such
// an argument is dropped unless the tool's schema or key spec declares it.
var keyLike = map[string]bool{
	"idempotencykey": true, "idempotencytoken": true, "requestid": true, "clientrequestid": true,
	"dedupkey": true, "dedupid": true, "deduplicationid": true, "nonce": true,
}

// arguments checks a call's arguments and returns them as the intent's args:
// an object (absent means {}), within the size limit, without undeclared
// key-like members. problem says what is wrong. The intent they make is then
// checked as every door checks it, its args parsed once (client.Prepare:
// intent.Build, the tool's schema; CheckKeyArgs). Here only the members'
// names are read: the args are encoded again only when one is dropped.
func (g *Gate) arguments(s *served, raw json.RawMessage) (json.RawMessage, string) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		raw = []byte("{}")
	}
	if len(raw) > g.cfg.MaxArgsBytes {
		return nil, fmt.Sprintf("they are %d bytes, over the limit of %d", len(raw), g.cfg.MaxArgsBytes)
	}
	var args map[string]json.RawMessage
	if err := json.Unmarshal(raw, &args); err != nil || args == nil {
		return nil, "they must be a JSON object"
	}
	dropped := false
	for name := range args {
		norm := strings.NewReplacer("-", "", "_", "").Replace(strings.ToLower(name))
		if keyLike[norm] && !s.declared[name] {
			delete(args, name)
			dropped = true
		}
	}
	if dropped {
		raw = marshal(args)
	}
	return raw, ""
}

// call submits p and answers with its outcome.
func (g *Gate) call(ctx context.Context, req *mcp.CallToolRequest, s *served, p *client.Prepared) (*mcp.CallToolResult, error) {
	if res, ok := g.approvalAnswered(ctx, req, s, p); ok {
		return g.userApproval(ctx, req, s, p, res)
	}
	cl := g.cl
	sub, err := cl.PublishPrepared(ctx, p)
	switch {
	case ctx.Err() != nil:
		return nil, ctx.Err()
	case err != nil:
		return note(hint.Unknown(fmt.Sprintf("idemgate could not submit the call (%v). It may or may not have been received; calling again with the same arguments is safe: it runs at most once.", err))), nil
	}
	res, err := g.wait(ctx, req, sub.Key, sub.Wait)
	if res == nil {
		return pendingOrCancelled(ctx, err, sub.Key)
	}
	if res.Status == intent.StatusAwaitingApproval && s.info.Approver == intent.ApproverUser {
		return g.userApproval(ctx, req, s, p, res)
	}
	return s.render(res), nil
}

// wait runs wait (a submission's Wait or WaitFinal) for at most
// Config.Wait, sending progress notifications meanwhile when the request
// asked for them. It returns a nil result when the wait ended first.
func (g *Gate) wait(ctx context.Context, req *mcp.CallToolRequest, key string, wait func(context.Context) (*intent.Result, error)) (*intent.Result, error) {
	wctx, cancel := context.WithTimeout(ctx, g.cfg.Wait)
	defer cancel()
	if token := req.Params.GetProgressToken(); token != nil && req.Session != nil {
		done := make(chan struct{})
		defer close(done)
		go g.progress(wctx, done, req.Session, token, key)
	}
	res, err := wait(wctx)
	if err != nil {
		return nil, err
	}
	return res, nil
}

// progress notifies the client every Config.ProgressEvery that the call's
// operation is still running, until done is closed or ctx ends.
func (g *Gate) progress(ctx context.Context, done <-chan struct{}, ss *mcp.ServerSession, token any, key string) {
	start := time.Now()
	tick := time.NewTicker(g.cfg.ProgressEvery)
	defer tick.Stop()
	for n := 1; ; n++ {
		select {
		case <-done:
			return
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		err := ss.NotifyProgress(ctx, &mcp.ProgressNotificationParams{
			ProgressToken: token,
			Progress:      float64(n),
			Message:       fmt.Sprintf("operation %s still running after %s", key, time.Since(start).Round(time.Second)),
		})
		if err != nil {
			g.log.Debug("progress notification", zap.String("key", key), zap.Error(err))
		}
	}
}

// pendingOrCancelled answers a call whose wait ended without an answer: the
// caller cancelled (the operation goes on; the error goes nowhere), or the
// wait ran out (the operation goes on; its reference is the answer).
func pendingOrCancelled(ctx context.Context, err error, key string) (*mcp.CallToolResult, error) {
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	if !errors.Is(err, client.ErrNoAnswer) {
		return note(hint.Unknown(fmt.Sprintf("idemgate could not learn the outcome (%v). The operation %s may still run once; check it with %s rather than calling again.", err, key, statusDoor.Check(key)))), nil
	}
	return stillRunning(key), nil
}
