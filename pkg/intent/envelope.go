package intent

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"time"
	"unicode"
)

// Defaults of Limits.
const (
	DefaultMaxBytes = 256 << 10 // 256 KiB
	DefaultMaxDepth = 32
)

// MaxKeyBytes is the longest key override an envelope may carry, in bytes.
const MaxKeyBytes = 256

// maxToolLen is the longest tool name.
const maxToolLen = 64

// Envelope is one tool intent as published on idem.intents.<tool>.
//
// Decode is the way in: it enforces the protocol's strict rules and stores
// Args canonicalized. An Envelope built by hand (by a client about to
// publish) is checked again by Derive.
type Envelope struct {
	// Tool names the tool; it matches [a-z0-9_-]{1,64} and equals the last
	// token of the subject the intent is published on. Required.
	Tool string `json:"tool"`
	// Args is the tool's arguments, a JSON object. After Decode it holds the
	// RFC 8785 canonical bytes of the object. Required ("{}" when there are
	// none; MarshalJSON writes "{}" for nil).
	Args json.RawMessage `json:"args"`
	// Session scopes the key to a run, conversation or tenant. Optional;
	// absent and "" are the same scope. It holds no control character (see
	// CheckHeaderText).
	Session string `json:"session,omitempty"`
	// Key overrides the derived key's material: 1 to MaxKeyBytes bytes.
	// Optional.
	Key string `json:"key,omitempty"`
	// CallID is the model's tool_call_id, carried for tracing only; it never
	// enters a key or fingerprint. Optional; no control character (see
	// CheckHeaderText).
	CallID string `json:"call_id,omitempty"`
	// CreatedAt is when the caller created the intent, used only by tools
	// keyed by a time window. Optional; the zero time means absent.
	CreatedAt time.Time `json:"created_at,omitzero"`
}

// Limits bound what Decode accepts. A field that is zero or negative takes
// its default.
type Limits struct {
	// MaxBytes is the largest envelope, in bytes. Default: DefaultMaxBytes
	// (256 KiB).
	MaxBytes int
	// MaxDepth is the deepest nesting of objects and arrays, counting the
	// envelope itself as 1 (so args is at depth 2). Default: DefaultMaxDepth
	// (32).
	MaxDepth int
}

func (l Limits) withDefaults() Limits {
	if l.MaxBytes <= 0 {
		l.MaxBytes = DefaultMaxBytes
	}
	if l.MaxDepth <= 0 {
		l.MaxDepth = DefaultMaxDepth
	}
	return l
}

// ValidTool reports whether name is a valid tool name: 1 to 64 characters
// of a-z, 0-9, '_' and '-'.
func ValidTool(name string) bool {
	if len(name) == 0 || len(name) > maxToolLen {
		return false
	}
	for i := 0; i < len(name); i++ {
		switch c := name[i]; {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9', c == '_', c == '-':
		default:
			return false
		}
	}
	return true
}

// envelopeFields are the envelope's member names, in the order MarshalJSON
// writes them.
var envelopeFields = []string{"tool", "args", "session", "key", "call_id", "created_at"}

// Decode parses and validates one intent envelope under lim.
//
// The rules: the size is checked first (over lim.MaxBytes: ErrTooLarge);
// then data must be one strict JSON object (see Canonicalize for the JSON
// rules) whose member names are exactly, case-sensitively, tool, args,
// session, key, call_id and created_at, each at most once. tool is required
// and valid (ValidTool); args is required and an object; session, key,
// call_id and created_at are strings when present (null is rejected); key,
// when present, is 1 to MaxKeyBytes bytes; session and call_id hold no
// control character (CheckHeaderText); created_at is an RFC 3339 time.
// Every error but ErrTooLarge wraps ErrInvalid.
func Decode(data []byte, lim Limits) (*Envelope, error) {
	env, _, err := decode(data, lim)
	return env, err
}

// decode is Decode, returning the args as parsed too.
func decode(data []byte, lim Limits) (*Envelope, *value, error) {
	lim = lim.withDefaults()
	if len(data) > lim.MaxBytes {
		return nil, nil, fmt.Errorf("%w: %d bytes, the limit is %d", ErrTooLarge, len(data), lim.MaxBytes)
	}
	root, err := parseJSON(data, lim.MaxDepth)
	if err != nil {
		return nil, nil, err
	}
	if root.kind != kindObject {
		return nil, nil, invalidf("the envelope must be a JSON object, got %s", root.kind)
	}
	env := &Envelope{}
	var args *value
	var haveTool bool
	for i := range root.members {
		m := &root.members[i]
		if m.name == "args" {
			if m.val.kind != kindObject {
				return nil, nil, invalidf(`field "args" must be an object, got %s`, m.val.kind)
			}
			env.Args = appendCanonical(make([]byte, 0, len(data)), &m.val)
			args = &m.val
			continue
		}
		dst := env.stringField(m.name)
		if dst == nil {
			return nil, nil, unknownField(m.name)
		}
		if m.val.kind != kindString {
			hint := ""
			if m.val.kind == kindNull && m.name != "tool" {
				hint = " (omit the field instead of sending null)"
			}
			return nil, nil, invalidf("field %q must be a string, got %s%s", m.name, m.val.kind, hint)
		}
		s := m.val.str
		switch m.name {
		case "tool":
			if !ValidTool(s) {
				return nil, nil, invalidf("field \"tool\": %q must match [a-z0-9_-]{1,64}", clip(s))
			}
			haveTool = true
		case "key":
			if err := checkKeyOverride(s); err != nil {
				return nil, nil, err
			}
		case "session", "call_id":
			if err := CheckHeaderText(m.name, s); err != nil {
				return nil, nil, err
			}
		case "created_at":
			t, err := ParseCreatedAt(s)
			if err != nil {
				return nil, nil, err
			}
			env.CreatedAt = t
			continue
		}
		*dst = s
	}
	switch {
	case !haveTool:
		return nil, nil, invalidf(`field "tool" is required`)
	case args == nil:
		return nil, nil, invalidf(`field "args" is required (send {} for no arguments)`)
	}
	return env, args, nil
}

// stringField returns where the string member name is kept, or nil when
// name is not a string field of the envelope. created_at returns a scratch
// string: it is parsed into CreatedAt.
func (e *Envelope) stringField(name string) *string {
	switch name {
	case "tool":
		return &e.Tool
	case "session":
		return &e.Session
	case "key":
		return &e.Key
	case "call_id":
		return &e.CallID
	case "created_at":
		return new(string)
	}
	return nil
}

func unknownField(name string) error {
	for _, f := range envelopeFields {
		if strings.EqualFold(f, name) {
			return invalidf("unknown field %q (field names are case-sensitive: use %q)", clip(name), f)
		}
	}
	return invalidf("unknown field %q (the fields are %s)", clip(name), strings.Join(envelopeFields, ", "))
}

func checkKeyOverride(k string) error {
	switch {
	case k == "":
		return invalidf(`field "key" is empty: omit it to derive the key from the args`)
	case len(k) > MaxKeyBytes:
		return invalidf(`field "key" is %d bytes, the limit is %d`, len(k), MaxKeyBytes)
	}
	return nil
}

// CheckHeaderText returns an error wrapping ErrInvalid when value, the
// envelope's field name (session or call_id), holds a control character
// (Unicode category Cc: U+0000 to U+001F, U+007F to U+009F). Effects forward
// both fields as header values (an HTTP header, a NATS header), where a line
// break or a NUL cannot go: an intent holding one could never be sent, so it
// is refused before anything is recorded.
func CheckHeaderText(field, value string) error {
	for i, r := range value {
		if unicode.IsControl(r) {
			return invalidf("field %q holds the control character U+%04X at byte %d: it is sent as a header value, which holds none", field, r, i)
		}
	}
	return nil
}

// rfc3339 is the syntax of created_at (RFC 3339 section 5.6, with 'T' and
// 'Z' in upper case). time.Parse alone would also take a comma before the
// fraction.
var rfc3339 = regexp.MustCompile(`^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]+)?(Z|[+-][0-9]{2}:[0-9]{2})$`)

// ParseCreatedAt parses s as the envelope's created_at, by Decode's rule:
// an RFC 3339 time such as 2025-01-02T15:04:05Z, not the zero time. Errors
// wrap ErrInvalid.
func ParseCreatedAt(s string) (time.Time, error) {
	t, err := time.Parse(time.RFC3339, s)
	if err != nil || !rfc3339.MatchString(s) {
		return time.Time{}, invalidf("field \"created_at\": %q is not an RFC 3339 time such as 2025-01-02T15:04:05Z", clip(s))
	}
	if t.IsZero() {
		return time.Time{}, invalidf("field \"created_at\": %q is the zero time; omit the field instead", s)
	}
	return t, nil
}

func invalidf(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, args...))
}

// CheckSubject returns an error wrapping ErrToolMismatch unless the
// envelope's tool is subjectTool, the last token of the subject the intent
// arrived on.
func (e *Envelope) CheckSubject(subjectTool string) error {
	if e.Tool != subjectTool {
		return fmt.Errorf("%w: the envelope names tool %q, the subject tool %q", ErrToolMismatch, e.Tool, clip(subjectTool))
	}
	return nil
}

// MarshalJSON writes the envelope as the protocol's JSON object: tool, args
// ("{}" when nil), then session, key, call_id and created_at (RFC 3339 with
// the time's own offset and any fraction of a second) only when set.
func (e Envelope) MarshalJSON() ([]byte, error) {
	b := []byte(`{"tool":`)
	b = AppendCanonicalString(b, e.Tool)
	b = append(b, `,"args":`...)
	if len(e.Args) == 0 {
		b = append(b, "{}"...)
	} else {
		b = append(b, e.Args...)
	}
	for _, f := range []struct{ name, val string }{
		{"session", e.Session}, {"key", e.Key}, {"call_id", e.CallID},
	} {
		if f.val != "" {
			b = append(b, ',')
			b = AppendCanonicalString(b, f.name)
			b = append(b, ':')
			b = AppendCanonicalString(b, f.val)
		}
	}
	if !e.CreatedAt.IsZero() {
		if y := e.CreatedAt.Year(); y < 0 || y > 9999 {
			return nil, fmt.Errorf("%w: created_at year %d is outside RFC 3339's 0000-9999", ErrInvalid, y)
		}
		b = append(b, `,"created_at":`...)
		b = AppendCanonicalString(b, e.CreatedAt.Format(time.RFC3339Nano))
	}
	return append(b, '}'), nil
}

// UnmarshalJSON decodes data with Decode and the default Limits, so that
// json.Unmarshal into an Envelope applies the same strict rules.
func (e *Envelope) UnmarshalJSON(data []byte) error {
	env, err := Decode(data, Limits{})
	if err != nil {
		return err
	}
	*e = *env
	return nil
}
