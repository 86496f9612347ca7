package dedup

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/idemgate/idemgate/pkg/dedup/internal/jsbackend"
	"github.com/idemgate/idemgate/pkg/intent"
)

// trackFullEvery is how long a Tracker goes on reading only what changed
// before it reads the whole ledger again: a bound on how long a change no
// read can see (a record's old copy purged by a migration) goes unnoticed.
const trackFullEvery = time.Hour

// Unresolved is an unresolved record (pending, awaiting approval, approved
// or uncertain) as a Tracker keeps it: what counting it and probing it need.
type Unresolved struct {
	// Key is the record's key as a listing shows it.
	Key string
	// Revision is the record's KV revision.
	Revision uint64
	// Status, UpdatedAt and LeaseUntil are the record's.
	Status     intent.Status
	UpdatedAt  time.Time
	LeaseUntil time.Time
	// Uncertain is the whole record of an uncertain one (what a probe of it
	// reads); nil for the other states.
	Uncertain *Listed
	// partition is the index of the key's partition.
	partition int
	// retention is how long the record will be kept once final.
	retention time.Duration
}

// PastLease reports whether the record is pending past its lease deadline
// at now (as Query.PastLease selects).
func (u Unresolved) PastLease(now time.Time) bool {
	return u.Status == intent.StatusPending && !now.Before(u.LeaseUntil)
}

// Tracker keeps the ledger's unresolved records, reading at each Update only
// what was written since the last one: one consumer per partition starting
// after the last stream sequence it read, delete markers included. Its first
// Update reads the whole ledger, as Walk does, and so does one after any
// sign that a write may have gone unread:
//
//   - a partition's stream made again (its creation time changed, as when a
//     server kept it in memory and restarted) or shorter than the last
//     sequence read;
//   - an Update that failed, or the last one begun too long ago: a record
//     written after it, final, could have expired and its expiry marker gone
//     by now (the least retention of the records tracked, or of a forget's
//     tombstone, plus how long the marker stays);
//   - a record kept that lies before its stream's first message (its
//     stream purged, as by an operator);
//   - trackFullEvery since the last whole read.
//
// Its records are then exactly what a whole read would find: the
// unresolved records the ledger holds, each at its latest write. One
// removal leaves no sign: the purge of a single key's messages behind a
// later one's, which Migrate makes when it moves a record; the next whole
// read drops it, within trackFullEvery.
// A Tracker is not safe for concurrent use.
type Tracker struct {
	l       *Ledger
	parts   []trackedPart // nil: the next Update reads the whole ledger
	recs    map[string]Unresolved
	begun   time.Time // when the last Update began
	wholeAt time.Time // when the last whole read began
}

// trackedPart is where a Tracker's reading of one partition stands.
type trackedPart struct {
	created time.Time // the stream's creation time
	last    uint64    // the stream sequence of the last message read
}

// Track returns a Tracker of the ledger's unresolved records: empty until its
// first Update.
func (l *Ledger) Track() *Tracker {
	return &Tracker{l: l, recs: map[string]Unresolved{}}
}

// TrackStats is what an Update read.
type TrackStats struct {
	// Read is how many messages it read (records, delete markers and the
	// ledger's own keys).
	Read int
	// Whole reports that it read the whole ledger.
	Whole bool
}

// Update reads what was written since the last Update (the whole ledger the
// first time, and after a sign that a write may have gone unread) and calls
// untimed with each untimed final record it read (Listed.Untimed), in
// stream order; an error from untimed ends the Update with it. After an
// error the next Update reads the whole ledger.
func (t *Tracker) Update(ctx context.Context, untimed func(Listed) error) (TrackStats, error) {
	begun := time.Now()
	st, err := t.update(ctx, begun, untimed)
	if err != nil {
		t.parts = nil // read it all again next time
		return st, err
	}
	t.begun = begun
	return st, nil
}

func (t *Tracker) update(ctx context.Context, begun time.Time, untimed func(Listed) error) (TrackStats, error) {
	pos := make([]jsbackend.Position, len(t.l.parts))
	markerTTL := time.Duration(0)
	for p, b := range t.l.parts {
		got, err := b.Position(ctx)
		if err != nil {
			return TrackStats{}, fmt.Errorf("track: %w", t.l.partErr(p, err))
		}
		pos[p] = got
		markerTTL = max(markerTTL, got.MarkerTTL)
	}
	whole := t.parts == nil || begun.Sub(t.wholeAt) >= trackFullEvery || begun.Sub(t.begun) >= t.unreadAfter(markerTTL)
	for p := range t.parts {
		whole = whole || !pos[p].Created.Equal(t.parts[p].created) || pos[p].LastSeq < t.parts[p].last
	}
	read := 0
	if !whole {
		st, err := t.read(ctx, pos, untimed)
		if err != nil {
			return st, err
		}
		if time.Since(t.begun) < t.unreadAfter(markerTTL) && !t.removed(pos) {
			return st, nil
		}
		// It took so long that a write after the last Update may have
		// expired unread, or a record kept is no longer in its stream:
		// read it all.
		read = st.Read
	}
	t.parts, t.recs, t.wholeAt = make([]trackedPart, len(t.l.parts)), map[string]Unresolved{}, begun
	st, err := t.read(ctx, pos, untimed)
	st.Read += read
	st.Whole = true
	return st, err
}

// unreadAfter is how long after an Update began a record written after it
// may have expired and its expiry marker gone, unread: the least retention
// a record tracked or a forget's tombstone has, plus how long the marker
// stays.
func (t *Tracker) unreadAfter(markerTTL time.Duration) time.Duration {
	least := t.l.policy.forgotten
	for _, u := range t.recs {
		least = min(least, u.retention)
	}
	return least + markerTTL
}

// removed reports whether a record kept, not written again since pos was
// read, was no longer in its stream then (purged, or written again and that
// write expired unread).
func (t *Tracker) removed(pos []jsbackend.Position) bool {
	for _, u := range t.recs {
		if u.Revision < pos[u.partition].FirstSeq {
			return true
		}
	}
	return false
}

// read reads every partition after the last sequence read, into the
// tracker's records.
func (t *Tracker) read(ctx context.Context, pos []jsbackend.Position, untimed func(Listed) error) (TrackStats, error) {
	var st TrackStats
	for p, b := range t.l.parts {
		t.parts[p].created = pos[p].Created
		var fnErr error
		next, read, _, err := b.Scan(ctx, jsbackend.Scan{After: t.parts[p].last, Limit: math.MaxInt, Markers: true}, func(m jsbackend.Msg) bool {
			if fnErr == nil {
				fnErr = t.apply(p, m, untimed)
			}
			return true
		})
		st.Read += read
		if err = cmp.Or(fnErr, err); err != nil {
			return st, fmt.Errorf("track: %w", t.l.partErr(p, err))
		}
		t.parts[p].last = next
	}
	return st, nil
}

// apply brings the tracker's record of m's key to m: kept when unresolved,
// dropped otherwise.
func (t *Tracker) apply(p int, m jsbackend.Msg, untimed func(Listed) error) error {
	key, ok := t.l.keyOf(m.Key)
	if !ok {
		return nil
	}
	if m.Deleted {
		delete(t.recs, key)
		return nil
	}
	if st, ok := leadingStatus(m.Data); ok && m.TTL > 0 && (st.Final() || st == intent.StatusForgotten) {
		// Settled, with its TTL: nothing to keep or report, and no need
		// to decode it all (most of what a busy ledger's round reads).
		delete(t.recs, key)
		return nil
	}
	rec, err := decodeRecord(m.Data)
	if err != nil {
		delete(t.recs, key) // no record this package wrote, which a walk skips
		return nil
	}
	if rec.Status.Final() || rec.Status == intent.StatusForgotten {
		delete(t.recs, key)
		if r := (Listed{Key: key, Revision: m.Rev, Record: rec, ttl: m.TTL}); r.Untimed() {
			return untimed(r)
		}
		return nil
	}
	u := Unresolved{Key: key, Revision: m.Rev, Status: rec.Status, UpdatedAt: rec.UpdatedAt, LeaseUntil: rec.LeaseUntil,
		partition: p, retention: t.l.policy.retentionOf(rec)}
	if rec.Status == intent.StatusUncertain {
		u.Uncertain = &Listed{Key: key, Revision: m.Rev, Record: rec, ttl: m.TTL}
	}
	t.recs[key] = u
	return nil
}

// statusPrefix starts every record this package writes: its status is its
// first member.
const statusPrefix = `{"status":"`

// leadingStatus returns the status of the record data when data starts
// with it, as every record this package writes does; ok is false otherwise
// (then decode it).
func leadingStatus(data []byte) (st intent.Status, ok bool) {
	rest, ok := bytes.CutPrefix(data, []byte(statusPrefix))
	if !ok {
		return "", false
	}
	i := bytes.IndexByte(rest, '"')
	if i < 0 || i+1 >= len(rest) || bytes.IndexByte(rest[:i], '\\') >= 0 || (rest[i+1] != ',' && rest[i+1] != '}') {
		return "", false
	}
	return intent.Status(rest[:i]), true
}

// Unresolved returns the unresolved records as of the last Update, in the
// order a walk reads them: partition after partition, each in stream order.
func (t *Tracker) Unresolved() []Unresolved {
	out := make([]Unresolved, 0, len(t.recs))
	for _, u := range t.recs {
		out = append(out, u)
	}
	slices.SortFunc(out, func(a, b Unresolved) int {
		return cmp.Or(cmp.Compare(a.partition, b.partition), cmp.Compare(a.Revision, b.Revision))
	})
	return out
}
