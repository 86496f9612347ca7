// Package argschema reads the JSON Schema a tools file gives a tool's args.
// The workers validate args against it, and the MCP front door serves it as
// the tool's input schema; both resolve it here, so they accept the same
// schemas.
package argschema

import (
	"encoding/json"
	"fmt"

	"github.com/google/jsonschema-go/jsonschema"
)

// Resolve reads data as a JSON Schema for a tool's args and resolves it for
// validation. The schema must describe an object ("type": "object"), as MCP
// requires of a tool's input schema, and may only refer inside itself.
func Resolve(data json.RawMessage) (*jsonschema.Resolved, error) {
	var sch jsonschema.Schema
	if err := json.Unmarshal(data, &sch); err != nil {
		return nil, fmt.Errorf("is not a JSON Schema: %v", err)
	}
	if sch.Type != "object" {
		return nil, fmt.Errorf("has type %q, want \"object\" (a tool's args are an object)", sch.Type)
	}
	res, err := sch.Resolve(&jsonschema.ResolveOptions{ValidateDefaults: true})
	if err != nil {
		return nil, fmt.Errorf("does not resolve: %v", err)
	}
	return res, nil
}
