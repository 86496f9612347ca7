package dedup

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/idemgate/idemgate/pkg/dedup/internal/jsbackend"
	"github.com/idemgate/idemgate/pkg/intent"
)

// Limits of a listing page (Query.Limit).
const (
	DefaultListLimit = 100
	MaxListLimit     = 1000
)

// OpenStatuses are the states of an operation that is not settled: in
// flight (or abandoned), waiting for an operator, approved and about to fire,
// or uncertain.
var OpenStatuses = []intent.Status{
	intent.StatusPending, intent.StatusAwaitingApproval, intent.StatusApproved, intent.StatusUncertain,
}

// pause waits d, or until ctx is done.
func pause(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// Query selects the records List returns. The zero value selects every live
// record, from the start of the ledger.
type Query struct {
	// Statuses keeps records in one of these states (OpenStatuses: every
	// unsettled one). Default: every state.
	Statuses []intent.Status
	// Tool keeps one tool's records. The server then delivers only that
	// tool's keys (subject $KV.<bucket>.<tool>.>). Default: every tool.
	Tool string
	// Session keeps records whose session is exactly this. Default: any.
	Session string
	// CreatedBefore keeps records claimed before this time (an age filter).
	// Default: the zero time, any age.
	CreatedBefore time.Time
	// PastLease keeps only pending records whose lease deadline has passed:
	// the holder is gone (or released the key) and no retry has claimed it
	// again. Default: false.
	PastLease bool
	// Match, when set, keeps only the records it returns true for; it is
	// applied after the other filters. Default: nil.
	Match func(key string, rec Record) bool
	// After is the cursor: only records stored after this stream sequence
	// are read. A Page's Next is the After of the next page. Default: 0, the
	// beginning.
	After uint64
	// Limit is the most records a page holds. Default: DefaultListLimit
	// (100); at most MaxListLimit (1000).
	Limit int
	// MaxScan bounds how many records one page reads, matching or not: a
	// selective filter over a large ledger then returns a short page with
	// More set, and the caller continues from Next. Default: 0, no bound.
	MaxScan int
}

func (q *Query) check() error {
	switch {
	case q.Limit < 0 || q.Limit > MaxListLimit:
		return fmt.Errorf("%w: list: limit %d: use 1 to %d, or 0 for %d", ErrInvalid, q.Limit, MaxListLimit, DefaultListLimit)
	case q.MaxScan < 0:
		return fmt.Errorf("%w: list: max scan %d: use a positive bound, or 0 for none", ErrInvalid, q.MaxScan)
	case q.Tool != "" && !intent.ValidTool(q.Tool):
		return fmt.Errorf("%w: list: tool %q must match [a-z0-9_-]{1,64}", ErrInvalid, q.Tool)
	}
	for _, s := range q.Statuses {
		if !knownStatus(s) {
			return fmt.Errorf("%w: list: unknown status %q", ErrInvalid, s)
		}
	}
	if q.Limit == 0 {
		q.Limit = DefaultListLimit
	}
	return nil
}

// ParseStatuses reads a comma-separated list of record statuses, where
// "open" stands for OpenStatuses; "" is no filter. An unknown name gives an
// error matching ErrInvalid.
func ParseStatuses(s string) ([]intent.Status, error) {
	var out []intent.Status
	for name := range strings.SplitSeq(s, ",") {
		switch name = strings.TrimSpace(name); {
		case name == "":
		case name == "open":
			out = append(out, OpenStatuses...)
		case knownStatus(intent.Status(name)):
			out = append(out, intent.Status(name))
		default:
			return nil, fmt.Errorf("%w: status %q: use open, pending, awaiting_approval, approved, uncertain, completed, failed, denied or forgotten", ErrInvalid, name)
		}
	}
	return out, nil
}

func knownStatus(s intent.Status) bool {
	switch s {
	case intent.StatusPending, intent.StatusCompleted, intent.StatusFailed, intent.StatusAwaitingApproval,
		intent.StatusApproved, intent.StatusDenied, intent.StatusUncertain, intent.StatusForgotten:
		return true
	}
	return false
}

func (q *Query) keep(key string, rec Record, now time.Time) bool {
	switch {
	case len(q.Statuses) > 0 && !slices.Contains(q.Statuses, rec.Status):
		return false
	case rec.Status == intent.StatusForgotten && !slices.Contains(q.Statuses, rec.Status):
		return false // a forget's tombstone, listed only when asked for
	case q.Session != "" && rec.Session != q.Session:
		return false
	case !q.CreatedBefore.IsZero() && !rec.CreatedAt.Before(q.CreatedBefore):
		return false
	case q.PastLease && (rec.Status != intent.StatusPending || now.Before(rec.LeaseUntil)):
		return false
	case q.Match != nil && !q.Match(key, rec):
		return false
	}
	return true
}

// Listed is one record of a listing, with its key and revision.
type Listed struct {
	// Key is the operation's key (not its KV key, in a compact layout).
	Key string `json:"key"`
	// Revision is the record's KV revision: its stream sequence.
	Revision uint64 `json:"revision"`
	Record
	// ttl is the record's per-message TTL; 0 when it has none.
	ttl time.Duration
}

// Page is one page of a listing.
type Page struct {
	// Records are the records found, in stream order (oldest write first).
	Records []Listed `json:"records"`
	// Next is the cursor to pass as Query.After for the next page: the
	// stream sequence of the last record this page read.
	Next uint64 `json:"next"`
	// More reports that records after Next may match: the page stopped at
	// its Limit or MaxScan before the end of the ledger.
	More bool `json:"more"`
}

// cursorShift places a listing cursor's partition above its stream sequence.
const cursorShift = 56

// List returns one page of the ledger's live records that q selects, in the
// order they were last written, each under its operation's key (a record
// whose KV key is not its key's in the ledger's layout is skipped). The
// bucket keeps one message per key (its history is 1) and delete markers
// are skipped, so the scan sees exactly the live records of the server that
// serves it — on a replicated ledger a replica, which may not hold the
// latest acknowledged writes yet (read a record with Get to see its latest
// state); a record written again while a listing pages through the ledger
// moves to the end and is seen there again.
//
// It reads with an ephemeral consumer that starts after q.After and is
// deleted when the page is done: a page costs what it reads after its cursor
// and the server's count of the messages after it (see Walk, which reads
// the whole ledger with one consumer per partition). Filters
// other than Tool are applied as records arrive, so a selective filter reads
// every record after the cursor until the page fills (bound it with
// MaxScan). It returns an error matching ErrInvalid for a bad query.
//
// A partitioned ledger is listed one partition after the other, each in
// stream order; its cursor carries the partition in its top byte and the
// stream sequence within it below (a one-partition cursor is the stream
// sequence).
func (l *Ledger) List(ctx context.Context, q Query) (Page, error) {
	if err := q.check(); err != nil {
		return Page{}, err
	}
	p, seq := int(q.After>>cursorShift), q.After&(1<<cursorShift-1)
	if p >= len(l.parts) {
		return Page{}, fmt.Errorf("%w: list: cursor %d names partition %d of a ledger of %d: pass a Page's Next",
			ErrInvalid, q.After, p, len(l.parts))
	}
	page := Page{Records: []Listed{}, Next: q.After}
	scanned := 0
	for ; p < len(l.parts); p, seq = p+1, 0 {
		sub := q
		sub.After = seq
		sub.Limit = q.Limit - len(page.Records)
		if q.MaxScan > 0 {
			sub.MaxScan = q.MaxScan - scanned
		}
		got, n, err := l.listPart(ctx, p, sub)
		if err != nil {
			return Page{}, fmt.Errorf("list: %w", l.partErr(p, err))
		}
		scanned += n
		page.Records = append(page.Records, got.Records...)
		page.Next = uint64(p)<<cursorShift | got.Next
		if got.More {
			page.More = true
			return page, nil
		}
		full := len(page.Records) >= q.Limit || (q.MaxScan > 0 && scanned >= q.MaxScan)
		if full && p+1 < len(l.parts) {
			page.Next, page.More = uint64(p+1)<<cursorShift, true
			return page, nil
		}
	}
	return page, nil
}

// Walk calls fn with every live record q selects, as List would list them
// page after page (q's After, Limit and MaxScan are not used), until fn
// returns false. Each partition is read with one consumer for the whole
// walk: creating a consumer makes the server count the messages after its
// start, which in a bucket of one message per key visits every key, so
// paging through a large ledger with List costs that count once per page,
// and a walk once per partition. It returns an error matching ErrInvalid
// for a bad query.
func (l *Ledger) Walk(ctx context.Context, q Query, fn func(Listed) bool) error {
	q.After, q.Limit, q.MaxScan = 0, 0, 0
	if err := q.check(); err != nil {
		return err
	}
	now := l.clock()
	wctx, stop := context.WithCancel(ctx) // fn said stop: the scan ends
	defer stop()
	stopped := false
	for p := range l.parts {
		_, _, _, err := l.parts[p].Scan(wctx, jsbackend.Scan{Token: q.Tool, Limit: math.MaxInt}, func(m jsbackend.Msg) bool {
			r, ok := l.selected(m, &q, now)
			if !ok || stopped {
				return false
			}
			if stopped = !fn(r); stopped {
				stop()
			}
			return true
		})
		if stopped {
			return nil
		}
		if err != nil {
			return fmt.Errorf("walk: %w", l.partErr(p, err))
		}
	}
	return nil
}

// listPart is List over partition p, for a checked q whose cursor is a
// stream sequence of p; it also returns how many messages it read.
func (l *Ledger) listPart(ctx context.Context, p int, q Query) (Page, int, error) {
	page := Page{Records: []Listed{}}
	now := l.clock()
	next, read, more, err := l.parts[p].Scan(ctx, jsbackend.Scan{After: q.After, Token: q.Tool, Limit: q.Limit, MaxScan: q.MaxScan},
		func(m jsbackend.Msg) bool {
			r, ok := l.selected(m, &q, now)
			if ok {
				page.Records = append(page.Records, r)
			}
			return ok
		})
	if err != nil {
		return Page{}, 0, err
	}
	page.Next, page.More = next, more
	return page, read, nil
}

// selected returns the record of message m as a listing shows it, when q
// selects it at now; ok is false for a message that is no record this
// package wrote, one not stored under its key's KV key in this layout, or
// one q does not select.
func (l *Ledger) selected(m jsbackend.Msg, q *Query, now time.Time) (Listed, bool) {
	rec, err := decodeRecord(m.Data)
	if err != nil {
		return Listed{}, false
	}
	key, ok := l.keyOf(m.Key)
	if !ok || !q.keep(key, rec, now) {
		return Listed{}, false
	}
	return Listed{Key: key, Revision: m.Rev, Record: rec, ttl: m.TTL}, true
}

// partErr names partition p in err when the ledger has several.
func (l *Ledger) partErr(p int, err error) error {
	if len(l.parts) > 1 {
		return fmt.Errorf("partition %d: %w", p, err)
	}
	return err
}

// keyOf returns the key a listing shows for a record found under the KV key
// stored: stored itself (a compact key in layout 2, which every method
// takes). ok is false when the ledger's layout would not store a key there
// (a full derived key in a layout-2 ledger), so that a listing never shows
// a key under which the record cannot be read. A budget's count (Budget)
// and an election (Elect) are no records.
func (l *Ledger) keyOf(stored string) (key string, ok bool) {
	sk, err := intent.LedgerKey(stored, l.layout)
	return stored, err == nil && sk == stored && !isBudgetKey(stored) && !isElectionKey(stored)
}
