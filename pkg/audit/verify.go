package audit

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"time"
)

// BreakKind is what is wrong where a trail's verification stops.
type BreakKind string

// Kinds of breaks.
const (
	// BreakMalformed: the line is not an entry (not JSON, not canonical
	// JSON's rules, members missing).
	BreakMalformed BreakKind = "malformed"
	// BreakEdited: an entry's digest is not the one the next entry names:
	// the entry (or the next one's prev) was changed.
	BreakEdited BreakKind = "edited"
	// BreakDropped: positions are missing from the partition's chain.
	BreakDropped BreakKind = "dropped"
	// BreakReordered: an entry is out of its place (or repeated).
	BreakReordered BreakKind = "reordered"
	// BreakBadSignature: an event's or a seal's signature does not
	// verify: the signed bytes were changed, or another key signed them.
	BreakBadSignature BreakKind = "bad_signature"
	// BreakUnknownSigner: a signature's key is not among the keys given.
	BreakUnknownSigner BreakKind = "unknown_signer"
	// BreakKeyNotValid: a signature's key is not valid at the event's time.
	BreakKeyNotValid BreakKind = "key_not_valid"
	// BreakUnsealed: a partition's last entries carry no seal: nothing
	// vouches for them (every append ends with a sealed entry).
	BreakUnsealed BreakKind = "unsealed"
)

// Break is the first place where a trail fails to verify.
type Break struct {
	Line      int       // 1-based line of the export
	Partition int       // -1 when the line has none
	Pos       uint64    // 0 when the line has none
	Kind      BreakKind // what is wrong
	Detail    string    // how
}

func (b *Break) Error() string {
	return fmt.Sprintf("line %d (partition %d, position %d): %s: %s", b.Line, b.Partition, b.Pos, b.Kind, b.Detail)
}

// Gap is a gap entry found in a trail: events its writer dropped.
type Gap struct {
	Partition int
	Pos       uint64
	Holder    string
	Dropped   uint64
	From, To  time.Time
}

// PartitionReport is what a verification found of one partition's chain.
type PartitionReport struct {
	Partition int
	// First and Last are the first and last positions read: a chain read
	// from its beginning starts at 1 (a later start means older entries
	// expired or were not exported).
	First, Last uint64
	Entries     int
	// Head is the digest of the last entry: a later export of the same
	// chain must contain an entry with this digest at position Last (to
	// detect a trail cut short, compare heads over time).
	Head string
}

// Report is the result of Verify.
type Report struct {
	Entries    int
	Partitions []PartitionReport // by partition
	Gaps       []Gap
	Signers    []string // the key ids that signed, sorted
	// Break is the first failure; nil when the whole trail verified.
	Break *Break
}

// chainState is a partition's chain as verified so far.
type chainState struct {
	report       PartitionReport
	line         int    // of the last entry
	unsealedFrom uint64 // first position since the last seal; 0: none
}

// Verify checks a trail (JSON lines of entries, as an export writes them):
// every event signature and every seal with keys, and each partition's
// chain — positions in order, none missing, each entry's prev the digest of
// the one before, the last one sealed. Lines of different partitions may
// interleave. It stops at the first break and reports it in Report.Break;
// an error is returned only when the trail cannot be read. open is called
// twice, and must give the same lines each time: the first pass indexes
// positions, so that a missing position is told from one out of its place.
func Verify(open func() (io.ReadCloser, error), keys *KeySet) (*Report, error) {
	positions, err := indexPositions(open)
	if err != nil {
		return nil, err
	}
	rc, err := open()
	if err != nil {
		return nil, err
	}
	defer func() { _ = rc.Close() }()
	v := &verifier{keys: keys, positions: positions, chains: map[int]*chainState{}, signers: map[string]bool{}, report: &Report{}}
	err = eachLine(rc, func(n int, line []byte) bool {
		v.report.Break = v.line(n, line)
		return v.report.Break == nil
	})
	if err != nil {
		return nil, err
	}
	if v.report.Break == nil {
		v.report.Break = v.finish()
	}
	for _, c := range v.chains {
		v.report.Partitions = append(v.report.Partitions, c.report)
	}
	slices.SortFunc(v.report.Partitions, func(a, b PartitionReport) int { return a.Partition - b.Partition })
	for id := range v.signers {
		v.report.Signers = append(v.report.Signers, id)
	}
	slices.Sort(v.report.Signers)
	return v.report, nil
}

// maxLine bounds one line of a trail: an entry holds one event.
const maxLine = 4 << 20

// eachLine calls f with each non-empty line of r and its 1-based number,
// until f returns false.
func eachLine(r io.Reader, f func(n int, line []byte) bool) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), maxLine)
	for n := 1; sc.Scan(); n++ {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue
		}
		if !f(n, line) {
			return nil
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("audit: read trail: %w", err)
	}
	return nil
}

// indexPositions reads every line's partition and position (lines that do
// not parse are left to the second pass), sorted per partition.
func indexPositions(open func() (io.ReadCloser, error)) (map[int][]uint64, error) {
	rc, err := open()
	if err != nil {
		return nil, err
	}
	defer func() { _ = rc.Close() }()
	idx := map[int][]uint64{}
	err = eachLine(rc, func(_ int, line []byte) bool {
		var at struct {
			Partition int    `json:"partition"`
			Pos       uint64 `json:"pos"`
		}
		if json.Unmarshal(line, &at) == nil {
			idx[at.Partition] = append(idx[at.Partition], at.Pos)
		}
		return true
	})
	for _, ps := range idx {
		slices.Sort(ps)
	}
	return idx, err
}

type verifier struct {
	keys      *KeySet
	positions map[int][]uint64
	chains    map[int]*chainState
	signers   map[string]bool
	report    *Report
}

// line verifies one entry; the break it finds, if any.
func (v *verifier) line(n int, line []byte) *Break {
	pe, err := parseEntry(line)
	if err != nil {
		return &Break{Line: n, Partition: -1, Kind: BreakMalformed, Detail: err.Error()}
	}
	at := func(kind BreakKind, format string, args ...any) *Break {
		return &Break{Line: n, Partition: pe.Partition, Pos: pe.Pos, Kind: kind, Detail: fmt.Sprintf(format, args...)}
	}
	// The event: signed ones verify by themselves.
	var ev Event
	if hasMember(pe.Event, "sig") {
		ev, err = VerifyEvent(pe.Event, v.keys)
		if err == nil {
			v.signers[ev.Signer] = true
		}
	} else {
		ev, err = decodeEvent(pe.Event)
	}
	if err != nil {
		return at(breakKind(err), "event: %v", err)
	}
	// Its place in the chain.
	c := v.chains[pe.Partition]
	if c == nil {
		c = &chainState{report: PartitionReport{Partition: pe.Partition, First: pe.Pos}}
		v.chains[pe.Partition] = c
	} else {
		want := c.report.Last + 1
		switch {
		case pe.Pos < want:
			return at(BreakReordered, "position %d comes after position %d (line %d): entries were moved or repeated", pe.Pos, c.report.Last, c.line)
		case pe.Pos > want && v.present(pe.Partition, want):
			return at(BreakReordered, "position %d comes before position %d, which is later in the trail: entries were moved", pe.Pos, want)
		case pe.Pos > want:
			missing := fmt.Sprintf("position %d is", want)
			if pe.Pos-want > 1 {
				missing = fmt.Sprintf("positions %d to %d are", want, pe.Pos-1)
			}
			return at(BreakDropped, "%s missing: the chain goes from %d (line %d) to %d", missing, c.report.Last, c.line, pe.Pos)
		case pe.Prev != c.report.Head:
			return &Break{Line: c.line, Partition: pe.Partition, Pos: c.report.Last, Kind: BreakEdited,
				Detail: fmt.Sprintf("the entry's digest is %s, but position %d (line %d) names %s as its predecessor's: the entry (or that prev) was changed",
					c.report.Head, pe.Pos, n, pe.Prev)}
		}
	}
	// The seal vouches for it and every unsealed entry before it.
	if pe.Seal != nil {
		if err := verify(v.keys, pe.Seal.Signer, ev.At, pe.unsealed, pe.Seal.Sig); err != nil {
			return at(breakKind(err), "seal: %v", err)
		}
		v.signers[pe.Seal.Signer] = true
		c.unsealedFrom = 0
	} else if c.unsealedFrom == 0 {
		c.unsealedFrom = pe.Pos
	}
	if ev.Kind == KindGap {
		v.report.Gaps = append(v.report.Gaps, Gap{Partition: pe.Partition, Pos: pe.Pos, Holder: ev.Holder, Dropped: ev.Dropped, From: ev.From, To: ev.To})
	}
	c.report.Last, c.report.Head, c.line = pe.Pos, pe.digest, n
	c.report.Entries++
	v.report.Entries++
	return nil
}

// finish reports a partition whose last entries no seal vouches for.
func (v *verifier) finish() *Break {
	parts := make([]int, 0, len(v.chains))
	for p := range v.chains {
		parts = append(parts, p)
	}
	slices.Sort(parts)
	for _, p := range parts {
		if c := v.chains[p]; c.unsealedFrom != 0 {
			return &Break{Line: c.line, Partition: p, Pos: c.report.Last, Kind: BreakUnsealed,
				Detail: fmt.Sprintf("positions %d to %d carry no seal: the trail ends inside an append (its sealed last entry was dropped, or its seal removed)", c.unsealedFrom, c.report.Last)}
		}
	}
	return nil
}

// present reports whether the trail has position pos of partition p.
func (v *verifier) present(p int, pos uint64) bool {
	_, found := slices.BinarySearch(v.positions[p], pos)
	return found
}

// hasMember reports whether the JSON object obj has a top-level member
// name.
func hasMember(obj []byte, name string) bool {
	var m map[string]json.RawMessage
	if json.Unmarshal(obj, &m) != nil {
		return false
	}
	_, ok := m[name]
	return ok
}

// breakKind is the break an error of a signature check is.
func breakKind(err error) BreakKind {
	switch {
	case errors.Is(err, ErrUnknownSigner):
		return BreakUnknownSigner
	case errors.Is(err, ErrKeyNotValid):
		return BreakKeyNotValid
	case errors.Is(err, ErrBadSignature):
		return BreakBadSignature
	}
	return BreakMalformed
}
