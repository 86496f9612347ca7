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

	"github.com/idemgate/idemgate/pkg/intent"
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
	// BreakNoCheckpoint: the trail holds no checkpoint, and none was
	// given: nothing says where it must end (Partial accepts that).
	BreakNoCheckpoint BreakKind = "no_checkpoint"
	// BreakShort: a partition's chain stops short of its checkpoint.
	BreakShort BreakKind = "short"
	// BreakMissingPartition: a checkpoint names a partition the trail holds
	// none of, or the checkpoints leave out a partition of their count.
	BreakMissingPartition BreakKind = "missing_partition"
	// BreakCheckpoint: the trail's entry at a checkpoint's size is not the
	// checkpoint's head (another chain, or a rewritten one), or the trail
	// goes on past the checkpoint it ends with.
	BreakCheckpoint BreakKind = "checkpoint"
	// BreakInstallation: a chain's first link, or a checkpoint, is another
	// installation's.
	BreakInstallation BreakKind = "other_installation"
)

// VerifyOption is a knob of Verify.
type VerifyOption func(*verifyOptions)

type verifyOptions struct {
	checkpoints []Checkpoint
	from        []Checkpoint
	partial     bool
}

// WithCheckpoints checks the trail against checkpoints kept apart from it
// (an auditor's copy): for each, the trail must reach its size and hold
// its head there. The trail's own checkpoint is checked as well.
func WithCheckpoints(cps []Checkpoint) VerifyOption {
	return func(o *verifyOptions) { o.checkpoints = cps }
}

// From verifies only what follows checkpoints already verified: of each
// partition they name, the entries up to the checkpoint's size are skipped,
// but the one at its size (when the trail holds it) must be its head, and
// the first entry after it must link to it.
func From(cps []Checkpoint) VerifyOption { return func(o *verifyOptions) { o.from = cps } }

// Partial accepts a trail that holds no checkpoint, or stops short of it
// or lacks partitions it names (an export of one partition, or --until):
// what it holds is verified, and a head it holds must be the checkpoint's.
func Partial() VerifyOption { return func(o *verifyOptions) { o.partial = true } }

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
	// chain must contain an entry with this digest at position Last.
	Head string
	// Unbound: the chain's first link (position 1) names no installation
	// (its prev is ""): it was written before chains were bound to their
	// installation.
	Unbound bool
	// Skipped counts the entries not verified because a checkpoint given
	// to From vouches for them.
	Skipped int
}

// Report is the result of Verify.
type Report struct {
	Entries    int
	Partitions []PartitionReport // by partition
	Gaps       []Gap
	Signers    []string // the key ids that signed, sorted
	// Installation is the installation the checkpoints name ("" without
	// any).
	Installation string
	// Checkpoints are those the trail held and was checked against (its
	// last line); none for a trail without.
	Checkpoints []Checkpoint
	// Break is the first failure; nil when the whole trail verified.
	Break *Break
}

// chainState is a partition's chain as verified so far.
type chainState struct {
	report       PartitionReport
	line         int    // of the last entry
	unsealedFrom uint64 // first position since the last seal; 0: none
}

// Verify checks a trail (JSON lines of entries, as an export writes them,
// its last line the checkpoints it was taken against): every event
// signature and every seal with keys, and each partition's chain —
// positions in order, none missing, each entry's prev the digest of the
// one before, the first one's its installation's genesis (GenesisDigest),
// the last one sealed — and its edges: the checkpoints' signatures, and
// that each partition they name reaches their size with their head. Lines
// of different partitions may interleave. It stops at the first break and
// reports it in Report.Break; an error is returned only when the trail
// cannot be read. open is called twice, and must give the same lines each
// time: the first pass indexes positions, so that a missing position is
// told from one out of its place.
func Verify(open func() (io.ReadCloser, error), keys *KeySet, opts ...VerifyOption) (*Report, error) {
	var o verifyOptions
	for _, opt := range opts {
		opt(&o)
	}
	idx, err := indexPositions(open)
	if err != nil {
		return nil, err
	}
	v := &verifier{keys: keys, opts: o, positions: idx.positions, chains: map[int]*chainState{}, signers: map[string]bool{},
		report: &Report{}, at: map[int]map[uint64]checkAt{}, from: map[int]Checkpoint{}}
	v.report.Break = v.checkpoints(idx)
	if v.report.Break == nil {
		rc, err := open()
		if err != nil {
			return nil, err
		}
		defer func() { _ = rc.Close() }()
		err = eachLine(rc, func(n int, line []byte) bool {
			if n == idx.cpLine {
				return true
			}
			v.report.Break = v.line(n, line)
			return v.report.Break == nil
		})
		if err != nil {
			return nil, err
		}
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

// eachLine calls f with each non-empty line of r (as it is: a line ends at
// "\n") and its 1-based number, until f returns false.
func eachLine(r io.Reader, f func(n int, line []byte) bool) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), maxLine)
	sc.Split(splitLines)
	for n := 1; sc.Scan(); n++ {
		line := sc.Bytes()
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

// splitLines is bufio.ScanLines without its dropping of a "\r" before
// the "\n": a line is its bytes as they are.
func splitLines(data []byte, atEOF bool) (int, []byte, error) {
	if i := bytes.IndexByte(data, '\n'); i >= 0 {
		return i + 1, data[:i], nil
	}
	if atEOF && len(data) > 0 {
		return len(data), data, nil
	}
	return 0, nil, nil
}

// trailIndex is what the first pass reads: every line's partition and
// position (lines that do not parse are left to the second pass), sorted
// per partition, and the checkpoint line.
type trailIndex struct {
	positions map[int][]uint64
	cpLine    int    // 0: none
	cp        []byte // its bytes
	lastLine  int    // of an entry
	cpTwice   int    // a second checkpoint line
}

func indexPositions(open func() (io.ReadCloser, error)) (*trailIndex, error) {
	rc, err := open()
	if err != nil {
		return nil, err
	}
	defer func() { _ = rc.Close() }()
	idx := &trailIndex{positions: map[int][]uint64{}}
	err = eachLine(rc, func(n int, line []byte) bool {
		if isCheckpointLine(line) {
			if idx.cpLine != 0 && idx.cpTwice == 0 {
				idx.cpTwice = n
			}
			idx.cpLine, idx.cp = n, bytes.Clone(line)
			return true
		}
		idx.lastLine = n
		var at struct {
			Partition int    `json:"partition"`
			Pos       uint64 `json:"pos"`
		}
		if json.Unmarshal(line, &at) == nil {
			idx.positions[at.Partition] = append(idx.positions[at.Partition], at.Pos)
		}
		return true
	})
	for _, ps := range idx.positions {
		slices.Sort(ps)
	}
	return idx, err
}

// checkAt is a head a checkpoint says the chain holds at a position.
type checkAt struct{ head string }

type verifier struct {
	keys      *KeySet
	sigs      sigCache
	opts      verifyOptions
	positions map[int][]uint64
	chains    map[int]*chainState
	signers   map[string]bool
	report    *Report
	// installation is the checkpoints' ("" without any).
	installation string
	// own are the trail's checkpoints, given those passed WithCheckpoints.
	own, given []Checkpoint
	// at are the heads the checkpoints name, by partition and position.
	at   map[int]map[uint64]checkAt
	from map[int]Checkpoint
}

// checkpoints checks the trail's checkpoints and those given: their
// signatures, one installation, and (unless partial) that the trail holds
// one.
func (v *verifier) checkpoints(idx *trailIndex) *Break {
	cpBreak := func(line int, c Checkpoint, kind BreakKind, format string, args ...any) *Break {
		return &Break{Line: line, Partition: c.Partition, Pos: c.Size, Kind: kind, Detail: fmt.Sprintf(format, args...)}
	}
	switch {
	case idx.cpTwice != 0:
		return &Break{Line: idx.cpTwice, Partition: -1, Kind: BreakMalformed, Detail: "a second checkpoint line: an export ends with one"}
	case idx.cpLine != 0 && idx.lastLine > idx.cpLine:
		return &Break{Line: idx.lastLine, Partition: -1, Kind: BreakMalformed,
			Detail: fmt.Sprintf("an entry after the checkpoint line (line %d): an export ends with its checkpoint", idx.cpLine)}
	case idx.cpLine == 0 && len(v.opts.checkpoints) == 0 && !v.opts.partial:
		return &Break{Line: idx.lastLine, Partition: -1, Kind: BreakNoCheckpoint,
			Detail: "the trail ends with no checkpoint, and none was given: nothing says where each partition must end (export with a version that writes one, give one with --checkpoint, or accept a partial trail with --partial)"}
	}
	if idx.cpLine != 0 {
		cps, err := ParseCheckpoints(idx.cp)
		if err != nil {
			return &Break{Line: idx.cpLine, Partition: -1, Kind: BreakMalformed, Detail: err.Error()}
		}
		if !bytes.Equal(MarshalCheckpoints(cps), idx.cp) {
			return &Break{Line: idx.cpLine, Partition: -1, Kind: BreakMalformed,
				Detail: "the checkpoint line is not its canonical bytes (RFC 8785, checkpoints by partition)"}
		}
		v.own = cps
		v.report.Checkpoints = cps
	}
	v.given = v.opts.checkpoints
	sets := []struct {
		line int
		cps  []Checkpoint
		what string
	}{{idx.cpLine, v.own, "the trail's checkpoint"}, {0, v.given, "the checkpoint given"}, {0, v.opts.from, "the checkpoint verified before"}}
	for _, set := range sets {
		for _, c := range set.cps {
			if err := c.Verify(v.keys); err != nil {
				return cpBreak(set.line, c, breakKind(err), "%s: %v", set.what, err)
			}
			v.signers[c.Signer] = true
			if v.installation == "" {
				v.installation = c.Installation
			}
			if c.Installation != v.installation {
				return cpBreak(set.line, c, BreakInstallation, "%s is of installation %s; another checkpoint is of %s", set.what, c.Installation, v.installation)
			}
		}
	}
	v.report.Installation = v.installation
	for _, set := range sets[:2] {
		for _, c := range set.cps {
			if c.Size == 0 {
				continue
			}
			m := v.at[c.Partition]
			if m == nil {
				m = map[uint64]checkAt{}
				v.at[c.Partition] = m
			}
			if prev, ok := m[c.Size]; ok && prev.head != c.Head {
				return cpBreak(set.line, c, BreakCheckpoint, "%s names head %s at position %d, another names %s: they are of two chains", set.what, c.Head, c.Size, prev.head)
			}
			m[c.Size] = checkAt{head: c.Head}
		}
	}
	for _, c := range v.opts.from {
		v.from[c.Partition] = c
		v.fromChain(c.Partition, c, 0)
	}
	return nil
}

// line verifies one entry; the break it finds, if any.
func (v *verifier) line(n int, line []byte) *Break {
	if len(v.from) > 0 {
		// Entries a checkpoint verified before vouches for: skipped, but
		// for the one at its size.
		var loc struct {
			Partition int    `json:"partition"`
			Pos       uint64 `json:"pos"`
		}
		if json.Unmarshal(line, &loc) == nil {
			if f, ok := v.from[loc.Partition]; ok && loc.Pos < f.Size {
				v.fromChain(loc.Partition, f, n).report.Skipped++
				return nil
			}
		}
	}
	pe, err := parseEntry(line)
	if err != nil {
		return &Break{Line: n, Partition: -1, Kind: BreakMalformed, Detail: err.Error()}
	}
	if !canonicalAlready(line) {
		if canon, err := intent.Canonicalize(line); err != nil || !bytes.Equal(canon, line) {
			return &Break{Line: n, Partition: pe.Partition, Pos: pe.Pos, Kind: BreakMalformed,
				Detail: "the line is not the canonical bytes of its entry (RFC 8785): its digest and seal are of those bytes only"}
		}
	}
	at := func(kind BreakKind, format string, args ...any) *Break {
		return &Break{Line: n, Partition: pe.Partition, Pos: pe.Pos, Kind: kind, Detail: fmt.Sprintf(format, args...)}
	}
	c := v.chains[pe.Partition]
	if f, ok := v.from[pe.Partition]; ok && pe.Pos <= f.Size {
		c = v.fromChain(pe.Partition, f, n)
		if pe.Pos == f.Size && pe.digest != f.Head {
			return at(BreakCheckpoint, "the entry's digest is %s, but the checkpoint verified before (of %s) names %s at this position: the chain was rewritten since",
				pe.digest, f.At.UTC().Format(time.RFC3339Nano), f.Head)
		}
		c.report.Skipped++
		return nil
	}
	// The event: signed ones verify by themselves.
	var ev Event
	if bytes.Contains(pe.Event, []byte(`"sig":`)) && hasMember(pe.Event, "sig") {
		ev, err = verifyEvent(pe.Event, v.keys, &v.sigs)
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
	if c == nil {
		if f, ok := v.from[pe.Partition]; ok {
			c = &chainState{report: PartitionReport{Partition: pe.Partition, First: f.Size + 1, Last: f.Size, Head: f.Head}}
		} else {
			c = &chainState{report: PartitionReport{Partition: pe.Partition, First: pe.Pos}}
		}
		v.chains[pe.Partition] = c
	}
	if c.report.Entries == 0 && c.report.Last == 0 && pe.Pos == c.report.First {
		// The chain's first entry read: at position 1, its first link.
		if pe.Pos == 1 {
			switch genesis := GenesisDigest(v.installation, pe.Partition); {
			case pe.Prev == "":
				c.report.Unbound = true
			case v.installation == "":
			case pe.Prev != genesis:
				return at(BreakInstallation, "the chain's first link is %s, not installation %s's (%s): the partition is another installation's", pe.Prev, v.installation, genesis)
			}
		}
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
			if c.report.Entries == 0 {
				return at(BreakCheckpoint, "the entry names %s as its predecessor's digest, but the checkpoint verified before names %s at position %d: the chain was rewritten since",
					pe.Prev, c.report.Head, c.report.Last)
			}
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
	// A head a checkpoint names here.
	if want, ok := v.at[pe.Partition][pe.Pos]; ok && want.head != pe.digest {
		return at(BreakCheckpoint, "the entry's digest is %s, but the checkpoint names %s at this position: the chain is not the one the checkpoint's signer saw",
			pe.digest, want.head)
	}
	if ev.Kind == KindGap {
		v.report.Gaps = append(v.report.Gaps, Gap{Partition: pe.Partition, Pos: pe.Pos, Holder: ev.Holder, Dropped: ev.Dropped, From: ev.From, To: ev.To})
	}
	c.report.Last, c.report.Head, c.line = pe.Pos, pe.digest, n
	c.report.Entries++
	v.report.Entries++
	return nil
}

// finish reports a partition whose last entries no seal vouches for, and
// the trail's edges that do not meet its checkpoints.
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
	if b := v.edges(v.own, true); b != nil {
		return b
	}
	return v.edges(v.given, false)
}

// verifiedBefore reports whether a checkpoint given to From vouches for
// the start of partition p's chain.
func (v *verifier) verifiedBefore(p int) bool {
	_, ok := v.from[p]
	return ok
}

// fromChain is partition p's chain state, started at the checkpoint f
// verified before (line: where the trail reaches it).
func (v *verifier) fromChain(p int, f Checkpoint, line int) *chainState {
	c := v.chains[p]
	if c == nil {
		c = &chainState{report: PartitionReport{Partition: p, First: f.Size + 1, Last: f.Size, Head: f.Head}, line: line}
		v.chains[p] = c
	}
	return c
}

// edges checks each partition's end against a set of checkpoints (own:
// the trail's, which it must end with).
func (v *verifier) edges(cps []Checkpoint, own bool) *Break {
	if len(cps) == 0 {
		return nil
	}
	what := "the checkpoint given"
	if own {
		what = "the trail's checkpoint"
	}
	named := map[int]bool{}
	for _, cp := range cps {
		named[cp.Partition] = true
		c := v.chains[cp.Partition]
		switch {
		case c == nil && cp.Size > 0 && !v.opts.partial:
			return &Break{Partition: cp.Partition, Pos: cp.Size, Kind: BreakMissingPartition,
				Detail: fmt.Sprintf("%s names partition %d with %d entries (head %s); the trail holds none of it", what, cp.Partition, cp.Size, cp.Head)}
		case c == nil:
		case c.report.Last < cp.Size && !v.opts.partial:
			return &Break{Line: c.line, Partition: cp.Partition, Pos: c.report.Last, Kind: BreakShort,
				Detail: fmt.Sprintf("the chain ends at position %d; %s commits to %d entries (head %s): the trail was cut short", c.report.Last, what, cp.Size, cp.Head)}
		case own && cp.First > 0 && c.report.First > cp.First && !v.opts.partial && !v.verifiedBefore(cp.Partition):
			return &Break{Partition: cp.Partition, Pos: cp.First, Kind: BreakDropped,
				Detail: fmt.Sprintf("the chain starts at position %d; %s says the stream held it from %d: the first entries were dropped (an export --from a checkpoint verifies with --from; one --since, with --partial)",
					c.report.First, what, cp.First)}
		case own && c.report.Last > cp.Size:
			return &Break{Line: c.line, Partition: cp.Partition, Pos: c.report.Last, Kind: BreakCheckpoint,
				Detail: fmt.Sprintf("the chain goes on to position %d past %s, at %d: the trail was not cut at its checkpoint", c.report.Last, what, cp.Size)}
		}
	}
	if v.opts.partial {
		return nil
	}
	for p := range cps[0].Partitions {
		if !named[p] {
			return &Break{Partition: p, Kind: BreakMissingPartition,
				Detail: fmt.Sprintf("%s is of %d partitions and names none of partition %d", what, cps[0].Partitions, p)}
		}
	}
	for p, c := range v.chains {
		if p >= cps[0].Partitions {
			return &Break{Line: c.line, Partition: p, Pos: c.report.Last, Kind: BreakMissingPartition,
				Detail: fmt.Sprintf("the trail holds partition %d; %s is of %d partitions", p, what, cps[0].Partitions)}
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
