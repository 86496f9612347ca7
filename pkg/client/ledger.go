package client

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idemgate/idemgate/pkg/dedup"
	"github.com/idemgate/idemgate/pkg/intent"
	"github.com/idemgate/idemgate/pkg/retry"
)

// ledgerAnswer is what a watch of the ledger key came to.
type ledgerAnswer struct {
	rec dedup.Record
	err error
}

// Get reads key's ledger record (from the stream leader). It returns
// ErrNotFound when there is none.
func (c *Client) Get(ctx context.Context, key string) (dedup.Record, error) {
	rec, err := c.get(ctx, key)
	if errors.Is(err, dedup.ErrNotFound) {
		return rec, fmt.Errorf("%w: %s", ErrNotFound, key)
	}
	return rec, err
}

// get reads key's record from the ledger as it is shaped now: a read that
// misses looks at the ledger's recorded shape again, and reads once more
// when a migration changed it.
func (c *Client) get(ctx context.Context, key string) (dedup.Record, error) {
	r, err := c.reader(ctx)
	if err != nil {
		return dedup.Record{}, err
	}
	rec, _, err := r.Get(ctx, key)
	if !errors.Is(err, dedup.ErrNotFound) {
		return rec, err
	}
	now, rerr := c.readerAsOf(ctx, time.Now(), true) // a look begun after the miss
	if rerr != nil {
		return dedup.Record{}, rerr
	}
	if now == r {
		return rec, err
	}
	rec, _, err = now.Get(ctx, key)
	return rec, err
}

// Watch waits until key's record has an answered status and returns it.
// When an operator forgets the operation meanwhile (or had forgotten it), it
// returns the forgotten record with an error matching ErrForgotten.
func (c *Client) Watch(ctx context.Context, key string) (dedup.Record, error) {
	rec, err := c.waitLedger(ctx, key, func(rec dedup.Record) bool { return rec.Status.Answered() || rec.Status == intent.StatusForgotten })
	if err != nil {
		if ctx.Err() != nil {
			return dedup.Record{}, fmt.Errorf("%w for %s: %w", ErrNoAnswer, key, ctx.Err())
		}
		return dedup.Record{}, fmt.Errorf("client: %w", err)
	}
	return rec, forgottenErr(key, rec)
}

// forgottenErr is the error of a watch that ended at rec, key's record: one
// matching ErrForgotten when rec is forgotten, nil otherwise.
func forgottenErr(key string, rec dedup.Record) error {
	if rec.Status != intent.StatusForgotten {
		return nil
	}
	return fmt.Errorf("%w: %s: %s", ErrForgotten, key, rec.ForgottenText())
}

// WatchFinal waits until key's record has a final status (completed, failed,
// denied) and returns it; unlike Watch it goes on past awaiting_approval and
// uncertain. A key with no record yet is waited for. When an operator
// forgets the operation meanwhile (or had forgotten it), it returns the
// forgotten record with an error matching ErrForgotten. When ctx ends first it
// returns the latest record seen (or the zero record when none was) with an
// error matching ErrNoAnswer.
func (c *Client) WatchFinal(ctx context.Context, key string) (dedup.Record, error) {
	var last dedup.Record
	rec, err := c.waitLedger(ctx, key, func(rec dedup.Record) bool {
		last = rec
		return rec.Status.Final() || rec.Status == intent.StatusForgotten
	})
	if err != nil {
		if ctx.Err() != nil {
			return last, fmt.Errorf("%w for %s: %w", ErrNoAnswer, key, ctx.Err())
		}
		return last, fmt.Errorf("client: %w", err)
	}
	return rec, forgottenErr(key, rec)
}

// waitLedger waits for key's record to satisfy accept: it reads the key
// first (a direct get, Ledger.Peek) and watches the ledger only when that
// read shows no record accept takes — a watch (dedup.Ledger.WaitFor: a
// subscription to the key's subject and leader reads, no consumer) costs a
// subscription and more reads. A ledger that cannot be
// reached is watched again, backing off,
// until ctx ends: a caller outlives an outage of the ledger. A migration of
// the ledger (its shape changed, or marked as under way) moves the watch to
// the key's new place once it is done. A ledger whose key layout this client
// does not know is reported at once.
func (c *Client) waitLedger(ctx context.Context, key string, accept func(dedup.Record) bool) (dedup.Record, error) {
	pauses := retry.Doubling(ctx, 250*time.Millisecond, 5*time.Second)
	for {
		r, err := c.reader(ctx)
		if errors.Is(err, dedup.ErrLayout) {
			return dedup.Record{}, err
		}
		if err == nil {
			if rec, _, ok := r.Peek(ctx, key); ok && accept(rec) {
				return rec, nil
			}
			var rec dedup.Record
			rec, err = c.waitOn(ctx, r, key, accept)
			switch {
			case err == nil, errors.Is(err, dedup.ErrInvalid):
				return rec, err
			case errors.Is(err, errReshaped):
				continue // opened again in its new shape: watch there at once
			}
		}
		if !retry.Wait(ctx, pauses) {
			return dedup.Record{}, ctx.Err()
		}
	}
}

// errReshaped: a watch ended because the ledger's shape is no longer the
// one it watched in.
var errReshaped = errors.New("client: the ledger's shape changed")

// waitOn watches key on r until its record satisfies accept. Every
// shapeRecheck it asks whether r is still the ledger's shape: a key whose
// partition or KV key a migration moved would never be answered where it
// was watched, so it ends the watch with errReshaped (or the migration's
// error while one is under way).
func (c *Client) waitOn(ctx context.Context, r *dedup.Ledger, key string, accept func(dedup.Record) bool) (dedup.Record, error) {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan ledgerAnswer, 1)
	go func() {
		rec, _, err := r.WaitFor(wctx, key, accept)
		done <- ledgerAnswer{rec, err}
	}()
	tick := time.NewTicker(shapeRecheck)
	defer tick.Stop()
	for {
		select {
		case a := <-done:
			return a.rec, a.err
		case <-tick.C:
			now, err := c.reader(ctx)
			if errors.Is(err, dedup.ErrMigrating) || (err == nil && now != r) {
				cancel()
				if a := <-done; a.err == nil {
					return a.rec, nil // answered meanwhile
				}
				if err != nil {
					return dedup.Record{}, err
				}
				return dedup.Record{}, errReshaped
			}
		}
	}
}

// shapeRecheck is how often a client looks at the shape the ledger records
// (its partition count and key layout, which a migration changes under
// running clients) while it uses the ledger; a read that misses looks too.
const shapeRecheck = 5 * time.Second

// reader returns the client's ledger — its reads' and Forget's, one open
// (dedup.Bind) serving both — opening it on first use, and again when the
// ledger's recorded shape is no longer the one it was opened in (looked at
// once per shapeRecheck).
func (c *Client) reader(ctx context.Context) (*dedup.Ledger, error) {
	return c.readerAsOf(ctx, time.Now().Add(-shapeRecheck), false)
}

// readerAsOf is reader, looking at the ledger's shape unless a look that
// began at since or later found it unchanged (concurrent callers share one
// look). A caller that finds another's look under way goes on with the
// reader it has, unless it waits for the look's outcome (a read that
// missed); the first open is waited for.
func (c *Client) readerAsOf(ctx context.Context, since time.Time, wait bool) (*dedup.Ledger, error) {
	c.mu.Lock()
	r, due := c.ledger, c.shapeAt.Before(since)
	c.mu.Unlock()
	if r != nil && !due {
		return r, nil
	}
	if r != nil && !wait {
		if !c.shapeMu.TryLock() {
			return r, nil // another caller is looking
		}
	} else {
		c.shapeMu.Lock()
	}
	defer c.shapeMu.Unlock()
	c.mu.Lock()
	r, due = c.ledger, c.shapeAt.Before(since)
	c.mu.Unlock()
	if r != nil && !due {
		return r, nil // looked at while this caller waited
	}
	began := time.Now()
	if r != nil {
		same, err := r.Current(ctx)
		switch {
		case err == nil && same:
			c.mu.Lock()
			c.shapeAt = began
			c.mu.Unlock()
			return r, nil
		case errors.Is(err, dedup.ErrMigrating):
			c.mu.Lock()
			c.ledger = nil // open it again once the migration is done
			c.mu.Unlock()
			return nil, fmt.Errorf("client: ledger bucket %s: %w", c.names.Bucket, err)
		case err != nil:
			return r, nil // cannot tell now: the reads say what is wrong
		}
	}
	nr, err := dedup.Open(ctx, c.js, dedup.BucketConfig{Bucket: c.names.Bucket}, dedup.Bind())
	if err != nil {
		return nil, fmt.Errorf("client: ledger bucket %s: %w", c.names.Bucket, err)
	}
	c.mu.Lock()
	c.ledger, c.shapeAt = nr, began
	c.mu.Unlock()
	return nr, nil
}
