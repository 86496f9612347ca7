package toolsfile

import (
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"go.yaml.in/yaml/v3"

	"github.com/idemgate/idemgate/pkg/effects"
	"github.com/idemgate/idemgate/pkg/effects/internal/text"
	"github.com/idemgate/idemgate/pkg/intent"
)

var kindPattern = regexp.MustCompile(`^[a-z][a-z0-9_]{0,31}$`)

// toolFields are the fields every tool has; no effect kind may take one of
// these names, since a kind's settings live under a field named after it.
var toolFields = []string{"effect", "key_args", "window", "volatile_args", "lease", "class", "ledger", "approval", "approval_ttl", "on_abandoned", "max_in_flight",
	"on_failure", "on_complete",
	"description", "schema", "destructive", "approver", "retention", "budget", "over_budget", "probe"}

// Option adjusts Parse and LoadFile.
type Option func(*options)

type options struct {
	file     string
	nc       *nats.Conn // WithNATSConn
	withNATS bool
	kinds    map[string]kindReader // withKind
	allow    []netip.Prefix        // WithAllowPrivate
	errs     []error
}

// WithNATSConn makes the nats effect (intent.EffectNATS) available: its requests go
// out on nc, which the caller owns (the registry never closes it). Without
// it a tools file naming effect nats reports unknown effect "nats". A
// connection that is never opened (new(nats.Conn)) is enough to validate a
// file; such a registry's nats effects must not fire. A nil nc makes
// every nats tool of the file a problem.
func WithNATSConn(nc *nats.Conn) Option {
	return func(o *options) { o.nc, o.withNATS = nc, true }
}

// WithAllowPrivate lets every effect that takes a URL — each webhook, and
// each mcp upstream given by url — reach the addresses in prefixes besides
// public ones, on top of what its own allow_private lists (see netguard.Guard for
// what is refused by default). A worker passes its --webhook-allow list
// here. Given more than once, the lists add up.
func WithAllowPrivate(prefixes ...netip.Prefix) Option {
	return func(o *options) {
		for _, p := range prefixes {
			if !p.IsValid() {
				o.errs = append(o.errs, fmt.Errorf("toolsfile: WithAllowPrivate: invalid prefix %v", p))
				continue
			}
			o.allow = append(o.allow, p.Masked())
		}
	}
}

// WithFilename names the file in error messages. Default "tools.yaml";
// LoadFile uses the path it reads.
func WithFilename(name string) Option {
	return func(o *options) { o.file = name }
}

// LoadFile reads and parses the tools file at path (see Parse).
func LoadFile(path string, opts ...Option) (*effects.Registry, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("toolsfile: read tools file: %w", err)
	}
	return Parse(data, append([]Option{WithFilename(path)}, opts...)...)
}

// MaxTools is the most tools one tools file may declare.
const MaxTools = 1000

// Parse builds a registry from a tools file (the format is in docs/tools.md).
// It reports every problem it finds, not just the first: the error joins one
// *ConfigError per problem (each matches ErrConfig), in line order, each with
// the line, the field and a hint (see the package doc). The registry's
// Warnings are the file's.
func Parse(data []byte, opts ...Option) (*effects.Registry, error) {
	o := &options{file: "tools.yaml", kinds: map[string]kindReader{}}
	for _, opt := range opts {
		opt(o)
	}
	kinds := builtinKinds(o.nc, o.withNATS)
	for k, read := range o.kinds {
		kinds[k] = read
	}
	o.kinds = kinds
	if err := errors.Join(o.errs...); err != nil {
		return nil, err
	}
	c := &collector{file: o.file, allow: o.allow}
	root, ok := decodeDocument(c, data)
	if !ok {
		return nil, c.err()
	}
	ups := parseUpstreams(c, o, root)
	c.upstreams = upstreamConns(ups)
	var tools []*effects.Tool
	entries := toolsEntries(c, root, len(ups) > 0)
	if len(entries) > MaxTools {
		c.add(entries[MaxTools].key.Line, "tools", fmt.Sprintf("%d tools, more than the limit of %d", len(entries), MaxTools), "split the tools over several installations (--prefix)")
		return nil, c.err()
	}
	for _, name := range entries {
		if t := parseTool(c, o, name.key, name.val, ""); t != nil {
			tools = append(tools, t)
		}
	}
	expandUpstreams(c, ups, tools)
	root.unknown(nil)
	release := func() {
		for _, u := range ups {
			_ = u.close() // ending a session with a server that is gone is no failure
		}
		for _, conn := range c.owned {
			_ = conn.Close()
		}
	}
	if err := c.err(); err != nil {
		closeAll(tools)
		release()
		return nil, err
	}
	sources := make([]effects.Source, len(ups))
	for i, u := range ups {
		sources[i] = u
	}
	r, err := effects.NewRegistryFrom(effects.RegistryConfig{Tools: tools, Sources: sources, Warnings: c.warnings(), Release: release})
	if err != nil {
		release()
		return nil, err
	}
	return r, nil
}

// decodeDocument parses data as a single YAML document whose top is a mapping.
func decodeDocument(c *collector, data []byte) (*section, bool) {
	dec := yaml.NewDecoder(strings.NewReader(string(data)))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			c.add(1, "", "the file is empty", "start with tools: and one entry per tool")
			return nil, false
		}
		line, msg := yamlErrorLine(err)
		c.add(line, "", msg, "check the indentation and quote values that hold ':' or '#'")
		return nil, false
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		c.add(extra.Line, "", "more than one YAML document", "remove the '---' separator: one file holds one tools mapping")
		return nil, false
	}
	if len(doc.Content) == 0 || isNull(resolve(doc.Content[0])) {
		c.add(1, "", "the file is empty", "start with tools: and one entry per tool")
		return nil, false
	}
	root := newSection(c, "", 1, doc.Content[0])
	return root, root.present && len(c.errs) == 0
}

var yamlLine = regexp.MustCompile(`^yaml: (?:line (\d+): )?(.*)$`)

// yamlErrorLine splits a yaml.v3 syntax error into its line and message.
func yamlErrorLine(err error) (int, string) {
	m := yamlLine.FindStringSubmatch(err.Error())
	if m == nil {
		return 0, err.Error()
	}
	line := 0
	fmt.Sscan(m[1], &line)
	return line, m[2]
}

// toolsEntries returns the entries of the top-level "tools" mapping.
func toolsEntries(c *collector, root *section, upstreams bool) []field {
	raw, ok := root.take("tools")
	if !ok && upstreams {
		return nil
	}
	if !ok {
		c.add(1, "tools", "is missing", "start the file with tools: and one entry per tool")
		return nil
	}
	node := resolve(raw)
	if node.Kind != yaml.MappingNode || len(node.Content) == 0 {
		c.add(node.Line, "tools", fmt.Sprintf("is %s, want a mapping of tool names to tools", describe(node)), "write e.g. tools: then, indented, send_email: {effect: webhook, ...}")
		return nil
	}
	var out []field
	seen := map[string]int{}
	for i := 0; i+1 < len(node.Content); i += 2 {
		k := resolve(node.Content[i])
		if first, dup := seen[k.Value]; dup {
			c.add(k.Line, k.Value, fmt.Sprintf("tool defined twice (first at line %d)", first), "rename or remove one")
			continue
		}
		seen[k.Value] = k.Line
		out = append(out, field{key: k, val: node.Content[i+1]})
	}
	return out
}

// parseTool reads one tool; nil when it has problems. entry is where the
// tool's fields are written, for hints: "" for an entry of tools, else the
// override's path (mcp_upstreams.<name>.tools.<tool>).
func parseTool(c *collector, o *options, keyNode, val *yaml.Node, entry string) *effects.Tool {
	before := len(c.errs)
	name := keyNode.Value
	if keyNode.Kind != yaml.ScalarNode || !intent.ValidTool(name) {
		c.add(keyNode.Line, "tools", fmt.Sprintf("tool name %s is invalid", describe(keyNode)), "use 1-64 of a-z, 0-9, '_' and '-'")
	}
	s := newSection(c, name, keyNode.Line, val)
	if !s.present || len(s.fields) == 0 {
		if len(c.errs) == before {
			c.add(keyNode.Line, name, "has no settings", "add at least effect: noop or effect: webhook")
		}
		return nil
	}
	t := &effects.Tool{Name: name}

	t.Kind = s.String("effect", "")
	read, known := o.kinds[t.Kind]
	switch {
	case !s.Has("effect"):
		s.Invalid("effect", "is missing", "add effect: one of "+strings.Join(kindNames(o), ", "))
	case t.Kind != "" && !known:
		hint := suggest(t.Kind, kindNames(o))
		if strings.HasPrefix(hint, "known fields: ") {
			hint = "known effects: " + strings.TrimPrefix(hint, "known fields: ")
		}
		s.Invalid("effect", fmt.Sprintf("unknown effect %q", t.Kind), hint)
	}

	keyArgs, keyArgLines := keyArgList(s)
	volatile, _ := argList(s, "volatile_args")
	for _, a := range keyArgs {
		if slices.Contains(volatile, a) {
			s.Invalid("volatile_args", fmt.Sprintf("%q is also a key arg", a), "a key arg always tells operations apart; remove it from one of the lists")
		}
	}
	t.KeySpec = intent.KeySpec{KeyArgs: keyArgs, VolatileArgs: volatile}
	keyWarnings(s, t, keyArgLines)

	if s.Has("window") {
		mark := s.Problems()
		w := s.Duration("window", 0)
		switch {
		case s.Problems() > mark:
		case w == 0:
			s.Invalid("window", "must be at least 1s", "remove window for keys without a time window, or write e.g. 168h")
		case w%time.Second != 0:
			s.Invalid("window", fmt.Sprintf("%s is not a whole number of seconds", w), "write e.g. 168h")
		case w > 0 && w < time.Second:
			s.Invalid("window", "must be at least 1s", "write e.g. 168h")
		}
		t.KeySpec.Window = w
	}

	t.Policy = parsePolicy(s)
	if w := t.KeySpec.Window; w > 0 && t.Policy.Retention > 0 && t.Policy.Retention < w {
		s.Invalid("retention", fmt.Sprintf("%s is shorter than the tool's window (%s): a repeat later in the window would find no record and fire again",
			text.FormatDuration(t.Policy.Retention), text.FormatDuration(w)), "make retention at least the window, or remove it for the ledger's")
	}
	parseDescription(s, t)
	requireIdentity(s, t, entry)
	t.AuditArgs = s.Bool("audit_args", false)
	t.Lease = s.Duration("lease", effects.DefaultLease)
	if t.Lease < effects.MinLease {
		s.Invalid("lease", fmt.Sprintf("%s is under the minimum of %s", text.FormatDuration(t.Lease), effects.MinLease), "write e.g. lease: 30s")
	}

	if known {
		settings := s.Section(t.Kind)
		mark := s.Problems()
		eff, err := read(settings)
		switch {
		case s.Problems() > mark:
			closeEffect(eff)
		case err != nil:
			var ce *ConfigError
			if errors.As(err, &ce) {
				c.errs = append(c.errs, ce)
			} else {
				settings.Invalid("", err.Error(), "")
			}
			closeEffect(eff)
		case eff == nil:
			settings.Invalid("", "the "+t.Kind+" kind built no effect", "")
		default:
			t.Effect = eff
		}
	}
	if t.Effect != nil {
		if t.Prober = readProbe(s, t.Kind, t.Effect); t.Prober != nil && !t.Policy.Ledger {
			s.Invalid("probe", "a tool without the ledger is never taken over, so never probed", "remove probe")
		}
	} else if s.Has("probe") {
		s.used["probe"] = true // the tool's effect has problems, reported already
	}

	s.unknown(func(s *section, field string) (string, string, bool) {
		if _, isKind := o.kinds[field]; !isKind {
			return "", "", false
		}
		if !known {
			return "", "", true // the unknown effect is reported already
		}
		return fmt.Sprintf("settings for effect %s, but this tool's effect is %s", field, t.Kind),
			"remove the " + field + " block or change effect", true
	})
	if len(c.errs) > before {
		closeEffect(t.Effect)
		closeProber(t.Prober)
		return nil
	}
	if b, ok := t.Effect.(effects.Bounded); ok {
		t.MaxDuration = b.MaxDuration()
	}
	return t
}

// keyArgList reads key_args: a list of argument names (see argList), or
// the word all, which says that every argument names the operation (the
// default spelled out; see requireIdentity).
func keyArgList(s *section) (names []string, lines []int) {
	if f, ok := s.fields["key_args"]; ok {
		if v := resolve(f.val); v.Kind == yaml.ScalarNode && !isNull(v) {
			s.take("key_args")
			if v.Value != "all" {
				s.Invalid("key_args", fmt.Sprintf("%q is neither a list of argument names nor all", v.Value),
					"write e.g. key_args: [order_id], or key_args: all when every argument names the operation")
			}
			return nil, nil
		}
	}
	names, lines = argList(s, "key_args")
	if s.Has("key_args") && len(names) == 0 && resolve(s.fields["key_args"].val).Kind == yaml.SequenceNode {
		s.Invalid("key_args", "is an empty list", "list the arguments that name the operation, e.g. key_args: [order_id], or write key_args: all")
	}
	return names, lines
}

// argList reads a list of top-level argument names, non-empty and unique,
// and the line of each.
func argList(s *section, name string) ([]string, []int) {
	items, lines := s.strings(name)
	seen := map[string]bool{}
	for i, it := range items {
		p := fmt.Sprintf("%s.%s[%d]", s.path, name, i)
		switch {
		case it == "":
			s.c.add(lines[i], p, "is empty", "name a top-level argument, e.g. to")
		case seen[it]:
			s.c.add(lines[i], p, fmt.Sprintf("%q is listed twice", it), "keep one")
		}
		seen[it] = true
	}
	return items, lines
}

func kindNames(o *options) []string {
	out := make([]string, 0, len(o.kinds))
	for k := range o.kinds {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func closeEffect(e effects.Effect) {
	if c, ok := e.(io.Closer); ok {
		_ = c.Close()
	}
}

func closeAll(tools []*effects.Tool) {
	for _, t := range tools {
		closeEffect(t.Effect)
		closeProber(t.Prober)
	}
}

func closeProber(p effects.Prober) {
	if c, ok := p.(io.Closer); ok {
		_ = c.Close()
	}
}
