package client

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go"

	"github.com/idemgate/idemgate/pkg/audit"
	"github.com/idemgate/idemgate/pkg/dedup"
	"github.com/idemgate/idemgate/pkg/intent"
)

// ErrInFlight: Forget refused an operation that may be firing right now
// (pending with a live lease, or approved).
var ErrInFlight = errors.New("client: operation in flight")

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

// Forget deletes key's ledger record, so that the operation may run again,
// and tells every worker to drop the key from its answer cache (a plain NATS
// message on Names.ForgetSubject: a worker that misses it answers from its
// cache for at most its answer-cache age). It returns the record removed. It
// refuses an operation that may be firing now (ErrInFlight). When the key
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
	l, err := c.writer(ctx)
	if err != nil {
		return dedup.Record{}, err
	}
	rec, err := l.Forget(ctx, key)
	switch {
	case errors.Is(err, dedup.ErrInFlight):
		return rec, fmt.Errorf("%w: %w", ErrInFlight, err)
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

// WatchFinal waits until key's record has a final status (completed, failed,
// denied) and returns it; unlike Watch it goes on past awaiting_approval and
// uncertain. A key with no record yet is waited for. When ctx ends first it
// returns the latest record seen (or the zero record when none was) with an
// error matching ErrNoAnswer.
func (c *Client) WatchFinal(ctx context.Context, key string) (dedup.Record, error) {
	var last dedup.Record
	rec, err := c.waitLedger(ctx, key, func(rec dedup.Record) bool {
		last = rec
		return rec.Status.Final()
	})
	if err != nil {
		if ctx.Err() != nil {
			return last, fmt.Errorf("%w for %s: %w", ErrNoAnswer, key, ctx.Err())
		}
		return last, fmt.Errorf("client: %w", err)
	}
	return rec, nil
}

// writer returns a ledger the client may write with (Forget only), opening
// it on first use.
func (c *Client) writer(ctx context.Context) (*dedup.Ledger, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.forgetter != nil {
		return c.forgetter, nil
	}
	var err error
	if c.forgetter, err = dedup.Bind(ctx, c.js, c.names.Bucket); err != nil {
		return nil, fmt.Errorf("client: ledger bucket %s: %w", c.names.Bucket, err)
	}
	return c.forgetter, nil
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
