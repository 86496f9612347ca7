package toolsfile

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"

	"github.com/idemgate/idemgate/pkg/effects"
	"github.com/idemgate/idemgate/pkg/intent"
)

// requireIdentity reports an unsafe tool whose key a model can choose: one
// keyed by all its args (no key_args) whose schema does not refuse an
// argument it does not declare. A model that adds an argument of its own to
// such a tool (x-request-id, uuid, attempt: no list of names can know them
// all) makes every retry another key, and so another firing. Every tool of
// the file is reachable by models: the workers serve every tool on NATS,
// and the HTTP and MCP front doors serve the workers' whole catalogue.
//
// Three ways out, each named in the hint: key_args (the arguments that name
// the operation; an invented one then makes a conflict, never a firing), a
// closed schema (additionalProperties: false: an invented argument is
// refused invalid_intent), or key_args: all, which says that every argument
// is part of the operation's identity.
func requireIdentity(s *section, t *effects.Tool, entry string) {
	if t.Policy.Class != intent.ClassUnsafe || s.Has("key_args") {
		return // key_args is a list, all, or a problem reported already
	}
	if f, ok := s.fields["class"]; ok && resolve(f.val).Value != string(intent.ClassUnsafe) {
		return // an unknown class, reported already
	}
	if s.Has("schema") && t.Schema == nil {
		return // the schema has a problem of its own, reported already
	}
	if closedSchema(t.Schema) {
		return
	}
	problem := "an unsafe tool keyed by all its args, with no schema"
	if t.Schema != nil {
		problem = "an unsafe tool keyed by all its args, whose schema allows args it does not declare"
	}
	problem += ": an arg a model invents (a request id, a uuid) makes each retry another operation, which fires again"
	where := ""
	if entry != "" {
		where = "in " + entry + ", "
	}
	hint := fmt.Sprintf("%sname the args that identify the operation: key_args: [%s]; or close the schema (additionalProperties: false) so an invented arg is refused; or write key_args: all if every arg names the operation; or class: read or idempotent if a repeat is harmless",
		where, strings.Join(suggestKeyArgs(t.Schema), ", "))
	s.c.add(s.line, s.path, problem, hint)
}

// closedSchema reports whether schema (a tool's JSON Schema, nil when none)
// refuses a top-level property it does not declare: additionalProperties
// is false (or, without it, unevaluatedProperties is false), and no
// patternProperties admits names of their own.
func closedSchema(schema json.RawMessage) bool {
	if schema == nil {
		return false
	}
	var sch struct {
		AdditionalProperties  json.RawMessage            `json:"additionalProperties"`
		UnevaluatedProperties json.RawMessage            `json:"unevaluatedProperties"`
		PatternProperties     map[string]json.RawMessage `json:"patternProperties"`
	}
	if json.Unmarshal(schema, &sch) != nil || len(sch.PatternProperties) > 0 {
		return false
	}
	if sch.AdditionalProperties != nil {
		return string(sch.AdditionalProperties) == "false"
	}
	return string(sch.UnevaluatedProperties) == "false"
}

// suggestKeyArgs names the key args a hint suggests: the schema's required
// properties, else its properties (at most four), else a placeholder.
func suggestKeyArgs(schema json.RawMessage) []string {
	var sch struct {
		Required   []string                   `json:"required"`
		Properties map[string]json.RawMessage `json:"properties"`
	}
	_ = json.Unmarshal(schema, &sch)
	if len(sch.Required) > 0 {
		return sch.Required
	}
	var names []string
	for name := range sch.Properties {
		names = append(names, name)
	}
	if len(names) == 0 {
		return []string{"order_id"}
	}
	sort.Strings(names)
	return names[:min(len(names), 4)]
}
