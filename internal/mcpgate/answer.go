package mcpgate

import (
	"bytes"
	"encoding/json"
	"fmt"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/idemgate/idemgate/pkg/intent"
)

// operation is the io.idemgate/operation _meta of a tool result.
type operation struct {
	Key         string        `json:"key"`
	Tool        string        `json:"tool,omitempty"`
	Status      intent.Status `json:"status"`
	Replayed    bool          `json:"replayed"`
	Attempts    int           `json:"attempts"`
	Fingerprint string        `json:"fingerprint,omitempty"`
	CompletedAt *time.Time    `json:"completed_at,omitempty"`
}

// render turns an answer into the tool result the model reads: the result
// (structured, and as text) for a completed operation, with a note when it
// was replayed; a tool error that says what happened and what not to do for
// a failure, conflict, rejection or denial; and a reference to check later
// for an operation awaiting approval, uncertain or still running.
func render(res *intent.Result) *mcp.CallToolResult {
	op := operation{Key: res.Key, Tool: res.Tool, Status: res.Status, Replayed: res.Replayed, Attempts: res.Attempts, Fingerprint: res.Fingerprint}
	if !res.CompletedAt.IsZero() {
		at := res.CompletedAt.UTC()
		op.CompletedAt = &at
	}
	out := &mcp.CallToolResult{Meta: mcp.Meta{MetaOperation: op}}
	check := fmt.Sprintf("%s {\"operation\": %q}", StatusTool, res.Key)
	var text string
	switch res.Status {
	case intent.StatusCompleted:
		out.StructuredContent = structured(res.Result)
		text = string(resultJSON(res.Result))
		if res.Replayed {
			text = fmt.Sprintf("Already done, not repeated: operation %s completed at %s (an earlier call ran it); this call did not run it again. The recorded result:\n%s",
				res.Key, when(res.CompletedAt), text)
		}
	case intent.StatusAwaitingApproval:
		out.StructuredContent = reference(res)
		text = fmt.Sprintf("Awaiting approval: nothing has run yet. Operation %s runs once it is approved. Do not call the tool again to hurry it; check the outcome later with %s.", res.Key, check)
	case intent.StatusApproved, intent.StatusPending:
		out.StructuredContent = reference(res)
		text = fmt.Sprintf("Running: operation %s has not finished yet. Do not call the tool again; check later with %s.", res.Key, check)
	case intent.StatusUncertain:
		out.StructuredContent = reference(res)
		text = fmt.Sprintf("Uncertain: operation %s was interrupted while it ran and may or may not have happened. An operator will settle it; do not call the tool again. Check later with %s.", res.Key, check)
	default:
		out.IsError = true
		out.StructuredContent = reference(res)
		text = failureText(res)
	}
	out.Content = []mcp.Content{&mcp.TextContent{Text: text}}
	return out
}

// render is the tool result of an answer for s: for a tool of an upstream
// MCP server (effect mcp) a completed operation's result is the upstream's
// own content and structured content, with the replay note before it.
func (s *served) render(res *intent.Result) *mcp.CallToolResult {
	out := render(res)
	if s.info.Effect != kindMCP || res.Status != intent.StatusCompleted {
		return out
	}
	var up mcp.CallToolResult
	if err := json.Unmarshal(res.Result, &up); err != nil {
		return out
	}
	out.Content, out.StructuredContent = up.Content, up.StructuredContent
	if res.Replayed {
		note := fmt.Sprintf("Already done, not repeated: operation %s completed at %s (an earlier call ran it); this call did not run it again. The recorded result follows.", res.Key, when(res.CompletedAt))
		out.Content = append([]mcp.Content{&mcp.TextContent{Text: note}}, out.Content...)
	}
	return out
}

// failureText explains a final answer that is not a success.
func failureText(res *intent.Result) string {
	code, msg := "", ""
	if res.Error != nil {
		code, msg = res.Error.Code, res.Error.Message
	}
	switch res.Status {
	case intent.StatusConflict:
		return fmt.Sprintf("Conflict: nothing was done. Operation %s was first called with other arguments (%s). Calling again with these arguments is refused the same way: this is not a new operation. If you meant the recorded one, it already happened; if you meant another, it must differ in its key arguments.", res.Key, msg)
	case intent.StatusDenied:
		return fmt.Sprintf("Denied: operation %s was refused by its approver (%s). Nothing was done and it will not run: do not call again.", res.Key, msg)
	case intent.StatusFailed:
		return fmt.Sprintf("Failed (%s): %s. This outcome is recorded for operation %s: calling again with the same arguments returns this failure and does not run it again. Do not retry unless the failure says the arguments were wrong.", code, msg, res.Key)
	case intent.StatusRejected:
		if code == intent.CodeRateLimited {
			return fmt.Sprintf("Rejected (rate_limited): %s. Nothing was done; call again later with the same arguments.", msg)
		}
		return fmt.Sprintf("Rejected (%s): %s. Nothing was done; fix the call before calling again.", code, msg)
	}
	return fmt.Sprintf("Operation %s ended %s (%s: %s).", res.Key, res.Status, code, msg)
}

// toolError is a tool error whose text tells the model what happened.
func toolError(format string, args ...any) *mcp.CallToolResult {
	return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: fmt.Sprintf(format, args...)}}}
}

// stillRunning answers a call whose wait ran out.
func stillRunning(key string) *mcp.CallToolResult {
	return &mcp.CallToolResult{
		Meta:              mcp.Meta{MetaOperation: operation{Key: key, Status: intent.StatusPending}},
		StructuredContent: map[string]any{"status": intent.StatusPending, "operation": key},
		Content: []mcp.Content{&mcp.TextContent{Text: fmt.Sprintf(
			"Still running: operation %s has not finished yet and goes on. Do not call the tool again; check later with %s {\"operation\": %q}.", key, StatusTool, key)}},
	}
}

// reference is the structured content of an answer that is not a result.
func reference(res *intent.Result) map[string]any {
	m := map[string]any{"status": res.Status, "operation": res.Key}
	if res.Error != nil {
		m["error"] = res.Error
	}
	return m
}

// structured is a result as MCP structured content, which clients expect to
// be an object: an object result as it is, anything else as {"result": v}.
func structured(result json.RawMessage) any {
	data := resultJSON(result)
	if bytes.HasPrefix(bytes.TrimSpace(data), []byte("{")) {
		return data
	}
	return map[string]json.RawMessage{"result": data}
}

func resultJSON(result json.RawMessage) json.RawMessage {
	if len(bytes.TrimSpace(result)) == 0 {
		return json.RawMessage("null")
	}
	return result
}

func when(t time.Time) string {
	if t.IsZero() {
		return "an earlier time"
	}
	return t.UTC().Format(time.RFC3339)
}
