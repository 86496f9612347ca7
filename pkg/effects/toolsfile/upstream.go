package toolsfile

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"sort"
	"sync"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
	"go.yaml.in/yaml/v3"

	"github.com/idemgate/idemgate/pkg/argschema"
	"github.com/idemgate/idemgate/pkg/effects"
	"github.com/idemgate/idemgate/pkg/effects/mcp"
	"github.com/idemgate/idemgate/pkg/effects/mcp/upstream"
	"github.com/idemgate/idemgate/pkg/effects/netguard"
	"github.com/idemgate/idemgate/pkg/intent"
)

// defaultListTimeout bounds listing an upstream's tools.
const defaultListTimeout = 10 * time.Second

// mcpUpstream is one mcp_upstreams entry: an MCP server whose tools the
// registry serves as its own, each with the mcp effect. Its tools are
// listed when the file is parsed and again whenever the server reports a
// change (notifications/tools/list_changed).
type mcpUpstream struct {
	name      string
	conn      *mcp.Conn
	prefix    string
	timeout   time.Duration
	overrides map[string]field // upstream tool name → its override mapping
	o         *options
	conns     map[string]*mcp.Conn // every upstream's, for the mcp effects of a later listing
	taken     func(string) bool    // a name a tools-file tool or an earlier upstream has
	line      int

	mu       sync.Mutex
	tools    map[string]*effects.Tool
	problems []string // why tools were left out at the last listing
	stop     chan struct{}
}

// parseUpstreams reads the mcp_upstreams mapping and connects to each
// upstream (without listing yet).
func parseUpstreams(c *collector, o *options, root *section) []*mcpUpstream {
	if !root.Has("mcp_upstreams") {
		return nil
	}
	all := root.Section("mcp_upstreams")
	var out []*mcpUpstream
	for _, name := range all.order {
		s := all.Section(name)
		mark := s.Problems()
		u := &mcpUpstream{name: name, prefix: s.String("prefix", ""), timeout: positiveDuration(s, "list_timeout", defaultListTimeout),
			overrides: map[string]field{}, o: o, stop: make(chan struct{}), line: s.line}
		up := readUpstream(s)
		if err := up.Validate(); err != nil {
			s.Invalid("", err.Error(), "write e.g. files: {command: [npx, some-mcp-server]} or files: {url: https://mcp.example.com/mcp}")
		}
		if node, ok := s.Value("tools"); ok && !isNull(node) {
			if node.Kind != yaml.MappingNode {
				s.Invalid("tools", fmt.Sprintf("is %s, want a mapping of the upstream's tool names to overrides", describe(node)), "write e.g. tools: {create_issue: {key_args: [repo, title]}}")
			} else {
				for i := 0; i+1 < len(node.Content); i += 2 {
					k := resolve(node.Content[i])
					u.overrides[k.Value] = field{key: k, val: node.Content[i+1]}
				}
			}
		}
		if s.Problems() > mark {
			continue
		}
		u.conn = mcp.NewConn(up, u.changed)
		out = append(out, u)
	}
	return out
}

// list lists the upstream's tools and builds them, reporting problems to c.
// With a nil collector (a later listing) problems are kept, not reported.
func (u *mcpUpstream) list(c *collector) error {
	ctx, cancel := context.WithTimeout(context.Background(), u.timeout)
	defer cancel()
	listed, err := u.conn.Tools(ctx)
	if err != nil {
		return err
	}
	own := c
	if own == nil {
		own = &collector{file: u.o.file, upstreams: u.conns}
	}
	tools := map[string]*effects.Tool{}
	var problems []string
	for _, mt := range listed {
		name := u.prefix + mt.Name
		switch {
		case !intent.ValidTool(name):
			problems = append(problems, fmt.Sprintf("%s: the name is not a valid tool name ([a-z0-9_-]{1,64}); give the upstream a prefix or rename the tool upstream", mt.Name))
			continue
		case u.taken(name):
			problems = append(problems, fmt.Sprintf("%s: a tool named %s exists already", mt.Name, name))
			continue
		}
		before := len(own.errs)
		ov, hasOv := u.overrides[mt.Name]
		line := u.line // problems of a tool without an entry point at the upstream
		if hasOv {
			line = ov.key.Line
		}
		key := &yaml.Node{Kind: yaml.ScalarNode, Value: name, Line: line}
		t := parseTool(own, u.o, key, u.synthesize(mt, ov, hasOv), "mcp_upstreams."+u.name+".tools."+mt.Name)
		if t == nil {
			for _, e := range own.errs[before:] {
				problems = append(problems, e.Error())
			}
			continue
		}
		tools[name] = t
		if c != nil {
			u.warnHint(c, mt, ov, hasOv, t)
		}
	}
	for ov := range u.overrides {
		found := false
		for _, mt := range listed {
			found = found || mt.Name == ov
		}
		if !found && c != nil {
			c.add(u.overrides[ov].key.Line, "mcp_upstreams."+u.name+".tools."+ov, "the upstream lists no such tool", "check the name against the upstream's tools/list")
		}
	}
	u.mu.Lock()
	u.tools, u.problems = tools, problems
	u.mu.Unlock()
	return nil
}

// synthesize is the tools-file entry of an upstream tool: its description,
// input schema and destructiveHint, the mcp effect calling it, then the
// fields of its override, which win. Its class is the override's, else
// unsafe: an upstream's readOnlyHint or idempotentHint is its own claim,
// which it may change at any listing, and a class decides whether the
// ledger is used at all, so only the tools file sets it.
func (u *mcpUpstream) synthesize(mt *sdk.Tool, ov field, hasOv bool) *yaml.Node {
	class, destructive := intent.ClassUnsafe, true
	if a := mt.Annotations; a != nil && a.DestructiveHint != nil {
		destructive = *a.DestructiveHint
	}
	fields := map[string]*yaml.Node{}
	var order []string
	set := func(k string, v *yaml.Node) {
		if _, ok := fields[k]; !ok {
			order = append(order, k)
		}
		fields[k] = v
	}
	set("effect", scalar(intent.EffectMCP))
	set("class", scalar(string(class)))
	if mt.Description != "" {
		set("description", scalar(mt.Description))
	}
	if data, err := json.Marshal(mt.InputSchema); err == nil {
		if _, err := argschema.Resolve(data); err == nil {
			var v any
			_ = json.Unmarshal(data, &v)
			var n yaml.Node
			if n.Encode(v) == nil {
				set("schema", &n)
			}
		}
	}
	set(intent.EffectMCP, mapping(map[string]string{"upstream": u.name, "tool": mt.Name}))
	if class != intent.ClassRead {
		set("destructive", &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!bool", Value: fmt.Sprint(destructive)})
	}
	if hasOv {
		if n := resolve(ov.val); n.Kind == yaml.MappingNode {
			for i := 0; i+1 < len(n.Content); i += 2 {
				k := resolve(n.Content[i]).Value
				if k == "class" && resolve(n.Content[i+1]).Value == string(intent.ClassRead) {
					delete(fields, "destructive")
				}
				set(k, n.Content[i+1])
			}
		}
	}
	out := &yaml.Node{Kind: yaml.MappingNode}
	for _, k := range order {
		if v, ok := fields[k]; ok {
			out.Content = append(out.Content, scalar(k), v)
		}
	}
	return out
}

// warnHint warns when the upstream calls its tool a read or idempotent and
// the file does not say: the tool is served as the file says (unsafe by
// default), whatever the upstream claims.
func (u *mcpUpstream) warnHint(c *collector, mt *sdk.Tool, ov field, hasOv bool, t *effects.Tool) {
	a := mt.Annotations
	if a == nil || (!a.ReadOnlyHint && !a.IdempotentHint) {
		return
	}
	line := u.line
	if hasOv {
		line = ov.key.Line
		if n := resolve(ov.val); n.Kind == yaml.MappingNode {
			for i := 0; i+1 < len(n.Content); i += 2 {
				if resolve(n.Content[i]).Value == "class" {
					return
				}
			}
		}
	}
	hint, class := "readOnlyHint", intent.ClassRead
	if !a.ReadOnlyHint {
		hint, class = "idempotentHint", intent.ClassIdempotent
	}
	entry := "mcp_upstreams." + u.name + ".tools." + mt.Name
	c.warn(line, entry, fmt.Sprintf("the upstream marks it %s, and the tools file gives no class: it is served %s, through the ledger", hint, t.Policy.Class),
		fmt.Sprintf("if a repeat is harmless, write class: %s in %s; only the tools file decides a tool's class", class, entry))
}

// changed lists the tools again after the upstream reported a change.
func (u *mcpUpstream) changed() {
	select {
	case <-u.stop:
		return
	default:
	}
	_ = u.list(nil)
}

// Lookup returns the upstream tool named name.
func (u *mcpUpstream) Lookup(name string) (*effects.Tool, bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	t, ok := u.tools[name]
	return t, ok
}

// Names returns the upstream's tool names.
func (u *mcpUpstream) Names() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	out := make([]string, 0, len(u.tools))
	for n := range u.tools {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

func (u *mcpUpstream) close() error {
	close(u.stop)
	return u.conn.Close()
}

func scalar(v string) *yaml.Node { return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: v} }

func mapping(m map[string]string) *yaml.Node {
	n := &yaml.Node{Kind: yaml.MappingNode}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		n.Content = append(n.Content, scalar(k), scalar(m[k]))
	}
	return n
}

// upstreamConns maps the upstreams' names to their connections.
func upstreamConns(ups []*mcpUpstream) map[string]*mcp.Conn {
	m := make(map[string]*mcp.Conn, len(ups))
	for _, u := range ups {
		m[u.name] = u.conn
	}
	return m
}

// expandUpstreams lists each upstream's tools, after the tools file's own
// (which win a name both have).
func expandUpstreams(c *collector, ups []*mcpUpstream, tools []*effects.Tool) {
	taken := map[string]bool{}
	for _, t := range tools {
		taken[t.Name] = true
	}
	for i, u := range ups {
		u.conns = c.upstreams
		earlier := ups[:i]
		u.taken = func(name string) bool {
			if taken[name] {
				return true
			}
			for _, e := range earlier {
				if _, ok := e.Lookup(name); ok {
					return true
				}
			}
			return false
		}
		if err := u.list(c); err != nil {
			problem, hint := "could not list its tools: "+err.Error(), "check the command or url, and that the server starts"
			var de *netguard.DestinationError
			if errors.Is(err, mcp.ErrRedirect) {
				hint = "give the upstream's final URL: redirects are not followed"
			}
			if errors.As(err, &de) {
				problem = fmt.Sprintf("could not list its tools: %s: %v", u.conn.Upstream(), de)
				hint = fmt.Sprintf("add allow_private: [%s] to this upstream, or start the worker with --webhook-allow %s", singlePrefix(de.Addr), singlePrefix(de.Addr))
			}
			c.add(u.line, "mcp_upstreams."+u.name, problem, hint)
		}
	}
}

// readUpstream reads an upstream's command, url and allow_private (to which
// the worker's WithAllowPrivate list is added for a url).
func readUpstream(s *section) upstream.Server {
	up := upstream.Server{Command: s.Strings("command"), URL: s.String("url", "")}
	own := readAllowPrivate(s)
	switch {
	case up.URL != "":
		up.AllowPrivate = append(append([]netip.Prefix(nil), s.c.allow...), own...)
	case len(own) > 0:
		s.Invalid("allow_private", "applies only to a url upstream", "remove it: a command runs on the worker's host")
	}
	return up
}
