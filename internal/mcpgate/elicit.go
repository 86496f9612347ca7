package mcpgate

import (
	"context"
	"fmt"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/idemgate/idemgate/pkg/client"
	"github.com/idemgate/idemgate/pkg/dedup"
	"github.com/idemgate/idemgate/pkg/intent"
)

// userApproval goes on with a call whose operation awaits the approval of
// the person at the client (approver: user). A client that can elicit is
// asked — as a multi round-trip input request, which the SDK turns into an
// elicitation/create request for clients of earlier protocol versions —
// showing exactly the args the decision binds to (their fingerprint). The
// answer is published on the user's decision subjects and decided on the
// same compare-and-set path as an operator's: an approval fires the
// operation once however many calls are approved, a decline denies it. A client that cannot elicit, or a person who dismisses
// the question, leaves the operation to an operator.
func (g *Gate) userApproval(ctx context.Context, req *mcp.CallToolRequest, s *served, p *client.Prepared, res *intent.Result) (*mcp.CallToolResult, error) {
	cl, id := g.cl, p.ID
	resp, answered := req.Params.InputResponses[approveInput]
	if !answered {
		if caps := req.ClientCapabilities(); caps == nil || caps.Elicitation == nil {
			return s.render(res), nil
		}
		return &mcp.CallToolResult{InputRequests: mcp.InputRequestMap{approveInput: &mcp.ElicitParams{
			Mode:            "form",
			Message:         approvalQuestion(p.Envelope, id.Key),
			RequestedSchema: map[string]any{"type": "object", "properties": map[string]any{}},
		}}}, nil
	}
	er, ok := resp.(*mcp.ElicitResult)
	if !ok {
		return s.render(res), nil
	}
	by := "the user at the MCP client"
	if info := req.ClientInfo(); info != nil && info.Name != "" {
		by = "the user at " + info.Name
	}
	var op string
	d := intent.Control{Key: id.Key, Fingerprint: id.Fingerprint, By: by}
	switch er.Action {
	case "accept":
		op = intent.ControlUserApprove
	case "decline":
		op, d.Reason = intent.ControlUserDeny, "declined by "+by
	default: // dismissed: no decision
		return s.render(res), nil
	}
	ans, err := g.wait(ctx, req, id.Key, func(ctx context.Context) (*intent.Result, error) {
		return cl.Decide(ctx, op, d)
	})
	if ans == nil {
		return pendingOrCancelled(ctx, err, id.Key)
	}
	if ans.Status != intent.StatusRejected && ans.Status.Final() {
		ans.Replayed = false // this call's decision caused the outcome
		return s.render(ans), nil
	}
	// The decision did not apply (another call decided first): answer with
	// the operation's final outcome.
	again, err := cl.PublishPrepared(ctx, p)
	if err != nil {
		return pendingOrCancelled(ctx, err, id.Key)
	}
	final, err := g.wait(ctx, req, id.Key, again.WaitFinal)
	if final == nil {
		return pendingOrCancelled(ctx, err, id.Key)
	}
	return s.render(final), nil
}

// approvalAnswered is the answer the record gives a call that answers the
// approval question (its input response carries it), when the record its
// first round left still awaits this call's approval: that round's intent
// is not published again. ok is false otherwise (no record, decided since,
// another call's arguments), and the call goes the whole way.
func (g *Gate) approvalAnswered(ctx context.Context, req *mcp.CallToolRequest, s *served, p *client.Prepared) (*intent.Result, bool) {
	if _, answered := req.Params.InputResponses[approveInput]; !answered || s.info.Approver != intent.ApproverUser {
		return nil, false
	}
	rec, err := g.cl.Get(ctx, p.ID.Key)
	if err != nil || rec.Status != intent.StatusAwaitingApproval || rec.Fingerprint != p.ID.Fingerprint {
		return nil, false
	}
	res := rec.Answer(dedup.Caller{Key: p.ID.Key, Fingerprint: p.ID.Fingerprint, Tool: p.Envelope.Tool, CallID: p.Envelope.CallID}, true)
	return &res, true
}

// approvalQuestion asks the person at the client to approve one operation,
// showing the arguments whose fingerprint the approval binds to.
func approvalQuestion(env *intent.Envelope, key string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Allow %s to run with these arguments?\n\n%s\n\n", env.Tool, env.Args)
	if env.Session != "" {
		fmt.Fprintf(&b, "Session: %s\n", env.Session)
	}
	fmt.Fprintf(&b, "It runs once (operation %s). Accept to run it, decline to refuse it.", key)
	return b.String()
}
