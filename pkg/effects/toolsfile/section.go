package toolsfile

import (
	"errors"
	"fmt"
	"net/netip"
	"sort"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/idemgate/idemgate/pkg/effects"
	"github.com/idemgate/idemgate/pkg/effects/internal/text"
	"github.com/idemgate/idemgate/pkg/effects/mcp"
)

// ErrConfig is matched by errors.Is for every *ConfigError, so a caller can
// tell a bad tools file from an unreadable one.
var ErrConfig = errors.New("toolsfile: invalid tools file")

// ConfigError is one problem in a tools file. Parse reports every problem it
// finds, joined with errors.Join, each a *ConfigError.
type ConfigError struct {
	File    string // the file name, as given to LoadFile or WithFilename
	Line    int    // 1-based line of the offending field; 0 when unknown
	Path    string // the field, dotted from the tool name: "send_email.webhook.timeout"
	Problem string // what is wrong: `"10" is not a duration`
	Hint    string // how to fix it: "write e.g. 10s"; may be empty
}

// Error formats the problem as a warning is written: "file:line: path:
// problem (hint)".
func (e *ConfigError) Error() string {
	return effects.Warning{File: e.File, Line: e.Line, Path: e.Path, Problem: e.Problem, Hint: e.Hint}.String()
}

// Unwrap returns ErrConfig.
func (e *ConfigError) Unwrap() error { return ErrConfig }

// collector gathers the problems of one file.
type collector struct {
	file  string
	errs  []*ConfigError
	warns []effects.Warning
	// The mcp effect's connections: the mcp_upstreams entries by name, and
	// those of tools naming an upstream of their own.
	upstreams map[string]*mcp.Conn
	owned     []*mcp.Conn
	// allow is what every URL-taking effect may reach besides public
	// addresses (WithAllowPrivate).
	allow []netip.Prefix
}

func (c *collector) add(line int, path, problem, hint string) {
	c.errs = append(c.errs, &ConfigError{File: c.file, Line: line, Path: path, Problem: problem, Hint: hint})
}

// err joins the problems in line order (nil when there are none).
func (c *collector) err() error {
	if len(c.errs) == 0 {
		return nil
	}
	sort.SliceStable(c.errs, func(i, j int) bool { return c.errs[i].Line < c.errs[j].Line })
	errs := make([]error, len(c.errs))
	for i, e := range c.errs {
		errs[i] = e
	}
	return errors.Join(errs...)
}

type field struct {
	key, val *yaml.Node
}

// section is a mapping in the tools file — a tool, or an effect's settings
// block such as a tool's "webhook:" — as the parser and a kind's reader see
// it.
//
// Its getters read one field each, returning the given default when the field
// is absent. A value of the wrong type is recorded as a problem (with the
// file, line and a hint) and the default is returned, so a reader reads all
// its fields in a row and every problem of the file is reported at once. A
// field no getter read is reported as unknown when the reader returns: a typo
// never passes silently.
type section struct {
	c        *collector
	path     string
	line     int
	present  bool
	fields   map[string]field
	order    []string
	used     map[string]bool
	asked    []string
	children []*section
}

// newSection wraps node (nil when absent) found at line under path.
func newSection(c *collector, path string, line int, node *yaml.Node) *section {
	s := &section{c: c, path: path, line: line, fields: map[string]field{}, used: map[string]bool{}}
	node = resolve(node)
	if node == nil || isNull(node) {
		s.present = node != nil
		return s
	}
	if node.Kind != yaml.MappingNode {
		c.add(node.Line, path, fmt.Sprintf("is %s, want a mapping", describe(node)), "write "+lastPart(path)+": followed by indented field: value lines")
		return s
	}
	s.present = true
	for i := 0; i+1 < len(node.Content); i += 2 {
		k, v := resolve(node.Content[i]), node.Content[i+1]
		if k.Kind != yaml.ScalarNode || k.Tag == "!!merge" {
			c.add(k.Line, path, fmt.Sprintf("key %s is not supported", describe(k)), "write plain field names; merge keys (<<) are not supported")
			continue
		}
		if first, dup := s.fields[k.Value]; dup {
			c.add(k.Line, s.join(k.Value), fmt.Sprintf("is repeated (first at line %d)", first.key.Line), "keep one")
			continue
		}
		s.fields[k.Value] = field{key: k, val: v}
		s.order = append(s.order, k.Value)
	}
	return s
}

// Path is the section's dotted path, e.g. "send_email.webhook".
func (s *section) Path() string { return s.path }

// Present reports whether the section was written in the file.
func (s *section) Present() bool { return s.present }

// Has reports whether field name was written in the section. It does not
// count as reading the field.
func (s *section) Has(name string) bool {
	_, ok := s.fields[name]
	return ok
}

// Line is the line of field name (a dotted name reaches into nested
// mappings), or of the section itself when the field is absent.
func (s *section) Line(name string) int {
	line := s.line
	cur := s
	for part := range strings.SplitSeq(name, ".") {
		f, ok := cur.fields[part]
		if !ok {
			return line
		}
		line = f.key.Line
		child := resolve(f.val)
		if child.Kind != yaml.MappingNode {
			return line
		}
		cur = &section{fields: map[string]field{}}
		for i := 0; i+1 < len(child.Content); i += 2 {
			cur.fields[child.Content[i].Value] = field{key: child.Content[i], val: child.Content[i+1]}
		}
	}
	return line
}

// Invalid records a problem with field name (dotted for nested fields; "" for
// the section itself): problem says what is wrong, hint how to fix it.
func (s *section) Invalid(name, problem, hint string) {
	s.c.add(s.Line(name), s.join(name), problem, hint)
}

// Problems reports how many problems the whole file has so far.
func (s *section) Problems() int { return len(s.c.errs) }

// Value returns field name's raw node, for values no getter covers.
func (s *section) Value(name string) (*yaml.Node, bool) {
	v, ok := s.take(name)
	if !ok {
		return nil, false
	}
	return resolve(v), true
}

// String reads a scalar field as text.
func (s *section) String(name, def string) string {
	v, ok := s.scalar(name, "a string", "write e.g. "+name+": value")
	if !ok {
		return def
	}
	return v.Value
}

// Int reads a whole-number field.
func (s *section) Int(name string, def int) int {
	v, ok := s.scalar(name, "a whole number", "write e.g. "+name+": "+strconv.Itoa(def))
	if !ok {
		return def
	}
	var n int
	if v.Tag != "!!int" || v.Decode(&n) != nil {
		s.c.add(v.Line, s.join(name), fmt.Sprintf("%q is not a whole number", v.Value), "write e.g. "+name+": "+strconv.Itoa(def))
		return def
	}
	return n
}

// Bool reads a true/false field.
func (s *section) Bool(name string, def bool) bool {
	v, ok := s.scalar(name, "true or false", "write "+name+": true or "+name+": false")
	if !ok {
		return def
	}
	var b bool
	if v.Tag != "!!bool" || v.Decode(&b) != nil {
		s.c.add(v.Line, s.join(name), fmt.Sprintf("%q is not true or false", v.Value), "write "+name+": true or "+name+": false")
		return def
	}
	return b
}

// Duration reads a duration written as Go writes one ("10s", "1m30s",
// "168h"). A negative duration is a problem.
func (s *section) Duration(name string, def time.Duration) time.Duration {
	example := text.FormatDuration(def)
	if def <= 0 {
		example = "30s"
	}
	hint := "write e.g. " + example
	v, ok := s.scalar(name, "a duration", hint)
	if !ok {
		return def
	}
	d, err := time.ParseDuration(v.Value)
	if v.Tag != "!!str" || err != nil {
		if strings.HasSuffix(v.Value, "d") {
			hint = "write days in hours, e.g. 168h for 7d"
		}
		s.c.add(v.Line, s.join(name), fmt.Sprintf("%q is not a duration", v.Value), hint)
		return def
	}
	if d < 0 {
		s.c.add(v.Line, s.join(name), fmt.Sprintf("%s is negative", v.Value), hint)
		return def
	}
	return d
}

// Strings reads a list of scalars ("[a, b]" or one "- a" line each).
func (s *section) Strings(name string) []string {
	items, _ := s.strings(name)
	return items
}

func (s *section) strings(name string) ([]string, []int) {
	raw, ok := s.take(name)
	if !ok {
		return nil, nil
	}
	v := resolve(raw)
	if v.Kind != yaml.SequenceNode {
		s.c.add(v.Line, s.join(name), fmt.Sprintf("is %s, want a list", describe(v)), "write e.g. "+name+": [a, b]")
		return nil, nil
	}
	items := make([]string, 0, len(v.Content))
	lines := make([]int, 0, len(v.Content))
	for i, it := range v.Content {
		it = resolve(it)
		if it.Kind != yaml.ScalarNode || isNull(it) {
			s.c.add(it.Line, fmt.Sprintf("%s[%d]", s.join(name), i), fmt.Sprintf("is %s, want a string", describe(it)), "write e.g. "+name+": [a, b]")
			continue
		}
		items = append(items, it.Value)
		lines = append(lines, it.Line)
	}
	return items, lines
}

// StringMap reads a mapping of scalars to scalars, e.g. HTTP headers.
func (s *section) StringMap(name string) map[string]string {
	raw, ok := s.take(name)
	if !ok {
		return nil
	}
	v := resolve(raw)
	if isNull(v) {
		return nil
	}
	if v.Kind != yaml.MappingNode {
		s.c.add(v.Line, s.join(name), fmt.Sprintf("is %s, want a mapping", describe(v)), "write e.g. "+name+": {Name: value}")
		return nil
	}
	m := make(map[string]string, len(v.Content)/2)
	for i := 0; i+1 < len(v.Content); i += 2 {
		k, val := resolve(v.Content[i]), resolve(v.Content[i+1])
		if k.Kind != yaml.ScalarNode || val.Kind != yaml.ScalarNode || isNull(val) {
			s.c.add(k.Line, s.join(name)+"."+k.Value, "want a name: value pair of strings", "quote the value if it holds ':' or '#'")
			continue
		}
		if _, dup := m[k.Value]; dup {
			s.c.add(k.Line, s.join(name)+"."+k.Value, "is repeated", "keep one")
			continue
		}
		m[k.Value] = val.Value
	}
	return m
}

// Section reads a nested mapping. An absent one is returned empty (its
// getters return their defaults), so a reader needs no special case.
func (s *section) Section(name string) *section {
	raw, ok := s.take(name)
	line := s.Line(name)
	if !ok {
		raw = nil
	}
	child := newSection(s.c, s.join(name), line, raw)
	s.children = append(s.children, child)
	return child
}

// take marks field name as read and returns its value node.
func (s *section) take(name string) (*yaml.Node, bool) {
	s.asked = append(s.asked, name)
	f, ok := s.fields[name]
	if !ok {
		return nil, false
	}
	s.used[name] = true
	return f.val, true
}

// scalar returns field name's scalar node; false when absent or wrong.
func (s *section) scalar(name, want, hint string) (*yaml.Node, bool) {
	raw, ok := s.take(name)
	if !ok {
		return nil, false
	}
	v := resolve(raw)
	if v.Kind != yaml.ScalarNode || isNull(v) {
		s.c.add(v.Line, s.join(name), fmt.Sprintf("is %s, want %s", describe(v), want), hint)
		return nil, false
	}
	return v, true
}

// unknown reports every field of s and its children that nothing read.
// explain, when it returns a problem, replaces the generic message for a name.
func (s *section) unknown(explain func(s *section, name string) (problem, hint string, ok bool)) {
	for _, name := range s.order {
		if s.used[name] {
			continue
		}
		line := s.fields[name].key.Line
		if explain != nil {
			if problem, hint, ok := explain(s, name); ok {
				if problem != "" {
					s.c.add(line, s.join(name), problem, hint)
				}
				continue
			}
		}
		s.c.add(line, s.join(name), "unknown field", suggest(name, s.asked))
	}
	for _, c := range s.children {
		c.unknown(nil)
	}
}

func (s *section) join(name string) string {
	switch {
	case name == "":
		return s.path
	case s.path == "":
		return name
	}
	return s.path + "." + name
}

// suggest names the closest known field, or lists them.
func suggest(name string, known []string) string {
	uniq := dedupe(known)
	if len(uniq) == 0 {
		return "remove it"
	}
	best, bestDist := "", 3
	lower := strings.ToLower(name)
	for _, k := range uniq {
		d := text.EditDistance(lower, k)
		if p := commonPrefix(lower, k); p >= 4 && p >= min(len(lower), len(k))-1 {
			d = min(d, 2)
		}
		if d < bestDist {
			best, bestDist = k, d
		}
	}
	if best != "" {
		return fmt.Sprintf("did you mean %s?", best)
	}
	return "known fields: " + strings.Join(uniq, ", ")
}

func dedupe(in []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, s := range in {
		if !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	sort.Strings(out)
	return out
}

func commonPrefix(a, b string) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return n
}

func resolve(n *yaml.Node) *yaml.Node {
	for n != nil && n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	return n
}

func isNull(n *yaml.Node) bool {
	return n.Kind == yaml.ScalarNode && n.Tag == "!!null"
}

// describe names a node's kind for messages: "a list", "empty", `"10"`.
func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		if isNull(n) {
			return "empty"
		}
		return strconv.Quote(n.Value)
	}
	return "not a value"
}

func lastPart(path string) string {
	if i := strings.LastIndexByte(path, '.'); i >= 0 {
		return path[i+1:]
	}
	return path
}
