package mcpgate

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/idemgate/idemgate/pkg/argschema"
	"github.com/idemgate/idemgate/pkg/intent"
)

// served is one catalogue tool as the gate serves it.
type served struct {
	info     intent.ToolInfo
	raw      []byte          // info as JSON: what same compares
	tool     *mcp.Tool       // as listed to clients
	declared map[string]bool // args the schema or the key spec names
}

func newServed(info intent.ToolInfo) (*served, error) {
	s := &served{info: info, raw: marshal(info), declared: map[string]bool{}}
	for _, a := range info.KeyArgs {
		s.declared[a] = true
	}
	input := json.RawMessage(info.Schema)
	if len(input) > 0 {
		// Served only when it resolves; calls are checked against it by
		// the client (client.Prepare).
		if _, err := argschema.Resolve(input); err != nil {
			return nil, fmt.Errorf("schema %w", err)
		}
		var props struct {
			Properties map[string]json.RawMessage `json:"properties"`
		}
		_ = json.Unmarshal(input, &props)
		for p := range props.Properties {
			s.declared[p] = true
		}
	} else {
		input = defaultSchema(info)
	}
	s.tool = &mcp.Tool{
		Name:        info.Name,
		Description: describe(info),
		InputSchema: input,
		Annotations: annotations(info),
	}
	return s, nil
}

// same reports whether s serves the same catalogue entry as o.
func (s *served) same(o *served) bool { return bytes.Equal(s.raw, o.raw) }

// defaultSchema is the input schema of a tool whose tools file gives none:
// an object whose key args and volatile args are typed properties (the key
// args required for an unsafe tool, which is refused without them:
// intent.RequiredKeyArgs) and which takes other arguments too. A key arg's
// type is a scalar's, as the tools file says no more; a client that closes
// the schema (the AI SDK adds additionalProperties: false) can still send
// every argument it names.
func defaultSchema(info intent.ToolInfo) json.RawMessage {
	sch := map[string]any{"type": "object", "additionalProperties": true}
	props := map[string]any{}
	for _, a := range info.KeyArgs {
		props[a] = map[string]any{"anyOf": scalar, "description": "a key argument: it tells operations apart"}
	}
	for _, a := range info.VolatileArgs {
		props[a] = map[string]any{"anyOf": anyJSON, "description": "not part of the operation: it may differ between repeats"}
	}
	if len(props) > 0 {
		sch["properties"] = props
	}
	if required := intent.RequiredKeyArgs(info.Class, info.KeySpec()); len(required) > 0 {
		sch["required"] = required
	}
	return marshal(sch)
}

// scalar is the schema of an argument known only to be a key arg; anyJSON
// of one known only by name. Each is anyOf single types, which every
// client's schema dialect reads (a type array is not portable).
var (
	scalar  = []any{map[string]any{"type": "string"}, map[string]any{"type": "number"}, map[string]any{"type": "boolean"}}
	anyJSON = append(scalar[:len(scalar):len(scalar)], map[string]any{"type": "object", "additionalProperties": true}, map[string]any{"type": "array"})
)

// annotations are the MCP hints of a tool, from its policy.
func annotations(info intent.ToolInfo) *mcp.ToolAnnotations {
	read := info.Class == intent.ClassRead
	a := &mcp.ToolAnnotations{
		ReadOnlyHint: read,
		// Behind the ledger a repeat is answered, not run: idempotent
		// within the retention. An idempotent tool without it is so by
		// nature.
		IdempotentHint: !read,
		OpenWorldHint:  new(openWorld(info.Effect)),
	}
	if !read {
		a.DestructiveHint = new(info.Destructive)
	}
	return a
}

// openWorld reports whether an effect kind reaches beyond the installation.
func openWorld(kind string) bool {
	switch kind {
	case intent.EffectWebhook, intent.EffectSMTP, intent.EffectMCP:
		return true
	}
	return false
}

// describe is a tool's description: the tools file's, and what a repeat
// does, as the model needs to know whether it may retry.
func describe(info intent.ToolInfo) string {
	var b strings.Builder
	if d := strings.TrimSpace(info.Description); d != "" {
		b.WriteString(d)
		b.WriteString("\n\n")
	}
	switch {
	case info.Class == intent.ClassRead:
		b.WriteString("Read-only: it changes nothing and every call runs, so it is safe to call again.")
	case !info.Ledger:
		b.WriteString("Idempotent: a repeat leaves the same state, and every call runs, so it is safe to retry.")
	default:
		fmt.Fprintf(&b, "Safe to retry: idemgate runs each operation at most once. An operation is %s in the same session", operationOf(info))
		if info.WindowSeconds > 0 {
			fmt.Fprintf(&b, " within one window of %s", time.Duration(info.WindowSeconds)*time.Second)
		}
		b.WriteString("; calling it again")
		if info.RetentionSeconds > 0 {
			fmt.Fprintf(&b, " within %s", time.Duration(info.RetentionSeconds)*time.Second)
		}
		b.WriteString(" returns the recorded result without running it again.")
		if len(info.KeyArgs) > 0 {
			fmt.Fprintf(&b, " The same %s with other arguments is refused as a conflict.", strings.Join(info.KeyArgs, ", "))
		}
		if len(info.VolatileArgs) > 0 {
			fmt.Fprintf(&b, " %s may differ between repeats.", strings.Join(info.VolatileArgs, ", "))
		}
	}
	if info.Approval == intent.ApprovalRequired {
		if info.Approver == intent.ApproverUser {
			b.WriteString(" The user confirms each operation before it runs (asked through the client when it can ask; otherwise an operator approves).")
		} else {
			b.WriteString(" An operator approves each operation before it runs.")
		}
		b.WriteString(" Until then the call returns awaiting_approval with an operation reference: check it with " + StatusTool + ", do not call again to hurry it.")
	}
	if info.OnComplete == intent.OnCompleteReject {
		b.WriteString(" Once an operation has completed, calling it again is refused as already_done (with the recorded result), not answered as a success: call it once.")
	}
	if info.OnFailure == intent.OnFailureRetry {
		b.WriteString(" A failed operation runs again when called again with the same arguments.")
	}
	if info.OnAbandoned == intent.AbandonHold {
		b.WriteString(" If it is interrupted mid-way it is held as uncertain for an operator to settle, never run again on its own.")
	}
	if bu := info.Budget; bu != nil {
		who := "per session"
		if bu.Per == intent.BudgetPerTool {
			who = "for all callers together"
		}
		fmt.Fprintf(&b, " At most %d distinct operations run %s in each %s; more are refused (budget_exceeded) until the window ends", bu.Max, who, bu.Window())
		if bu.OverBudget == intent.OverBudgetApprove {
			b.WriteString(" (parked for an operator's approval instead)")
		}
		b.WriteString(": do not vary the arguments to get around it.")
	}
	return b.String()
}

// operationOf says what identifies one operation of a tool.
func operationOf(info intent.ToolInfo) string {
	if len(info.KeyArgs) == 0 {
		if len(info.VolatileArgs) > 0 {
			return "the same arguments (but " + strings.Join(info.VolatileArgs, ", ") + ")"
		}
		return "the same arguments"
	}
	return "the same " + strings.Join(info.KeyArgs, ", ")
}
