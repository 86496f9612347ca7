package effects

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/idemgate/idemgate/pkg/intent"
)

// Lease bounds.
const (
	// DefaultLease is how long a holder owns a key before another worker may
	// take it over, when a tool does not say.
	DefaultLease = 30 * time.Second
	// MinLease is the shortest lease a tool may declare.
	MinLease = time.Second
)

// Tool is one configured tool: how its keys are derived, how long a holder
// owns a key, and the effect that fires.
type Tool struct {
	// Name is the tool's name, [a-z0-9_-]{1,64}; intents for it arrive on
	// the subject ending in it.
	Name string
	// Kind is the effect's kind, e.g. "webhook" or "noop".
	Kind string
	// KeySpec is how keys and fingerprints derive from the tool's intents.
	KeySpec intent.KeySpec
	// Lease is how long a holder owns a key before another may take it over.
	// Default DefaultLease; at least MinLease.
	Lease time.Duration
	// MaxDuration is an upper bound on one Fire of Effect, retries and their
	// waits included, when the effect declares one (see Bounded); 0 when
	// unknown.
	MaxDuration time.Duration
	// Policy is how the workers treat the tool's intents: class, ledger,
	// approval, abandoned leases. Default DefaultPolicy().
	Policy Policy
	// Effect is what fires.
	Effect Effect
	// Description says what the tool does, for agents (the MCP tool
	// description). Default "".
	Description string
	// Schema is the JSON Schema of the tool's args (an object schema), or
	// nil when the tools file gives none.
	Schema json.RawMessage
	// Destructive, when set, says whether the tool may destroy or overwrite
	// (MCP's destructiveHint). Default nil: see IsDestructive.
	Destructive *bool
	// AuditArgs puts the intent's args themselves in the audit trail's
	// claimed events (tools file: audit_args: true), not only their digest.
	// Default false: args may hold secrets.
	AuditArgs bool
	// Prober asks the downstream whether an operation whose holder vanished
	// mid-effect already happened, before it is fired again or held (tools
	// file: probe). Default nil: no probe, on_abandoned decides alone.
	Prober Prober
}

// Bounded is implemented by effects that know how long one Fire may take at
// most; the registry copies it into Tool.MaxDuration.
type Bounded interface {
	MaxDuration() time.Duration
}

// Registry is the set of configured tools. It is read-only once built and
// safe for concurrent use.
type Registry struct {
	tools    map[string]*Tool
	names    []string
	sources  []Source
	warnings []Warning
	release  func()
}

// A Source serves tools that come and go while a registry is in use: an
// upstream MCP server's, which follow its list (a tools file's
// mcp_upstreams). Its methods are called concurrently.
type Source interface {
	// Lookup returns the tool named name, if the source serves it now.
	Lookup(name string) (*Tool, bool)
	// Names returns the names of the tools it serves now.
	Names() []string
}

// RegistryConfig is a registry as a loader (package toolsfile) builds it.
type RegistryConfig struct {
	// Tools are the tools, as NewRegistry takes them.
	Tools []*Tool
	// Sources serve tools besides Tools, looked up after them: a name
	// both have is the tool of Tools.
	Sources []Source
	// Warnings are what the loader found that loads but probably does not
	// do what its author meant; Registry.Warnings returns them.
	Warnings []Warning
	// Release, when set, is called by Registry.Close after the effects are
	// closed: it releases what the loader holds for them (the connections
	// their effects share, the sources).
	Release func()
}

// NewRegistry builds a registry from tools built in code (tests, embedding).
// Each tool needs a valid, unique Name and an Effect; a zero Lease becomes
// DefaultLease and a zero Policy DefaultPolicy(). The tools are used as given,
// not copied.
func NewRegistry(tools ...*Tool) (*Registry, error) {
	return NewRegistryFrom(RegistryConfig{Tools: tools})
}

// NewRegistryFrom builds a registry from what a loader built (see
// NewRegistry for the rules of its tools).
func NewRegistryFrom(cfg RegistryConfig) (*Registry, error) {
	r := &Registry{tools: make(map[string]*Tool, len(cfg.Tools))}
	var errs []error
	for _, t := range cfg.Tools {
		switch {
		case t == nil:
			errs = append(errs, errors.New("effects: nil tool"))
			continue
		case !intent.ValidTool(t.Name):
			errs = append(errs, fmt.Errorf("effects: tool name %q: use 1-64 of a-z, 0-9, '_' and '-'", t.Name))
		case r.tools[t.Name] != nil:
			errs = append(errs, fmt.Errorf("effects: tool %q defined twice", t.Name))
		case t.Effect == nil:
			errs = append(errs, fmt.Errorf("effects: tool %q has no effect", t.Name))
		case t.Lease != 0 && t.Lease < MinLease:
			errs = append(errs, fmt.Errorf("effects: tool %q: lease %s is under %s", t.Name, t.Lease, MinLease))
		}
		if t.Lease == 0 {
			t.Lease = DefaultLease
		}
		if t.Policy == (Policy{}) {
			t.Policy = DefaultPolicy()
		}
		if b, ok := t.Effect.(Bounded); ok && t.MaxDuration == 0 {
			t.MaxDuration = b.MaxDuration()
		}
		if r.tools[t.Name] == nil {
			r.tools[t.Name] = t
			r.names = append(r.names, t.Name)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	sort.Strings(r.names)
	r.sources = cfg.Sources
	r.warnings = append([]Warning(nil), cfg.Warnings...)
	r.release = cfg.Release
	return r, nil
}

// Lookup returns the tool named name: one of the registry's tools, or one
// its sources serve now (an upstream MCP server's current list).
func (r *Registry) Lookup(name string) (*Tool, bool) {
	if t, ok := r.tools[name]; ok {
		return t, true
	}
	for _, src := range r.sources {
		if t, ok := src.Lookup(name); ok {
			return t, true
		}
	}
	return nil, false
}

// Names returns the tool names, sorted: the registry's tools, and those
// its sources serve now.
func (r *Registry) Names() []string {
	names := append([]string(nil), r.names...)
	if len(r.sources) == 0 {
		return names
	}
	for _, src := range r.sources {
		names = append(names, src.Names()...)
	}
	sort.Strings(names)
	return slices.Compact(names)
}

// Close releases what the effects hold (idle HTTP connections, for one): it
// closes every effect that is an io.Closer, then releases what its loader
// holds (RegistryConfig.Release). The registry's effects must not fire
// afterwards.
func (r *Registry) Close() error {
	var errs []error
	for _, name := range r.names {
		if c, ok := r.tools[name].Effect.(io.Closer); ok {
			if err := c.Close(); err != nil {
				errs = append(errs, fmt.Errorf("close %s: %w", name, err))
			}
		}
		if c, ok := r.tools[name].Prober.(io.Closer); ok {
			_ = c.Close() // idle connections only
		}
	}
	if r.release != nil {
		r.release()
	}
	return errors.Join(errs...)
}

// Warnings returns what the registry's loader found that loads but probably
// does not do what its author meant, in line order (none for a registry
// built with NewRegistry); package toolsfile lists the kinds.
func (r *Registry) Warnings() []Warning {
	return append([]Warning(nil), r.warnings...)
}

// Warning is a setting that loads but probably does not do what its author
// meant: a key that can hold a timestamp, a webhook to an address that will
// be refused at run time. Unlike a problem it does not stop the file from
// loading; worker --check-config prints them, and a worker logs them at
// start.
type Warning struct {
	File    string // the file name, as the loader was given it
	Line    int    // 1-based line of the field; 0 when unknown
	Path    string // the field, dotted from the tool name: "create_ticket.key_args[1]"
	Problem string // what looks wrong
	Hint    string // what to do about it; may be empty
}

// String formats the warning as "file:line: path: problem (hint)".
func (w Warning) String() string {
	var b strings.Builder
	b.WriteString(w.File)
	if w.Line > 0 {
		b.WriteString(":" + strconv.Itoa(w.Line))
	}
	b.WriteString(": ")
	if w.Path != "" {
		b.WriteString(w.Path + ": ")
	}
	b.WriteString(w.Problem)
	if w.Hint != "" {
		b.WriteString(" (" + w.Hint + ")")
	}
	return b.String()
}

// IsDestructive reports whether the tool may destroy or overwrite: the tools
// file's destructive field, by default true for every tool but reads.
func (t *Tool) IsDestructive() bool {
	if t.Destructive != nil {
		return *t.Destructive
	}
	return t.Policy.Class != intent.ClassRead
}
