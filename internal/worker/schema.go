package worker

import (
	"github.com/idemgate/idemgate/pkg/argschema"
	"github.com/idemgate/idemgate/pkg/effects"
	"github.com/idemgate/idemgate/pkg/intent"
)

// schemas checks args against the schemas of the tools that have one, each
// resolved on first use (a tool of an MCP upstream may appear after the
// worker started).
type schemas struct{ argschema.Schemas }

// check validates the args of d, as its decoding parsed them, against t's
// schema, when t has one: pkg/client checks before it publishes (and so do
// the front doors, which submit through it), and the worker holds every
// other publisher to the same rule (argschema.Schemas.Check).
func (s *schemas) check(t *effects.Tool, d intent.Decoded) error {
	return s.Check(t.Schema, d)
}
