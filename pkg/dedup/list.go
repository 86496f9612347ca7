package dedup

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

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

// maxListRetries bounds the retries of a pull that found no consumer to
// answer it.
const maxListRetries = 8

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

// listFetch is how many messages one pull request of a listing asks for.
const listFetch = 256

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
			return nil, fmt.Errorf("%w: status %q: use open, pending, awaiting_approval, approved, uncertain, completed, failed or denied", ErrInvalid, name)
		}
	}
	return out, nil
}

func knownStatus(s intent.Status) bool {
	switch s {
	case intent.StatusPending, intent.StatusCompleted, intent.StatusFailed, intent.StatusAwaitingApproval,
		intent.StatusApproved, intent.StatusDenied, intent.StatusUncertain:
		return true
	}
	return false
}

func (q *Query) keep(key string, rec Record, now time.Time) bool {
	switch {
	case len(q.Statuses) > 0 && !slices.Contains(q.Statuses, rec.Status):
		return false
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

// List returns one page of the ledger's live records that q selects, in the
// order they were last written, each under its operation's key (a record
// whose KV key is not its key's in the ledger's layout is skipped). The bucket keeps one message per key (its
// history is 1) and delete markers are skipped, so the scan sees exactly the
// live records; a record written again while a listing pages through the
// ledger moves to the end and is seen there again.
//
// It reads with an ephemeral consumer that starts after q.After and is
// deleted when the page is done: a page costs what it reads after its cursor,
// so paging through the whole ledger costs one read per record. Filters
// other than Tool are applied as records arrive, so a selective filter reads
// every record after the cursor until the page fills (bound it with
// MaxScan). It returns an error matching ErrInvalid for a bad query.
//
// A partitioned ledger is listed one partition after the other; its cursor
// carries the partition in its top byte (a one-partition cursor is the
// stream sequence).
func (l *Ledger) List(ctx context.Context, q Query) (Page, error) {
	if len(l.parts) > 1 {
		return l.listPartitions(ctx, q)
	}
	if err := q.check(); err != nil {
		return Page{}, err
	}
	page, _, err := l.listOne(ctx, q)
	return page, err
}

// listOne is List over one bucket, for a checked q; it also returns how many
// messages it read.
func (l *Ledger) listOne(ctx context.Context, q Query) (Page, int, error) {
	js, err := l.jetStream()
	if err != nil {
		return Page{}, 0, fmt.Errorf("list: %w", err)
	}
	filter := l.keyPrefix + ">"
	if q.Tool != "" {
		filter = l.keyPrefix + q.Tool + ".>"
	}
	stream := "KV_" + l.kv.Bucket()
	cons, err := js.CreateConsumer(ctx, stream, jetstream.ConsumerConfig{
		Description:       "idemgate ledger listing",
		DeliverPolicy:     jetstream.DeliverByStartSequencePolicy,
		OptStartSeq:       q.After + 1,
		AckPolicy:         jetstream.AckNonePolicy,
		FilterSubject:     filter,
		InactiveThreshold: 30 * time.Second,
		MemoryStorage:     true,
		Replicas:          1,
	})
	if err != nil {
		return Page{}, 0, fmt.Errorf("list: consumer on %s: %w", stream, err)
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.timeout)
		defer cancel()
		_ = js.DeleteConsumer(dctx, stream, cons.CachedInfo().Name)
	}()
	page := Page{Records: []Listed{}, Next: q.After}
	pending := cons.CachedInfo().NumPending
	now := l.clock()
	scanned := 0
	for pending > 0 {
		if len(page.Records) >= q.Limit || (q.MaxScan > 0 && scanned >= q.MaxScan) {
			page.More = true
			break
		}
		n := min(listFetch, q.Limit-len(page.Records))
		if q.MaxScan > 0 {
			n = min(n, q.MaxScan-scanned)
		}
		got, last, err := l.listBatch(ctx, cons, n, &q, now, &page)
		for try := 0; got == 0 && ctx.Err() == nil && try < maxListRetries; try++ {
			// Records are pending and none came: a consumer of a replicated
			// stream may take a moment to be served after its creation was
			// answered.
			if perr := pause(ctx, time.Millisecond<<try); perr == nil {
				got, last, err = l.listBatch(ctx, cons, n, &q, now, &page)
			}
		}
		scanned += got
		switch {
		case err != nil && !errors.Is(err, nats.ErrNoResponders):
			return Page{}, 0, fmt.Errorf("list: %w", err)
		case got == 0:
			// A pull the server drops (a user without permission to publish
			// on $JS.API.CONSUMER.MSG.NEXT) looks like an empty ledger: say so.
			return Page{}, 0, fmt.Errorf("list: the consumer on %s has records pending (%d) and delivered none: is $JS.API.CONSUMER.MSG.NEXT.%s.* allowed to this user?",
				stream, pending, stream)
		}
		pending = last
	}
	return page, scanned, nil
}

// listBatch reads up to n messages, adds the records q keeps to page and
// advances its cursor. It returns how many messages it read and the pending
// count after the last one.
func (l *Ledger) listBatch(ctx context.Context, cons jetstream.Consumer, n int, q *Query, now time.Time, page *Page) (int, uint64, error) {
	batch, err := cons.FetchNoWait(n)
	if err != nil {
		return 0, 0, err
	}
	got, pending := 0, uint64(0)
	for {
		var msg jetstream.Msg
		select {
		case <-ctx.Done():
			return got, pending, ctx.Err()
		case m, ok := <-batch.Messages():
			if !ok {
				if err := batch.Error(); err != nil && !errors.Is(err, jetstream.ErrNoMessages) {
					return got, pending, err
				}
				return got, pending, nil
			}
			msg = m
		}
		meta, err := msg.Metadata()
		if err != nil {
			return got, pending, err
		}
		got++
		pending = meta.NumPending
		page.Next = meta.Sequence.Stream
		if isDeleteMarker(msg.Headers()) {
			continue
		}
		rec, err := DecodeRecord(msg.Data())
		if err != nil {
			continue // not a record this package wrote
		}
		key, ok := l.keyOf(strings.TrimPrefix(msg.Subject(), l.keyPrefix))
		if !ok {
			continue // not stored under its key's KV key in this layout
		}
		if q.keep(key, rec, now) {
			ttl, _ := time.ParseDuration(msg.Headers().Get(jetstream.MsgTTLHeader))
			page.Records = append(page.Records, Listed{Key: key, Revision: meta.Sequence.Stream, Record: rec, ttl: ttl})
		}
	}
}

// keyOf returns the key a listing shows for a record found under the KV key
// stored: stored itself (a compact key in layout 2, which every method
// takes). ok is false when the ledger's layout would not store a key there
// (a full derived key in a layout-2 ledger), so that a listing never shows
// a key under which the record cannot be read.
func (l *Ledger) keyOf(stored string) (key string, ok bool) {
	sk, err := l.stored(stored)
	return stored, err == nil && sk == stored
}

// jetStream returns the ledger's JetStream context (its connection, API
// prefix or domain).
func (l *Ledger) jetStream() (jetstream.JetStream, error) { return l.js, nil }
