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
	// Receipt is the signed event that recorded a final outcome
	// (docs/audit.md), for a client to keep or verify.
	Receipt json.RawMessage `json:"receipt,omitempty"`
}

// render turns an answer into the tool result the model reads: the result
// for a completed operation, with a note when it was replayed; a tool error
// that says what happened and what not to do for a failure, conflict,
// rejection or denial; and a reference to check later for an operation
// awaiting approval, uncertain or still running. Every one has structured
// content whose JSON is its first text item (see answer).
func render(res *intent.Result) *mcp.CallToolResult {
	op := operation{Key: res.Key, Tool: res.Tool, Status: res.Status, Replayed: res.Replayed, Attempts: res.Attempts, Fingerprint: res.Fingerprint, Receipt: res.Receipt}
	if !res.CompletedAt.IsZero() {
		at := res.CompletedAt.UTC()
		op.CompletedAt = &at
	}
	check := fmt.Sprintf("%s {\"operation\": %q}", StatusTool, res.Key)
	switch res.Status {
	case intent.StatusCompleted:
		if res.Replayed {
			return answer(op, false, structured(res.Result), replayNote(res))
		}
		return answer(op, false, structured(res.Result))
	case intent.StatusAwaitingApproval:
		return answer(op, false, reference(res), fmt.Sprintf("Awaiting approval: nothing has run yet. Operation %s runs once it is approved. Do not call the tool again to hurry it; check the outcome later with %s.", res.Key, check))
	case intent.StatusApproved, intent.StatusPending:
		return answer(op, false, reference(res), fmt.Sprintf("Running: operation %s has not finished yet. Do not call the tool again; check later with %s.", res.Key, check))
	case intent.StatusUncertain:
		return answer(op, false, reference(res), fmt.Sprintf("Uncertain: operation %s was interrupted while it ran and may or may not have happened. An operator will settle it; do not call the tool again. Check later with %s.", res.Key, check))
	case intent.StatusAlreadyDone:
		ran := reference(res)
		ran["result"], ran["completed_at"], ran["attempts"] = resultJSON(res.Result), op.CompletedAt, res.Attempts
		return answer(op, true, ran, fmt.Sprintf("Already done: operation %s ran and completed at %s; this tool does not run an operation twice, so this call did nothing. "+
			"The recorded result is above. Do not call again with these arguments; if you meant a new operation, its key arguments must differ.", res.Key, when(res.CompletedAt)))
	}
	return answer(op, true, reference(res), failureText(res))
}

// answer is a tool result with structured content v whose first text item is
// v's JSON, byte for byte, on every call: MCP asks a tool that returns
// structured content to return its JSON as text too, and a client that
// parses content[0].text must get the same on a replay as on a first run.
// Notes for the model follow, each in an item of its own.
func answer(op operation, isError bool, v any, notes ...string) *mcp.CallToolResult {
	data, err := json.Marshal(v)
	if err != nil { // a recorded result that is not JSON
		data = marshal(map[string]string{"error": "the recorded result is not JSON: " + err.Error()})
	}
	out := &mcp.CallToolResult{
		Meta:              mcp.Meta{MetaOperation: op},
		IsError:           isError,
		StructuredContent: json.RawMessage(data),
		Content:           []mcp.Content{&mcp.TextContent{Text: string(data)}},
	}
	for _, n := range notes {
		out.Content = append(out.Content, &mcp.TextContent{Text: n})
	}
	return out
}

// replayNote tells the model that a completed answer is a replay.
func replayNote(res *intent.Result) string {
	return fmt.Sprintf("Already done, not repeated: operation %s completed at %s (an earlier call ran it); this call did not run it again. The result above is the recorded one.",
		res.Key, when(res.CompletedAt))
}

// render is the tool result of an answer for s: for a tool of an upstream
// MCP server (effect mcp) a completed operation's result is the upstream's
// own content and structured content, with the replay note after it.
func (s *served) render(res *intent.Result) *mcp.CallToolResult {
	out := render(res)
	if res.Status == intent.StatusFailed && res.Error != nil && s.info.OnFailure == intent.OnFailureRetry && len(out.Content) > 1 {
		out.Content[len(out.Content)-1] = &mcp.TextContent{Text: fmt.Sprintf("Failed (%s): %s. This tool runs a failed operation again: "+
			"calling again with the same arguments runs it again, so retry only once the cause is fixed.", res.Error.Code, res.Error.Message)}
	}
	if s.info.Effect != intent.EffectMCP || res.Status != intent.StatusCompleted {
		return out
	}
	var up mcp.CallToolResult
	if err := json.Unmarshal(res.Result, &up); err != nil {
		return out
	}
	out.Content, out.StructuredContent = up.Content, up.StructuredContent
	if res.Replayed {
		out.Content = append(out.Content, &mcp.TextContent{Text: replayNote(res)})
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
		prints := ""
		if res.RecordFingerprint != "" {
			prints = fmt.Sprintf(" (its fingerprint %s, this call's %s)", res.RecordFingerprint, res.Fingerprint)
		}
		return fmt.Sprintf("Conflict: nothing was done. Operation %s was first called with other arguments%s. Calling again with these arguments is refused the same way: this is not a new operation. If you meant the recorded one, it already happened; if you meant another, it must differ in its key arguments.", res.Key, prints)
	case intent.StatusDenied:
		return fmt.Sprintf("Denied: operation %s was refused by its approver (%s). Nothing was done and it will not run: do not call again.", res.Key, msg)
	case intent.StatusFailed:
		return fmt.Sprintf("Failed (%s): %s. This outcome is recorded for operation %s: calling again with the same arguments returns this failure and does not run it again. Do not retry unless the failure says the arguments were wrong.", code, msg, res.Key)
	case intent.StatusRejected:
		if code == intent.CodeBudgetExceeded {
			return fmt.Sprintf("Rejected (budget_exceeded): %s. Nothing was done and nothing was recorded. Do not call again with other arguments: every distinct call counts; this one may run from %s.", msg, when(res.RetryAt))
		}
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
	return answer(operation{Key: key, Status: intent.StatusPending}, false,
		map[string]any{"status": intent.StatusPending, "operation": key},
		fmt.Sprintf("Still running: operation %s has not finished yet and goes on. Do not call the tool again; check later with %s {\"operation\": %q}.", key, StatusTool, key))
}

// reference is the structured content of an answer that is not a result.
func reference(res *intent.Result) map[string]any {
	m := map[string]any{"status": res.Status, "operation": res.Key}
	if res.Error != nil {
		m["error"] = res.Error
	}
	if !res.RetryAt.IsZero() {
		m["retry_at"] = res.RetryAt.UTC().Format(time.RFC3339)
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
