package toolsfile

import (
	"encoding/json"
	"fmt"

	"github.com/idemgate/idemgate/pkg/argschema"
	"github.com/idemgate/idemgate/pkg/effects"
	"github.com/idemgate/idemgate/pkg/intent"
)

// The fields that describe a tool to agents (docs/tools.md, "Describing a
// tool"): what it does, the JSON Schema of its args, whether it destroys,
// and who approves it. The MCP front door serves them as the tool's
// description, input schema and annotations.

// parseDescription reads description, schema, destructive and approver.
func parseDescription(s *section, t *effects.Tool) {
	t.Description = s.String("description", "")
	if node, ok := s.Value("schema"); ok {
		t.Schema = parseSchema(s, node.Line, func() (any, error) {
			var v any
			err := node.Decode(&v)
			return v, err
		})
		if t.Schema != nil {
			checkSchemaKeyArgs(s, t)
		}
	}
	if s.Has("destructive") {
		d := s.Bool("destructive", true)
		if t.Policy.Class == intent.ClassRead {
			s.Invalid("destructive", "a read never changes anything", "remove destructive, or declare class: idempotent or unsafe")
		}
		t.Destructive = &d
	}
	switch a := intent.Approver(s.String("approver", string(intent.ApproverOperator))); a {
	case intent.ApproverOperator:
	case intent.ApproverUser:
		t.Policy.UserApproves = true
	default:
		s.Invalid("approver", fmt.Sprintf("unknown approver %q", a), "use operator or user")
	}
	if s.Has("approver") && !t.Policy.Approval {
		s.Invalid("approver", "is set but approval is not required", "add approval: required or remove approver")
	}
}

// parseSchema turns a schema written in YAML into JSON and checks it is a
// JSON Schema (draft 2020-12 or draft-07) of an object that resolves: no
// reference it cannot follow, no pattern Go cannot compile. It returns nil
// after reporting a problem.
func parseSchema(s *section, line int, decode func() (any, error)) json.RawMessage {
	v, err := decode()
	if err != nil {
		s.Invalid("schema", "is not a plain value: "+err.Error(), "write the JSON Schema as YAML, e.g. schema: {type: object, properties: {to: {type: string}}}")
		return nil
	}
	data, err := json.Marshal(v)
	if err != nil {
		s.Invalid("schema", "cannot be written as JSON", "use string keys and finite numbers")
		return nil
	}
	if _, err := argschema.Resolve(data); err != nil {
		s.Invalid("schema", err.Error(), "write a JSON Schema of an object, e.g. schema: {type: object, properties: {to: {type: string}}, required: [to]}")
		return nil
	}
	return data
}

// checkSchemaKeyArgs reports key args and volatile args a closed schema
// (additionalProperties: false) does not declare: no valid call could give
// them.
func checkSchemaKeyArgs(s *section, t *effects.Tool) {
	var sch struct {
		Properties           map[string]json.RawMessage `json:"properties"`
		AdditionalProperties json.RawMessage            `json:"additionalProperties"`
	}
	if json.Unmarshal(t.Schema, &sch) != nil || string(sch.AdditionalProperties) != "false" {
		return
	}
	for _, list := range [][]string{t.KeySpec.KeyArgs, t.KeySpec.VolatileArgs} {
		for _, a := range list {
			if _, ok := sch.Properties[a]; !ok {
				s.Invalid("schema", fmt.Sprintf("does not declare %q, which the key spec names, and allows no other property", a), "add "+a+" to the schema's properties")
			}
		}
	}
}
