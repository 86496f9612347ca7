package audit

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
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
	slow        bool // every line the long way: the fast path's reference
	workers     int  // goroutines preparing lines; 0: GOMAXPROCS
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
// cannot be read. Lines are read on GOMAXPROCS goroutines, and checked
// against their chains in the trail's order. open is called twice (a
// third time where a chain skips positions, to tell a missing position
// from one out of its place), and must give the same lines each time.
func Verify(open func() (io.ReadCloser, error), keys *KeySet, opts ...VerifyOption) (*Report, error) {
	var o verifyOptions
	for _, opt := range opts {
		opt(&o)
	}
	idx, err := indexTrail(open)
	if err != nil {
		return nil, err
	}
	v := &verifier{keys: keys, opts: o, open: open, chains: map[int]*chainState{}, signers: map[string]bool{},
		report: &Report{}, at: map[int]map[uint64]checkAt{}, from: map[int]Checkpoint{}}
	v.report.Break = v.checkpoints(idx)
	if v.report.Break == nil {
		rc, err := open()
		if err != nil {
			return nil, err
		}
		defer func() { _ = rc.Close() }()
		if err := v.verifyLines(rc, idx.cpLine); err != nil {
			return nil, err
		}
	}
	if v.err != nil {
		return nil, v.err
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
// "\n") and its 1-based number, until f returns false. A read error is
// returned, and what was read of a line before it is no line.
func eachLine(r io.Reader, f func(n int, line []byte) bool) error {
	er := &errReader{r: r}
	sc := bufio.NewScanner(er)
	sc.Buffer(make([]byte, 64<<10), maxLine)
	sc.Split(func(data []byte, atEOF bool) (int, []byte, error) {
		if atEOF && er.err != nil && bytes.IndexByte(data, '\n') < 0 {
			return 0, nil, er.err
		}
		return splitLines(data, atEOF)
	})
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

// errReader is r, keeping its error other than io.EOF.
type errReader struct {
	r   io.Reader
	err error
}

func (e *errReader) Read(p []byte) (int, error) {
	n, err := e.r.Read(p)
	if err != nil && !errors.Is(err, io.EOF) {
		e.err = err
	}
	return n, err
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

// trailIndex is what the first pass reads: where the checkpoint line is.
type trailIndex struct {
	cpLine   int    // 0: none
	cp       []byte // its bytes
	lastLine int    // of an entry
	cpTwice  int    // a second checkpoint line
}

func indexTrail(open func() (io.ReadCloser, error)) (*trailIndex, error) {
	rc, err := open()
	if err != nil {
		return nil, err
	}
	defer func() { _ = rc.Close() }()
	idx := &trailIndex{}
	err = eachLine(rc, func(n int, line []byte) bool {
		if isCheckpointLine(line) {
			if idx.cpLine != 0 && idx.cpTwice == 0 {
				idx.cpTwice = n
			}
			idx.cpLine, idx.cp = n, bytes.Clone(line)
			return true
		}
		idx.lastLine = n
		return true
	})
	return idx, err
}

// present reports whether the trail has position pos of partition p: a
// line other than a checkpoint line that reads (as json.Unmarshal reads a
// partition and a position) as that. It reads the trail again: it is
// asked once, where a chain skips positions, to tell a missing position
// from one out of its place.
func (v *verifier) present(p int, pos uint64) bool {
	rc, err := v.open()
	if err != nil {
		v.err = err
		return false
	}
	defer func() { _ = rc.Close() }()
	var s lineScan
	found := false
	err = eachLine(rc, func(n int, line []byte) bool {
		if isCheckpointLine(line) {
			return true
		}
		lp, lpos, ok := 0, uint64(0), false
		if !v.opts.slow && s.scan(line) {
			lp, lpos, ok = s.quickLoc(line)
		}
		if !ok {
			var loc struct {
				Partition int    `json:"partition"`
				Pos       uint64 `json:"pos"`
			}
			ok = json.Unmarshal(line, &loc) == nil
			lp, lpos = loc.Partition, loc.Pos
		}
		found = ok && lp == p && lpos == pos
		return !found
	})
	if err != nil {
		v.err = err
	}
	return found
}

// checkAt is a head a checkpoint says the chain holds at a position.
type checkAt struct{ head string }

type verifier struct {
	keys    *KeySet
	sigs    sigCache
	opts    verifyOptions
	open    func() (io.ReadCloser, error)
	err     error // reading the trail again (present)
	chains  map[int]*chainState
	signers map[string]bool
	report  *Report
	// installation is the checkpoints' ("" without any).
	installation string
	// own are the trail's checkpoints, given those passed WithCheckpoints.
	own, given []Checkpoint
	// at are the heads the checkpoints name, by partition and position.
	at   map[int]map[uint64]checkAt
	from map[int]Checkpoint
	w    *lineWorker // of the sequential pass
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
	var r lineResult
	v.worker().prepare(n, line, &r)
	return v.apply(&r)
}

// lineResult is what an entry's line says by itself, read without the
// chains (prepare, in any order, on any goroutine): what apply then
// checks, in order, against its partition's chain.
type lineResult struct {
	n int
	// skip: the line is before a checkpoint given to From (read as
	// json.Unmarshal reads a partition and a position).
	skip bool
	// malformed is the line's break of BreakMalformed, found before its
	// place in the chain is looked at; partition -1 when it is not an
	// entry.
	malformed *Break
	partition int
	pos       uint64
	prev      string
	digest    string
	// verifiedBefore: the entry is at or before a checkpoint given to
	// From (its event and seal are not read).
	verifiedBefore bool
	evErr          error
	gap            bool // the event is a gap
	// signer is the event's, when it is signed and verified.
	signer         string
	holder         string
	dropped        uint64
	gapFrom, gapTo time.Time
	sealed         bool
	sealSigner     string
	sealErr        error
}

// lineWorker prepares lines: what it shares with other workers is read
// only (but the signature cache); its scratch space is its own.
type lineWorker struct {
	keys *KeySet
	sigs *sigCache
	from map[int]Checkpoint
	// slow reads every line the long way (parseEntry, decodeEvent,
	// verifyEvent): what the fast path is tested against.
	slow     bool
	scan     lineScan
	leaf     []byte
	unsealed []byte
	signer   string // the last signer read: most lines name one of a few
	nodes    nodeMemo
}

// signerID is id as a string, the last one's when it is the same.
func (w *lineWorker) signerID(id []byte) string {
	if string(id) != w.signer {
		w.signer = string(id)
	}
	return w.signer
}

func (v *verifier) worker() *lineWorker {
	if v.w == nil {
		v.w = v.newWorker()
	}
	return v.w
}

func (v *verifier) newWorker() *lineWorker {
	return &lineWorker{keys: v.keys, sigs: &v.sigs, from: v.from, slow: v.opts.slow}
}

// prepare reads line n into r: everything about the line that does not
// depend on the lines before it.
func (w *lineWorker) prepare(n int, line []byte, r *lineResult) {
	*r = lineResult{n: n}
	scanned := !w.slow && w.scan.scan(line)
	if len(w.from) > 0 {
		// Entries a checkpoint verified before vouches for: skipped, but
		// for the one at its size.
		p, pos, ok := 0, uint64(0), false
		if scanned {
			p, pos, ok = w.scan.quickLoc(line)
		}
		if !ok {
			var loc struct {
				Partition int    `json:"partition"`
				Pos       uint64 `json:"pos"`
			}
			ok = json.Unmarshal(line, &loc) == nil
			p, pos = loc.Partition, loc.Pos
		}
		if f, found := w.from[p]; ok && found && pos < f.Size {
			r.skip, r.partition, r.pos = true, p, pos
			return
		}
	}
	if scanned {
		if e, ok := w.scan.quickEntry(line); ok && w.quick(line, &e, r) {
			return
		}
		*r = lineResult{n: n}
	}
	w.slowLine(n, line, r)
}

// quick is prepare of an entry quickEntry read; false where the fast path
// is not sure, r then to be prepared the long way.
func (w *lineWorker) quick(line []byte, e *quickEntry, r *lineResult) bool {
	r.partition, r.pos, r.prev = e.partition, e.pos, string(e.prev)
	unsealed := line
	if e.sealAt > 0 {
		w.unsealed = append(append(w.unsealed[:0], line[:e.sealAt]...), '}')
		unsealed = w.unsealed
	}
	sum := sha256.Sum256(unsealed)
	r.digest = hex.EncodeToString(sum[:])
	if f, ok := w.from[r.partition]; ok && r.pos <= f.Size {
		r.verifiedBefore = true
		return true
	}
	ev, ok := quickDecode(line, e.event)
	if !ok {
		return false
	}
	if ev.signed {
		if len(ev.signer) == 0 {
			return false
		}
		var leaf [32]byte
		leaf, w.leaf = quickLeaf(line, e.event, &ev, w.leaf)
		root, ok := quickFold(leaf, ev.proof, &w.nodes)
		r.signer = w.signerID(ev.signer)
		if !ok || w.sigs.verify(w.keys, r.signer, ev.at, root[:], string(ev.sig)) != nil {
			return false
		}
	}
	if r.gap = string(ev.kind) == string(KindGap); r.gap {
		r.holder, r.dropped, r.gapFrom, r.gapTo = string(ev.holder), ev.dropped, ev.from, ev.to
	}
	if e.sealAt > 0 {
		r.sealed, r.sealSigner = true, w.signerID(e.sealSigner)
		r.sealErr = verify(w.keys, r.sealSigner, ev.at, unsealed, string(e.sealSig))
	}
	return true
}

// slowLine is prepare of any line, the long way.
func (w *lineWorker) slowLine(n int, line []byte, r *lineResult) {
	pe, err := parseEntry(line)
	if err != nil {
		r.malformed = &Break{Line: n, Partition: -1, Kind: BreakMalformed, Detail: err.Error()}
		return
	}
	r.partition, r.pos, r.prev, r.digest = pe.Partition, pe.Pos, pe.Prev, pe.digest
	if !intent.IsCanonical(line) {
		if canon, err := intent.Canonicalize(line); err != nil || !bytes.Equal(canon, line) {
			r.malformed = &Break{Line: n, Partition: pe.Partition, Pos: pe.Pos, Kind: BreakMalformed,
				Detail: "the line is not the canonical bytes of its entry (RFC 8785): its digest and seal are of those bytes only"}
			return
		}
	}
	if f, ok := w.from[pe.Partition]; ok && pe.Pos <= f.Size {
		r.verifiedBefore = true
		return
	}
	// The event: signed ones verify by themselves.
	var ev Event
	if bytes.Contains(pe.Event, []byte(`"sig":`)) && hasMember(pe.Event, "sig") {
		ev, err = verifyEvent(pe.Event, w.keys, w.sigs)
		if err == nil {
			r.signer = ev.Signer
		}
	} else {
		ev, err = decodeEvent(pe.Event)
	}
	if err != nil {
		r.evErr = err
		return
	}
	if r.gap = ev.Kind == KindGap; r.gap {
		r.holder, r.dropped, r.gapFrom, r.gapTo = ev.Holder, ev.Dropped, ev.From, ev.To
	}
	if pe.Seal != nil {
		r.sealed, r.sealSigner = true, pe.Seal.Signer
		r.sealErr = verify(w.keys, pe.Seal.Signer, ev.At, pe.unsealed, pe.Seal.Sig)
	}
}

// apply checks a prepared line against its partition's chain, in the
// trail's order; the break it finds, if any.
func (v *verifier) apply(r *lineResult) *Break {
	n := r.n
	if r.skip {
		v.fromChain(r.partition, v.from[r.partition], n).report.Skipped++
		return nil
	}
	if r.malformed != nil {
		return r.malformed
	}
	at := func(kind BreakKind, format string, args ...any) *Break {
		return &Break{Line: n, Partition: r.partition, Pos: r.pos, Kind: kind, Detail: fmt.Sprintf(format, args...)}
	}
	c := v.chains[r.partition]
	if f, ok := v.from[r.partition]; ok && r.pos <= f.Size {
		c = v.fromChain(r.partition, f, n)
		if r.pos == f.Size && r.digest != f.Head {
			return at(BreakCheckpoint, "the entry's digest is %s, but the checkpoint verified before (of %s) names %s at this position: the chain was rewritten since",
				r.digest, f.At.UTC().Format(time.RFC3339Nano), f.Head)
		}
		c.report.Skipped++
		return nil
	}
	if r.evErr != nil {
		return at(breakKind(r.evErr), "event: %v", r.evErr)
	}
	if r.signer != "" {
		v.signers[r.signer] = true
	}
	// Its place in the chain.
	if c == nil {
		if f, ok := v.from[r.partition]; ok {
			c = &chainState{report: PartitionReport{Partition: r.partition, First: f.Size + 1, Last: f.Size, Head: f.Head}}
		} else {
			c = &chainState{report: PartitionReport{Partition: r.partition, First: r.pos}}
		}
		v.chains[r.partition] = c
	}
	if c.report.Entries == 0 && c.report.Last == 0 && r.pos == c.report.First {
		// The chain's first entry read: at position 1, its first link.
		if r.pos == 1 {
			switch genesis := GenesisDigest(v.installation, r.partition); {
			case r.prev == "":
				c.report.Unbound = true
			case v.installation == "":
			case r.prev != genesis:
				return at(BreakInstallation, "the chain's first link is %s, not installation %s's (%s): the partition is another installation's", r.prev, v.installation, genesis)
			}
		}
	} else {
		want := c.report.Last + 1
		switch {
		case r.pos < want:
			return at(BreakReordered, "position %d comes after position %d (line %d): entries were moved or repeated", r.pos, c.report.Last, c.line)
		case r.pos > want && v.present(r.partition, want):
			return at(BreakReordered, "position %d comes before position %d, which is later in the trail: entries were moved", r.pos, want)
		case r.pos > want:
			missing := fmt.Sprintf("position %d is", want)
			if r.pos-want > 1 {
				missing = fmt.Sprintf("positions %d to %d are", want, r.pos-1)
			}
			return at(BreakDropped, "%s missing: the chain goes from %d (line %d) to %d", missing, c.report.Last, c.line, r.pos)
		case r.prev != c.report.Head:
			if c.report.Entries == 0 {
				return at(BreakCheckpoint, "the entry names %s as its predecessor's digest, but the checkpoint verified before names %s at position %d: the chain was rewritten since",
					r.prev, c.report.Head, c.report.Last)
			}
			return &Break{Line: c.line, Partition: r.partition, Pos: c.report.Last, Kind: BreakEdited,
				Detail: fmt.Sprintf("the entry's digest is %s, but position %d (line %d) names %s as its predecessor's: the entry (or that prev) was changed",
					c.report.Head, r.pos, n, r.prev)}
		}
	}
	// The seal vouches for it and every unsealed entry before it.
	if r.sealed {
		if r.sealErr != nil {
			return at(breakKind(r.sealErr), "seal: %v", r.sealErr)
		}
		v.signers[r.sealSigner] = true
		c.unsealedFrom = 0
	} else if c.unsealedFrom == 0 {
		c.unsealedFrom = r.pos
	}
	// A head a checkpoint names here.
	if want, ok := v.at[r.partition][r.pos]; ok && want.head != r.digest {
		return at(BreakCheckpoint, "the entry's digest is %s, but the checkpoint names %s at this position: the chain is not the one the checkpoint's signer saw",
			r.digest, want.head)
	}
	if r.gap {
		v.report.Gaps = append(v.report.Gaps, Gap{Partition: r.partition, Pos: r.pos, Holder: r.holder, Dropped: r.dropped, From: r.gapFrom, To: r.gapTo})
	}
	c.report.Last, c.report.Head, c.line = r.pos, r.digest, n
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
