package mcpgate

import (
	"bytes"
	"encoding/json"
	"fmt"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/idemgate/idemgate/internal/hint"
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

// door is how the MCP server's answers let the model follow an operation
// up: with the status tool.
var statusDoor = hint.Door{Check: func(key string) string { return fmt.Sprintf("%s {\"operation\": %q}", StatusTool, key) }}

// render turns an answer into the tool result the model reads: the result
// for a completed operation, what ran for one already done, and otherwise
// the operation's status and reference; each with the hint (internal/hint)
// that says what happened and what to do, in its structured content and as
// the text item after its JSON (see answer). Only a failure is a tool error
// (hint.Error).
func render(res *intent.Result, d hint.Door) *mcp.CallToolResult {
	op := operation{Key: res.Key, Tool: res.Tool, Status: res.Status, Replayed: res.Replayed, Attempts: res.Attempts, Fingerprint: res.Fingerprint, Receipt: res.Receipt}
	if !res.CompletedAt.IsZero() {
		at := res.CompletedAt.UTC()
		op.CompletedAt = &at
	}
	h := hint.For(res, d)
	switch res.Status {
	case intent.StatusCompleted:
		return answer(op, h, structured(res.Result))
	case intent.StatusAlreadyDone:
		ran := reference(res)
		ran["result"], ran["completed_at"], ran["attempts"] = resultJSON(res.Result), op.CompletedAt, res.Attempts
		return answer(op, h, ran)
	}
	return answer(op, h, reference(res))
}

// answer is a tool result with structured content v, its hint added, whose
// first text item is that content's JSON, byte for byte, on every call: MCP
// asks a tool that returns structured content to return its JSON as text
// too, and a client that parses content[0].text must get the same on a
// replay as on a first run. The hint's text follows in an item of its own.
func answer(op operation, h hint.Hint, v any) *mcp.CallToolResult {
	data := withHint(v, h)
	return &mcp.CallToolResult{
		Meta:              mcp.Meta{MetaOperation: op},
		IsError:           hint.Error(h.Code),
		StructuredContent: json.RawMessage(data),
		Content:           []mcp.Content{&mcp.TextContent{Text: string(data)}, &mcp.TextContent{Text: h.Text}},
	}
}

// withHint is the JSON of object v with the member "hint": h. A v that is
// not an object, or has a "hint" of its own, becomes {"result": v, "hint": h}.
func withHint(v any, h hint.Hint) json.RawMessage {
	data, err := json.Marshal(v)
	if err != nil { // a recorded result that is not JSON
		data = marshal(map[string]string{"error": "the recorded result is not JSON: " + err.Error()})
	}
	var members map[string]json.RawMessage
	if json.Unmarshal(data, &members) != nil || members == nil || members["hint"] != nil {
		members = map[string]json.RawMessage{"result": data}
	}
	members["hint"] = marshal(h)
	return marshal(members)
}

// render is the tool result of an answer for s: a failed operation of a
// tool with on_failure: retry says it runs again; for a tool of an upstream
// MCP server (effect mcp) a completed operation's result is the upstream's
// own content and structured content, the hint added after them.
func (s *served) render(res *intent.Result) *mcp.CallToolResult {
	d := statusDoor
	d.RetryFailed = s.info.OnFailure == intent.OnFailureRetry
	out := render(res, d)
	if s.info.Effect != intent.EffectMCP || res.Status != intent.StatusCompleted {
		return out
	}
	var up mcp.CallToolResult
	if err := json.Unmarshal(res.Result, &up); err != nil {
		return out
	}
	h := hint.For(res, d)
	out.Content = append(up.Content, &mcp.TextContent{Text: h.Text})
	var sc any = map[string]any{}
	if up.StructuredContent != nil {
		sc = up.StructuredContent
	}
	out.StructuredContent = withHint(sc, h)
	return out
}

// toolError is the answer to a call refused before anything was done,
// whose text tells the model what to fix: a tool error.
func toolError(format string, args ...any) *mcp.CallToolResult {
	return note(hint.Refused(fmt.Sprintf(format, args...)))
}

// note is a result that is only a hint: {"status": code, "hint": h} and its
// text.
func note(h hint.Hint) *mcp.CallToolResult {
	data := withHint(map[string]string{"status": h.Code}, h)
	return &mcp.CallToolResult{
		IsError:           hint.Error(h.Code),
		StructuredContent: json.RawMessage(data),
		Content:           []mcp.Content{&mcp.TextContent{Text: string(data)}, &mcp.TextContent{Text: h.Text}},
	}
}

// stillRunning answers a call whose wait ran out.
func stillRunning(key string) *mcp.CallToolResult {
	return answer(operation{Key: key, Status: intent.StatusPending}, hint.Still(key, statusDoor),
		map[string]any{"status": intent.StatusPending, "operation": key})
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
