package audit

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/idemgate/idemgate/pkg/intent"
)

// encoder writes the members of a JSON object in canonical form, its
// caller calling it in the order of the members' names; a zero value is
// left out.
type encoder struct {
	b    []byte
	more bool // a member was written
}

func (w *encoder) name(name string) {
	if w.more {
		w.b = append(w.b, ',')
	}
	w.more = true
	w.b = append(w.b, '"')
	w.b = append(w.b, name...)
	w.b = append(w.b, '"', ':')
}

func (w *encoder) str(name, v string) {
	if v != "" {
		w.name(name)
		w.b = intent.AppendCanonicalString(w.b, v)
	}
}

func (w *encoder) int(name string, v int64) {
	if v != 0 {
		w.name(name)
		w.b = strconv.AppendInt(w.b, v, 10)
	}
}

func (w *encoder) uint(name string, v uint64) {
	if v != 0 {
		w.name(name)
		w.b = strconv.AppendUint(w.b, v, 10)
	}
}

// time writes t as RFC 3339 in UTC with nanoseconds.
func (w *encoder) time(name string, t time.Time) {
	if !t.IsZero() {
		w.name(name)
		w.b = append(w.b, '"')
		w.b = t.UTC().AppendFormat(w.b, time.RFC3339Nano)
		w.b = append(w.b, '"')
	}
}

// raw writes canonical JSON as it is.
func (w *encoder) raw(name string, canonical []byte) {
	if len(canonical) > 0 {
		w.name(name)
		w.b = append(w.b, canonical...)
	}
}

// withoutMembers returns the canonical form of the JSON object data
// without the members names, and those members' values (by name; absent
// ones are not in it). data is checked as intent.Canonicalize checks it: a
// repeated member name, invalid UTF-8 or a number beyond ±2^53 is refused.
func withoutMembers(data []byte, names ...string) (canonical []byte, removed map[string]json.RawMessage, err error) {
	if canonical, removed, ok := quickWithout(data, names...); ok {
		return canonical, removed, nil
	}
	return slowWithout(data, names...)
}

// quickWithout is withoutMembers of data that is canonical already
// (intent.IsCanonical): its other members' bytes, as they are. ok is false
// for other data.
func quickWithout(data []byte, names ...string) (canonical []byte, removed map[string]json.RawMessage, ok bool) {
	if len(data) < 2 || data[0] != '{' || !intent.IsCanonical(data) {
		return nil, nil, false
	}
	removed = map[string]json.RawMessage{}
	if data[1] == '}' {
		return data, removed, true
	}
	out := make([]byte, 1, len(data))
	out[0] = '{'
	c := intent.ScanCanonical(data, 1)
	var prev []byte
	for {
		start := c.Offset()
		prev, _ = c.Name(prev)
		valueAt := c.Offset()
		c.Value(1)
		end := c.Offset()
		if slices.Contains(names, string(prev)) {
			removed[string(prev)] = data[valueAt:end:end]
		} else {
			if len(out) > 1 {
				out = append(out, ',')
			}
			out = append(out, data[start:end]...)
		}
		if more, _ := c.Next('}'); !more {
			return append(out, '}'), removed, true
		}
	}
}

// slowWithout is withoutMembers of any data.
func slowWithout(data []byte, names ...string) (canonical []byte, removed map[string]json.RawMessage, err error) {
	if _, err := intent.Canonicalize(data); err != nil {
		return nil, nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	var members map[string]json.RawMessage
	if err := json.Unmarshal(data, &members); err != nil || members == nil {
		return nil, nil, fmt.Errorf("%w: not a JSON object", ErrInvalid)
	}
	removed = map[string]json.RawMessage{}
	for _, name := range names {
		if v, ok := members[name]; ok {
			removed[name] = v
			delete(members, name)
		}
	}
	rest, err := json.Marshal(members)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	canonical, err = intent.Canonicalize(rest)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	return canonical, removed, nil
}
