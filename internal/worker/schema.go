package worker

import (
	"encoding/json"
	"fmt"
	"sync"

	"github.com/google/jsonschema-go/jsonschema"

	"github.com/idemgate/idemgate/pkg/argschema"
	"github.com/idemgate/idemgate/pkg/effects"
)

// schemas holds the resolved JSON Schema of each tool that has one, built on
// first use (a tool of an MCP upstream may appear after the worker started).
type schemas struct {
	m sync.Map // *effects.Tool → *jsonschema.Resolved
}

// check validates args against t's schema, when t has one: the front doors
// validate before they publish, and the worker holds every other publisher
// to the same rule.
func (s *schemas) check(t *effects.Tool, args json.RawMessage) error {
	if len(t.Schema) == 0 {
		return nil
	}
	v, ok := s.m.Load(t)
	if !ok {
		r, err := argschema.Resolve(t.Schema)
		if err != nil {
			return fmt.Errorf("tool %s: its schema: %w", t.Name, err)
		}
		v, _ = s.m.LoadOrStore(t, r)
	}
	var plain map[string]any // the validator wants float64 numbers
	if err := json.Unmarshal(args, &plain); err != nil {
		return fmt.Errorf("args: %w", err)
	}
	if err := v.(*jsonschema.Resolved).Validate(plain); err != nil {
		return fmt.Errorf("args do not match tool %s's schema: %w", t.Name, err)
	}
	return nil
}
