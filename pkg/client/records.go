package client

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/idemgate/idemgate/pkg/audit"
	"github.com/idemgate/idemgate/pkg/dedup"
	"github.com/idemgate/idemgate/pkg/intent"
)

var (
	// ErrInFlight: Forget refused an operation that may be firing right now
	// (dedup.ErrInFlight: pending with a live lease, approved, or pending
	// past its lease with a holder that is alive).
	ErrInFlight = errors.New("client: operation in flight")
	// ErrUnresolved: Forget, not forced, refused an unresolved operation
	// (dedup.ErrUnresolved); the message says what forcing it risks.
	ErrUnresolved = errors.New("client: operation unresolved")
)

// Records returns one page of the ledger's records that q selects, in the
// order they were last written; pass the page's Next as q.After for the
// next one (see dedup.Ledger.List for what a page costs). An operator finds
// every open operation with q.Statuses = dedup.OpenStatuses.
func (c *Client) Records(ctx context.Context, q dedup.Query) (dedup.Page, error) {
	r, err := c.reader(ctx)
	if err != nil {
		return dedup.Page{}, err
	}
	page, err := r.List(ctx, q)
	if err != nil {
		return dedup.Page{}, fmt.Errorf("client: %w", err)
	}
	return page, nil
}

// Forget replaces key's ledger record with a forgotten one (who, why, the
// old fingerprint; see dedup.Ledger.Forget), so that the operation may run
// again, and tells every worker to drop the key from its answer cache (a plain NATS
// message on Names.ForgetSubject: a worker that misses it answers from its
// cache for at most its answer-cache age). key is the operation's key or,
// in a compact ledger, its stored key. It returns the record replaced.
//
// A final record is forgotten. An unresolved one is refused with
// ErrUnresolved unless opts has Forced(), and one that may be firing
// now with ErrInFlight (see dedup.Ledger.Forget: a forced forget of a record
// pending past its lease waits one more lease, bounded by ctx). When the key
// has no record it still tells the workers, and returns ErrNotFound. It is
// the client's one write to the ledger: its NATS user needs to delete on the
// ledger's subjects (docs/security.md, the gateway role). ForgetBy names
// who forgets and why, for the audit trail.
func (c *Client) Forget(ctx context.Context, key string, opts ...ForgetOption) (dedup.Record, error) {
	var fo forgetOptions
	for _, opt := range opts {
		opt(&fo)
	}
	if key == "" {
		return dedup.Record{}, fmt.Errorf("client: %w: forget: no key", intent.ErrInvalid)
	}
	l, err := c.reader(ctx) // the ledger the client reads: Forget writes with it too
	if err != nil {
		return dedup.Record{}, err
	}
	lopts := []dedup.ForgetOption{dedup.ForgetBy(fo.by, fo.reason)}
	if fo.force {
		lopts = append(lopts, dedup.Forced())
	}
	rec, err := l.Forget(ctx, key, lopts...)
	if errors.Is(err, dedup.ErrNotFound) {
		// A miss looks at the ledger's shape again, as a read's does, and
		// forgets once more when a migration changed it.
		now, rerr := c.readerAsOf(ctx, time.Now(), true)
		if rerr != nil {
			return dedup.Record{}, rerr
		}
		if now != l {
			rec, err = now.Forget(ctx, key, lopts...)
		}
	}
	switch {
	case errors.Is(err, dedup.ErrInFlight):
		return rec, fmt.Errorf("%w: %w", ErrInFlight, err)
	case errors.Is(err, dedup.ErrUnresolved):
		return rec, fmt.Errorf("%w: %w", ErrUnresolved, err)
	case errors.Is(err, dedup.ErrNotFound):
		err = fmt.Errorf("%w: %s", ErrNotFound, key)
	case err != nil:
		return rec, fmt.Errorf("client: %w", err)
	}
	if err == nil {
		fo.deleted = rec.Fingerprint
	}
	if berr := c.broadcastForget(ctx, key, fo); berr != nil {
		return rec, berr
	}
	return rec, err
}

// ForgetOption adds to an operator's Forget.
type ForgetOption func(*forgetOptions)

type forgetOptions struct {
	force      bool
	by, reason string
	deleted    string // the fingerprint of the record deleted; "" when none was
}

// Forced forgets an unresolved operation too (pending, awaiting approval,
// uncertain): its next call may fire it again. A pending one is forgotten
// only once its record stays unchanged for one more lease after its lease ran
// out (dedup.Forced); one that may be firing now is still refused.
func Forced() ForgetOption { return func(o *forgetOptions) { o.force = true } }

// ForgetBy names who forgets the operation and why, for the forgotten
// record and the audit trail's forgotten event.
func ForgetBy(by, reason string) ForgetOption {
	return func(o *forgetOptions) { o.by, o.reason = by, reason }
}

// broadcastForget tells every worker to drop key from its answer cache
// (and one of them to record the forget in the audit trail).
func (c *Client) broadcastForget(ctx context.Context, key string, fo forgetOptions) error {
	msg := nats.NewMsg(c.names.ForgetSubject())
	msg.Data = []byte(key)
	if fo.by != "" {
		msg.Header.Set(audit.HeaderBy, headerValue(fo.by))
	}
	if fo.reason != "" {
		msg.Header.Set(audit.HeaderReason, headerValue(fo.reason))
	}
	if fo.deleted != "" {
		msg.Header.Set(audit.HeaderFingerprint, headerValue(fo.deleted))
	}
	if err := c.nc.PublishMsg(msg); err != nil {
		return fmt.Errorf("client: tell the workers to forget %s: %w", key, err)
	}
	fctx, cancel := context.WithTimeout(ctx, catalogTimeout)
	defer cancel()
	if err := c.nc.FlushWithContext(fctx); err != nil {
		return fmt.Errorf("client: tell the workers to forget %s: %w", key, err)
	}
	return nil
}

// headerValue is s fit for a NATS header: control characters (a line
// break would end the header) become spaces.
func headerValue(s string) string {
	return strings.Map(func(r rune) rune {
		if r < ' ' || r == 0x7f {
			return ' '
		}
		return r
	}, s)
}
