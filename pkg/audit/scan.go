package audit

import (
	"bytes"
	"crypto/sha256"
	"time"

	"github.com/idemgate/idemgate/pkg/intent"
)

// The verifier's fast path reads a trail line in one pass that both checks
// its canonical form (intent.IsCanonical's rules) and finds its members, where
// encoding/json would read it several times. It reads only what it is sure
// of: an entry as the writers make it, and events whose members decode as
// encoding/json decodes them. For anything else it says so, and the line
// is read the long way (parseEntry, decodeEvent, verifyEvent), which finds
// the same break it always found.

// span is a member of a canonical JSON object: its name, where the member
// starts (its name's quote), and its value's bytes [val, end) in the
// object's data.
type span struct {
	name          []byte
	at, val, end  int
	nested, nestN int // for the entry's "event" and "seal": their members in lineScan's nested spans
}

// lineScan is one line's top-level members and, for the members "event"
// and "seal" that are objects, theirs. Its slices are reused line after
// line.
type lineScan struct {
	top    []span
	nested []span
}

// scan reads line: true when it is a canonical JSON object (intent.IsCanonical
// says so of it) and nothing else, its members then in s.
func (s *lineScan) scan(line []byte) bool {
	s.top, s.nested = s.top[:0], s.nested[:0]
	if len(line) < 2 || line[0] != '{' {
		return false
	}
	c := intent.ScanCanonical(line, 0)
	if more, ok := c.Open(); !more {
		return ok && c.Offset() == len(line)
	}
	var prev []byte
	for {
		at := c.Offset()
		name, ok := c.Name(prev)
		if !ok {
			return false
		}
		prev = name
		sp := span{name: name, at: at, val: c.Offset()}
		if sp.val < len(line) && line[sp.val] == '{' && (string(name) == "event" || string(name) == "seal") {
			sp.nested = len(s.nested)
			if !s.object(&c, 1) {
				return false
			}
			sp.nestN = len(s.nested) - sp.nested
		} else if !c.Value(1) {
			return false
		}
		sp.end = c.Offset()
		s.top = append(s.top, sp)
		more, ok := c.Next('}')
		if !ok {
			return false
		}
		if !more {
			return c.Offset() == len(line)
		}
	}
}

// object reads the object at c (at depth, as c.Value would), appending
// its members to s.nested, their offsets in c's data.
func (s *lineScan) object(c *intent.CanonicalScanner, depth int) bool {
	if more, ok := c.Open(); !more {
		return ok
	}
	var prev []byte
	for {
		at := c.Offset()
		name, ok := c.Name(prev)
		if !ok {
			return false
		}
		prev = name
		val := c.Offset()
		if !c.Value(depth + 1) {
			return false
		}
		s.nested = append(s.nested, span{name: name, at: at, val: val, end: c.Offset()})
		more, ok := c.Next('}')
		if !more {
			return ok
		}
	}
}

// plainString is the text of the canonical JSON string v when it holds no
// escape; ok is false for any other value.
func plainString(v []byte) (text []byte, ok bool) {
	if len(v) < 2 || v[0] != '"' || bytes.IndexByte(v, '\\') >= 0 {
		return nil, false
	}
	return v[1 : len(v)-1], true
}

// plainInt is the canonical JSON integer v (at most 15 digits, as
// intent.IsCanonical takes them); ok is false for any other value.
func plainInt(v []byte) (n int64, ok bool) {
	if len(v) == 0 {
		return 0, false
	}
	neg := v[0] == '-'
	digits := v
	if neg {
		digits = v[1:]
	}
	if len(digits) == 0 || len(digits) > 15 {
		return 0, false
	}
	for _, d := range digits {
		if d < '0' || d > '9' {
			return 0, false
		}
		n = n*10 + int64(d-'0')
	}
	if neg {
		n = -n
	}
	return n, true
}

// hasUpper reports whether name holds an ASCII capital: encoding/json
// matches member names to fields regardless of case, so such a name may
// stand for a field.
func hasUpper(name []byte) bool {
	for _, c := range name {
		if c >= 'A' && c <= 'Z' {
			return true
		}
	}
	return false
}

// quickLoc is what json.Unmarshal of line into a partition and a position
// gives, for a line s scanned (s.scan was true): ok is false where the
// fast path is not sure (it does not say the line has no position).
func (s *lineScan) quickLoc(line []byte) (partition int, pos uint64, ok bool) {
	for _, m := range s.top {
		switch v := line[m.val:m.end]; {
		case string(m.name) == "partition":
			n, ok := plainInt(v)
			if !ok {
				return 0, 0, false
			}
			partition = int(n)
		case string(m.name) == "pos":
			n, ok := plainInt(v)
			if !ok || n < 0 {
				return 0, 0, false
			}
			pos = uint64(n)
		case hasUpper(m.name):
			return 0, 0, false
		}
	}
	return partition, pos, true
}

// quickEntry is parseEntry's entry of a line s scanned, without its
// digest: ok only for an entry with exactly the members event (an
// object), partition, pos (not 0), prev and, optionally, seal (exactly
// signer and sig, neither empty), its strings without escapes.
type quickEntry struct {
	partition  int
	pos        uint64
	prev       []byte
	event      []span // its members, offsets in line
	sealSigner []byte
	sealSig    []byte
	sealAt     int // where the comma before "seal" is; 0: no seal
}

func (s *lineScan) quickEntry(line []byte) (e quickEntry, ok bool) {
	t := s.top
	if len(t) != 4 && len(t) != 5 || string(t[0].name) != "event" || string(t[1].name) != "partition" ||
		string(t[2].name) != "pos" || string(t[3].name) != "prev" || line[t[0].val] != '{' {
		return e, false
	}
	e.event = s.nested[t[0].nested : t[0].nested+t[0].nestN]
	p, ok := plainInt(line[t[1].val:t[1].end])
	if !ok || p < 0 {
		return e, false
	}
	pos, ok := plainInt(line[t[2].val:t[2].end])
	if !ok || pos <= 0 {
		return e, false
	}
	e.partition, e.pos = int(p), uint64(pos)
	if e.prev, ok = plainString(line[t[3].val:t[3].end]); !ok {
		return e, false
	}
	if len(t) == 5 {
		seal := t[4]
		if string(seal.name) != "seal" || line[seal.val] != '{' || seal.nestN != 2 {
			return e, false
		}
		ms := s.nested[seal.nested : seal.nested+2]
		if string(ms[0].name) != "sig" || string(ms[1].name) != "signer" {
			return e, false
		}
		sig, ok1 := plainString(line[ms[0].val:ms[0].end])
		signer, ok2 := plainString(line[ms[1].val:ms[1].end])
		if !ok1 || !ok2 || len(sig) == 0 || len(signer) == 0 {
			return e, false
		}
		e.sealSig, e.sealSigner, e.sealAt = sig, signer, seal.at-1
	}
	return e, true
}

// quickEvent is what decodeEvent (and, for a signed event, verifyEvent)
// needs of an event and gives of it.
type quickEvent struct {
	kind, holder, signer, sig []byte
	dropped                   uint64
	at, from, to              time.Time
	signed                    bool // it has a "sig" member
	proof                     []byte
	proofSpan, sigSpan        int // indexes in the event's members; -1: none
}

// eventField is how encoding/json decodes a member of Event.
type eventField int

const (
	fieldUnknown eventField = iota // ignored
	fieldString
	fieldInt
	fieldUint
	fieldTime
	fieldRaw
	fieldStrings
)

// eventFields are Event's members by name, as encoding/json decodes them.
func eventFieldOf(name []byte) eventField {
	switch string(name) {
	case "kind", "key", "tool", "session", "fingerprint", "holder", "status", "result_digest", "error_code", "error_digest",
		"record_fingerprint", "previous_holder", "reason", "op", "by", "effect", "destination", "forwarded_key", "args_digest",
		"signer", "sig":
		return fieldString
	case "v", "attempt", "attempts", "previous_attempt":
		return fieldInt
	case "intent_seq", "dropped":
		return fieldUint
	case "from", "to", "at":
		return fieldTime
	case "args":
		return fieldRaw
	case "proof":
		return fieldStrings
	}
	return fieldUnknown
}

// quickDecode is decodeEvent of the event of members ms (offsets in line),
// canonical JSON: ok only where it is sure to decode as decodeEvent does,
// without an error.
func quickDecode(line []byte, ms []span) (e quickEvent, ok bool) {
	e.proofSpan, e.sigSpan = -1, -1
	for i, m := range ms {
		v := line[m.val:m.end]
		switch eventFieldOf(m.name) {
		case fieldUnknown:
			if hasUpper(m.name) {
				return e, false
			}
		case fieldString:
			text, ok := plainString(v)
			if !ok {
				return e, false
			}
			switch string(m.name) {
			case "kind":
				e.kind = text
			case "holder":
				e.holder = text
			case "signer":
				e.signer = text
			case "sig":
				e.sig, e.signed, e.sigSpan = text, true, i
			}
		case fieldInt:
			if _, ok := plainInt(v); !ok {
				return e, false
			}
		case fieldUint:
			n, ok := plainInt(v)
			if !ok || n < 0 {
				return e, false
			}
			if string(m.name) == "dropped" {
				e.dropped = uint64(n)
			}
		case fieldTime:
			if v[0] != '"' {
				return e, false
			}
			var t time.Time
			if t.UnmarshalJSON(v) != nil {
				return e, false
			}
			switch string(m.name) {
			case "at":
				e.at = t
			case "from":
				e.from = t
			case "to":
				e.to = t
			}
		case fieldRaw:
		case fieldStrings:
			if v[0] != '[' {
				return e, false
			}
			e.proof, e.proofSpan = v, i
		}
	}
	if len(e.kind) == 0 || e.at.IsZero() {
		return e, false
	}
	return e, true
}

// quickLeaf is the Merkle leaf of the signed event of members ms (offsets
// in line, the event's object [start, end)): the leaf hash of its
// canonical JSON without "sig" and "proof". buf is scratch space.
func quickLeaf(line []byte, ms []span, e *quickEvent, buf []byte) ([32]byte, []byte) {
	buf = append(buf[:0], 0, '{')
	first := true
	for i, m := range ms {
		if i == e.sigSpan || i == e.proofSpan {
			continue
		}
		if !first {
			buf = append(buf, ',')
		}
		first = false
		buf = append(buf, line[m.at:m.end]...)
	}
	buf = append(buf, '}')
	return sha256.Sum256(buf), buf
}

// quickFold is fold of the leaf with the proof (a canonical JSON array):
// ok only for an array of strings that are each a proof step. Its nodes
// are hashed through memo.
func quickFold(leaf [32]byte, proof []byte, memo *nodeMemo) (root [32]byte, ok bool) {
	h := leaf
	if proof == nil {
		return h, true
	}
	// [] or ["<step>","<step>",...], each step L or R and 64 lowercase hex
	// digits: 67 bytes quoted.
	const quoted = 2 + 1 + 64
	if len(proof) == 2 {
		return h, proof[1] == ']'
	}
	rest := proof[1:]
	for {
		if len(rest) < quoted+1 || rest[0] != '"' || rest[quoted-1] != '"' {
			return h, false
		}
		var sib [32]byte
		for i, j := 0, 2; i < len(sib); i, j = i+1, j+2 {
			hi, lo := lowerHex[rest[j]], lowerHex[rest[j+1]]
			if hi > 0xf || lo > 0xf {
				return h, false
			}
			sib[i] = hi<<4 | lo
		}
		switch rest[1] {
		case 'L':
			h = memo.node(sib, h)
		case 'R':
			h = memo.node(h, sib)
		default:
			return h, false
		}
		switch rest[quoted] {
		case ',':
			rest = rest[quoted+1:]
		case ']':
			return h, len(rest) == quoted+1
		default:
			return h, false
		}
	}
}

// lowerHex is the value of each lowercase hex digit; 0xff for other bytes.
var lowerHex = func() (t [256]byte) {
	for i := range t {
		t[i] = 0xff
	}
	for c := byte('0'); c <= '9'; c++ {
		t[c] = c - '0'
	}
	for c := byte('a'); c <= 'f'; c++ {
		t[c] = c - 'a' + 10
	}
	return t
}()

// nodeMemo holds the Merkle nodes a worker hashed lately: receipts signed
// together share the nodes above their leaves, and lie close together in
// a trail. A nil memo holds none.
type nodeMemo struct{ nodes map[[64]byte][32]byte }

// nodeMemoSize bounds a nodeMemo.
const nodeMemoSize = 4096

// node is nodeHash(left, right).
func (m *nodeMemo) node(left, right [32]byte) [32]byte {
	if m == nil {
		return nodeHash(left, right)
	}
	var k [64]byte
	copy(k[:32], left[:])
	copy(k[32:], right[:])
	if h, ok := m.nodes[k]; ok {
		return h
	}
	h := nodeHash(left, right)
	if m.nodes == nil || len(m.nodes) >= nodeMemoSize {
		m.nodes = make(map[[64]byte][32]byte, nodeMemoSize)
	}
	m.nodes[k] = h
	return h
}
