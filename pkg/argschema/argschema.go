// Package argschema reads the JSON Schema a tools file gives a tool's args
// and holds calls to it. Every place that checks args against a tool's
// schema — the client before it publishes (so the HTTP and MCP front doors),
// the workers for every other publisher — checks them with Schemas.Check,
// and the MCP front door serves the schema it resolves here: all accept the
// same schemas and refuse the same args.
package argschema

import (
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/google/jsonschema-go/jsonschema"

	"github.com/idemgate/idemgate/pkg/intent"
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

// Schemas checks args against tools' schemas, each schema resolved once, on
// its first use (a tool of an MCP upstream may appear later, and a
// catalogue may change). The zero value is ready to use and safe for
// concurrent use. It keeps up to maxSchemas schema texts, and forgets them
// all when a new one would pass that (an upstream whose schemas keep
// changing costs resolutions, never unbounded memory).
type Schemas struct {
	m sync.Map     // schema text → resolved
	n atomic.Int64 // entries in m, about
}

// maxSchemas bounds the schema texts a Schemas keeps: far more than the
// tools of any catalogue.
const maxSchemas = 4096

// resolved is a schema as Resolve left it.
type resolved struct {
	res *jsonschema.Resolved
	err error
}

// Check validates d's args, as intent.Build or the decoding of the envelope
// parsed them (intent.Decoded.PlainArgs: not parsed again), against schema,
// the JSON Schema of d's tool; a tool without one (empty schema) takes any
// args. The error wraps intent.ErrInvalid and names the tool and the
// violation, or a schema that does not resolve.
func (s *Schemas) Check(schema json.RawMessage, d intent.Decoded) error {
	if len(schema) == 0 {
		return nil
	}
	v, ok := s.m.Load(string(schema))
	if !ok {
		var r resolved
		r.res, r.err = Resolve(schema)
		if s.n.Add(1) > maxSchemas {
			s.m.Clear()
			s.n.Store(1)
		}
		v, _ = s.m.LoadOrStore(string(schema), &r)
	}
	r := v.(*resolved)
	if r.err != nil {
		return fmt.Errorf("%w: tool %s: its schema %w", intent.ErrInvalid, d.Tool, r.err)
	}
	args, err := d.PlainArgs()
	if err != nil {
		return err
	}
	if err := r.res.Validate(args); err != nil {
		return fmt.Errorf("%w: args do not match tool %s's schema: %w", intent.ErrInvalid, d.Tool, err)
	}
	return nil
}
