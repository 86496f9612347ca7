package intent

import (
	"encoding/json"
	"time"
)

// ToolInfo describes one configured tool, as the workers' tool catalogue
// (a request to Names.ToolsSubject) reports it to clients in any language.
type ToolInfo struct {
	Name string `json:"name"`
	// Effect is the effect's kind: one of the Effect constants.
	Effect string `json:"effect"`
	// Class is read, idempotent or unsafe; SafeToRetry is true for the first
	// two: a caller may repeat such a call without a key.
	Class       Class `json:"class"`
	SafeToRetry bool  `json:"safe_to_retry"`
	// Ledger reports whether the tool's intents go through the ledger.
	Ledger bool `json:"ledger"`
	// Approval is "required" when each operation must be approved; absent
	// otherwise.
	Approval Approval `json:"approval,omitempty"`
	// OnAbandoned is retry or hold: what happens when a holder vanishes
	// (absent for a tool without the ledger).
	OnAbandoned   Abandon  `json:"on_abandoned,omitempty"`
	KeyArgs       []string `json:"key_args,omitempty"`
	WindowSeconds int64    `json:"window_seconds,omitempty"`
	VolatileArgs  []string `json:"volatile_args,omitempty"`
	LeaseSeconds  float64  `json:"lease_seconds"`
	// Description says what the tool does, for agents.
	Description string `json:"description,omitempty"`
	// Schema is the JSON Schema of the tool's args, when the tools file
	// gives one.
	Schema json.RawMessage `json:"schema,omitempty"`
	// Destructive reports whether the tool may destroy or overwrite (false
	// for reads).
	Destructive bool `json:"destructive"`
	// Approver is who approves a tool with Approval "required": "operator"
	// or "user" (the person at the agent's client).
	Approver Approver `json:"approver,omitempty"`
	// RetentionSeconds is how long the ledger keeps a final record, and so
	// how long a repeat is answered from it (0 when unknown).
	RetentionSeconds int64 `json:"retention_seconds,omitempty"`
	// Upstream names the MCP server a tool of effect mcp calls, without
	// what may be a secret (its URL without user, password and query, or its
	// command's program and a count of its arguments), and UpstreamTool is
	// the tool's name there.
	Upstream     string `json:"upstream,omitempty"`
	UpstreamTool string `json:"upstream_tool,omitempty"`
	// Budget is the tool's effect budget, when it declares one: how many
	// distinct operations it runs per session (or in all) per window.
	Budget *Budget `json:"budget,omitempty"`
	// OnFailure is replay or retry: what a later call of a failed operation
	// does; OnComplete is replay or reject: what a later call of a completed
	// one does (both absent for a tool without the ledger).
	OnFailure  OnFailure  `json:"on_failure,omitempty"`
	OnComplete OnComplete `json:"on_complete,omitempty"`
	// Probe reports whether the tool has a reconciliation probe: a way to
	// ask its downstream whether an operation happened (POST
	// /v1/operations/{key}/probe).
	Probe bool `json:"probe,omitempty"`
}

// Effect kinds built into the workers, as a tools file's effect field and
// ToolInfo.Effect name them.
const (
	EffectWebhook = "webhook" // an HTTP request
	EffectSMTP    = "smtp"    // an email through a relay
	EffectNATS    = "nats"    // a request to a NATS service
	EffectMCP     = "mcp"     // a tool of an upstream MCP server
	EffectNoop    = "noop"    // nothing outside the process
)

// KeySpec is the derivation the tool's workers use.
func (t ToolInfo) KeySpec() KeySpec {
	return KeySpec{KeyArgs: t.KeyArgs, Window: time.Duration(t.WindowSeconds) * time.Second, VolatileArgs: t.VolatileArgs}
}

// Catalog is the tool catalogue's answer.
type Catalog struct {
	Tools []ToolInfo `json:"tools"`
}
