package toolsfile

import (
	"errors"
	"fmt"
	"net/netip"
	"net/url"
	"sort"
	"strings"
	"unicode"

	"go.yaml.in/yaml/v3"

	"github.com/idemgate/idemgate/pkg/effects"
	"github.com/idemgate/idemgate/pkg/effects/internal/text"
	"github.com/idemgate/idemgate/pkg/effects/netguard"
)

// Warn records a warning about field name of the section (dotted for nested
// fields; "" for the section itself). A kind's reader uses it for settings that
// load but will likely misbehave.
func (s *section) Warn(name, problem, hint string) {
	s.c.warn(s.Line(name), s.join(name), problem, hint)
}

func (c *collector) warn(line int, path, problem, hint string) {
	c.warns = append(c.warns, effects.Warning{File: c.file, Line: line, Path: path, Problem: problem, Hint: hint})
}

// warnings returns the collected warnings in line order.
func (c *collector) warnings() []effects.Warning {
	out := append([]effects.Warning(nil), c.warns...)
	sort.SliceStable(out, func(i, j int) bool { return out[i].Line < out[j].Line })
	return out
}

// volatileLooking reports whether an argument name looks like a value that
// changes between two calls of one operation, and what it looks like. The
// name is split into words at '_', '-', '.' and lower-to-upper case changes
// ("requestedAt" is "requested at"); it looks volatile when:
//
//   - a timestamp: its last word is "at" (requested_at, createdAt), or a word
//     is time, timestamp, datetime, date, ts or now, or ends in "timestamp";
//   - an attempt counter: a word is attempt, attempts, retry, retries, try
//     or tries;
//   - a random or per-request id: a word is nonce, uuid or guid, or it ends
//     in "request id" or "req id" (request_id, x_request_id);
//   - tracing: its first word starts with "trace" (trace_id, traceparent)
//     or is span;
//   - a caller's own idempotency key: its first word starts with
//     "idempotency" (idempotency_key).
//
// The list is deliberately short and judged by words, so that timeout,
// runtime or update do not match. A match is only a warning: a date can be
// part of an operation's identity (book a table for a date); then keep it
// in key_args and ignore the warning.
func volatileLooking(name string) (what string, ok bool) {
	words := splitWords(name)
	if len(words) == 0 {
		return "", false
	}
	first, last := words[0], words[len(words)-1]
	if len(words) > 1 && last == "at" {
		return "a timestamp", true
	}
	if len(words) >= 2 && words[len(words)-1] == "id" && (words[len(words)-2] == "request" || words[len(words)-2] == "req") {
		return "a per-request id", true
	}
	if strings.HasPrefix(first, "trace") || first == "span" {
		return "a trace id", true
	}
	if strings.HasPrefix(first, "idempotency") {
		return "a caller's idempotency key (give it as the envelope's key instead)", true
	}
	for _, w := range words {
		switch w {
		case "time", "timestamp", "datetime", "date", "ts", "now":
			return "a timestamp", true
		case "attempt", "attempts", "retry", "retries", "try", "tries":
			return "an attempt counter", true
		case "nonce", "uuid", "guid":
			return "a random id", true
		}
		if strings.HasSuffix(w, "timestamp") {
			return "a timestamp", true
		}
	}
	return "", false
}

// splitWords splits a name into lower-case words at '_', '-', '.', spaces
// and lower-to-upper case changes.
func splitWords(name string) []string {
	var words []string
	var cur []rune
	flush := func() {
		if len(cur) > 0 {
			words = append(words, strings.ToLower(string(cur)))
			cur = cur[:0]
		}
	}
	var prev rune
	for _, r := range name {
		switch {
		case r == '_' || r == '-' || r == '.' || unicode.IsSpace(r):
			flush()
		case unicode.IsUpper(r) && (unicode.IsLower(prev) || unicode.IsDigit(prev)):
			flush()
			cur = append(cur, r)
		default:
			cur = append(cur, r)
		}
		prev = r
	}
	flush()
	return words
}

// keyWarnings warns about the fields of tool t that can enter its key and
// look volatile (see volatileLooking) without being declared volatile: its
// key_args when it has them, else the top-level properties of its schema.
func keyWarnings(s *section, t *effects.Tool, keyArgLines []int) {
	declared := func(name string) bool {
		for _, v := range t.KeySpec.VolatileArgs {
			if v == name {
				return true
			}
		}
		return false
	}
	warn := func(line int, path, name, what, hint string) {
		s.c.warn(line, path, fmt.Sprintf("%q looks like %s, and it is part of the key: a retry with another value would be another operation and fire again", name, what), hint)
	}
	if len(t.KeySpec.KeyArgs) > 0 {
		for i, name := range t.KeySpec.KeyArgs {
			if what, ok := volatileLooking(name); ok && !declared(name) {
				line := s.Line("key_args")
				if i < len(keyArgLines) {
					line = keyArgLines[i]
				}
				warn(line, fmt.Sprintf("%s.key_args[%d]", s.path, i), name, what,
					"leave it out of key_args, or if it is part of what the operation is (a booking's date), ignore this warning")
			}
		}
		return
	}
	names, lines := schemaArgNames(s)
	for i, name := range names {
		if what, ok := volatileLooking(name); ok && !declared(name) {
			warn(lines[i], s.path+".schema.properties."+name, name, what,
				"add it to volatile_args, or list the distinguishing args in key_args")
		}
	}
}

// schemaArgNames returns the top-level property names of the tool's
// `schema` field (a JSON Schema written as YAML: schema.properties) and the
// line of each, for keyWarnings. It reads the node without marking the field
// as read: the schema field belongs to whoever parses it. Without a schema
// field (or one whose properties are not a mapping) it returns nothing: a
// tool keyed by all its args whose argument names the tools file does not
// list cannot be checked.
func schemaArgNames(s *section) ([]string, []int) {
	f, ok := s.fields["schema"]
	if !ok {
		return nil, nil
	}
	schema := resolve(f.val)
	if schema.Kind != yaml.MappingNode {
		return nil, nil
	}
	for i := 0; i+1 < len(schema.Content); i += 2 {
		if resolve(schema.Content[i]).Value != "properties" {
			continue
		}
		props := resolve(schema.Content[i+1])
		if props.Kind != yaml.MappingNode {
			return nil, nil
		}
		var names []string
		var lines []int
		for j := 0; j+1 < len(props.Content); j += 2 {
			k := resolve(props.Content[j])
			names = append(names, k.Value)
			lines = append(lines, k.Line)
		}
		return names, lines
	}
	return nil, nil
}

// warnPrivateURL warns when the URL of a webhook or an mcp upstream (what)
// names an address its guard refuses: an IP literal in a restricted range,
// or localhost, not covered by allow. Host names other than localhost are
// not resolved here (they are checked when a connection is dialled).
func warnPrivateURL(s *section, raw string, allow []netip.Prefix, what string) {
	u, err := url.Parse(raw)
	if err != nil || u.Hostname() == "" {
		return // reported as a problem already
	}
	host := strings.ToLower(strings.TrimSuffix(u.Hostname(), "."))
	var addr netip.Addr
	switch {
	case host == "localhost" || strings.HasSuffix(host, ".localhost"):
		addr = netip.MustParseAddr("127.0.0.1")
	default:
		a, err := netip.ParseAddr(host)
		if err != nil {
			return
		}
		addr = a
	}
	var de *netguard.DestinationError
	if err := netguard.New(allow...).Check(addr); errors.As(err, &de) {
		s.Warn("url", fmt.Sprintf("%s names %s, a %s address: every request would be refused when the tool fires", text.URL(raw), addr, de.What),
			fmt.Sprintf("add allow_private: [%s] to this %s, or start the worker with --webhook-allow %s", singlePrefix(addr), what, singlePrefix(addr)))
	}
}

// singlePrefix is the one-address prefix of a, e.g. 127.0.0.1/32.
func singlePrefix(a netip.Addr) string {
	return netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen()).String()
}

// readAllowPrivate reads a section's allow_private list (CIDR prefixes or
// single addresses), reporting every entry that is neither.
func readAllowPrivate(s *section) []netip.Prefix {
	items, lines := s.strings("allow_private")
	var out []netip.Prefix
	for i, it := range items {
		p, err := netguard.ParsePrefix(it)
		if err != nil {
			s.c.add(lines[i], fmt.Sprintf("%s.allow_private[%d]", s.path, i),
				fmt.Sprintf("%q is not an IP address or CIDR prefix", it), "write e.g. 127.0.0.1/32 or 10.0.0.0/8")
			continue
		}
		out = append(out, p)
	}
	return out
}
