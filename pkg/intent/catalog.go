package intent

import "time"

// ToolInfo describes one configured tool, as the workers' tool catalogue
// (a request to Names.ToolsSubject) reports it to clients in any language.
type ToolInfo struct {
	Name   string `json:"name"`
	Effect string `json:"effect"`
	// Class is read, idempotent or unsafe; SafeToRetry is true for the first
	// two: a caller may repeat such a call without a key.
	Class       string `json:"class"`
	SafeToRetry bool   `json:"safe_to_retry"`
	// Ledger reports whether the tool's intents go through the ledger.
	Ledger bool `json:"ledger"`
	// Approval is "required" when an operator must approve each operation.
	Approval string `json:"approval,omitempty"`
	// OnAbandoned is retry or hold: what happens when a holder vanishes.
	OnAbandoned   string   `json:"on_abandoned,omitempty"`
	KeyArgs       []string `json:"key_args,omitempty"`
	WindowSeconds int64    `json:"window_seconds,omitempty"`
	VolatileArgs  []string `json:"volatile_args,omitempty"`
	LeaseSeconds  float64  `json:"lease_seconds"`
}

// KeySpec is the derivation the tool's workers use.
func (t ToolInfo) KeySpec() KeySpec {
	return KeySpec{KeyArgs: t.KeyArgs, Window: time.Duration(t.WindowSeconds) * time.Second, VolatileArgs: t.VolatileArgs}
}

// Catalog is the tool catalogue's answer.
type Catalog struct {
	Tools []ToolInfo `json:"tools"`
}
