package client

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"github.com/idemgate/idemgate/pkg/argschema"
	"github.com/idemgate/idemgate/pkg/dedup"
	"github.com/idemgate/idemgate/pkg/intent"
)

// catalogTimeout bounds a request to the workers' tool catalogue.
const catalogTimeout = 2 * time.Second

// How long the client uses a catalogue answer before it asks again, and how
// soon a tool the catalogue lacks makes it ask again.
const (
	CatalogFresh = 10 * time.Second
	CatalogRetry = time.Second
)

// Tools asks the workers' tool catalogue which tools exist and how each
// derives its keys: a request every time. Catalog and Tool answer from the
// catalogue the client remembers.
func (c *Client) Tools(ctx context.Context) (intent.Catalog, error) {
	ctx, cancel := context.WithTimeout(ctx, catalogTimeout)
	defer cancel()
	m, err := c.nc.RequestWithContext(ctx, c.names.ToolsSubject, nil)
	if err != nil {
		return intent.Catalog{}, fmt.Errorf("client: tool catalogue %s: %w", c.names.ToolsSubject, err)
	}
	var cat intent.Catalog
	if err := json.Unmarshal(m.Data, &cat); err != nil {
		return intent.Catalog{}, fmt.Errorf("client: tool catalogue: %w", err)
	}
	return cat, nil
}

// Catalog returns the workers' tool catalogue as the client remembers it,
// asking the workers when the answer it has is older than maxAge and waiting
// for theirs. When they do not answer, the last answer is used; with none it
// is an error. A maxAge of 0 always asks, and their silence is an error.
func (c *Client) Catalog(ctx context.Context, maxAge time.Duration) (intent.Catalog, error) {
	return c.cat.get(ctx, maxAge)
}

// Tool returns the catalogue's entry for the tool name and whether the
// catalogue lists it. A tool the remembered catalogue lists is answered at
// once, even from an answer older than CatalogFresh (which starts a new
// request, not waited for); one it lacks makes the client ask the workers
// again, at most once per CatalogRetry, in case the tool is new, and wait
// for their answer. The error is the workers' silence when the client has
// no answer of theirs at all.
func (c *Client) Tool(ctx context.Context, name string) (intent.ToolInfo, bool, error) {
	return c.cat.tool(ctx, name)
}

// catalogue is the workers' tool catalogue, remembered for a while: the one
// copy of it a client keeps, which its submissions learn key specs from and
// the front doors look tools up in. One request to the workers at a time
// refreshes it (single flight), and no lock is held across that request: a
// lookup of a tool the catalogue knows never waits for it, and lookups that
// need the new answer wait for the one request in flight.
type catalogue struct {
	fetch  func(ctx context.Context) (intent.Catalog, error)
	mu     sync.Mutex
	cat    intent.Catalog
	byName map[string]intent.ToolInfo
	at     time.Time   // when cat was fetched; zero before the first answer
	asked  time.Time   // when the latest refresh started
	flight *refreshing // the refresh in flight; nil when none
	// schemas checks args against the schemas the catalogue gives.
	schemas argschema.Schemas
}

// refreshing is one request to the workers; done is closed once it ended,
// with err its failure.
type refreshing struct {
	done chan struct{}
	err  error
}

// get is Client.Catalog: a request already in flight is joined.
func (c *catalogue) get(ctx context.Context, maxAge time.Duration) (intent.Catalog, error) {
	c.mu.Lock()
	if !c.at.IsZero() && time.Since(c.at) < maxAge {
		defer c.mu.Unlock()
		return c.cat, nil
	}
	f := c.refreshLocked()
	c.mu.Unlock()
	select {
	case <-f.done:
	case <-ctx.Done():
		return intent.Catalog{}, ctx.Err()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.at.IsZero() || (maxAge <= 0 && f.err != nil) {
		return intent.Catalog{}, f.err
	}
	return c.cat, nil
}

// refreshLocked returns the refresh in flight, starting one if there is
// none. The request runs on its own goroutine, bounded by catalogTimeout,
// so that a caller who leaves does not end it for the others. c.mu must be
// held.
func (c *catalogue) refreshLocked() *refreshing {
	if c.flight != nil {
		return c.flight
	}
	f := &refreshing{done: make(chan struct{})}
	c.flight, c.asked = f, time.Now()
	go func() {
		cat, err := c.fetch(context.Background())
		c.mu.Lock()
		defer c.mu.Unlock()
		if err == nil {
			c.cat, c.at, c.byName = cat, time.Now(), map[string]intent.ToolInfo{}
			for _, t := range cat.Tools {
				c.byName[t.Name] = t
			}
		}
		f.err, c.flight = err, nil
		close(f.done)
	}()
	return f
}

// tool is Client.Tool.
func (c *catalogue) tool(ctx context.Context, name string) (intent.ToolInfo, bool, error) {
	c.mu.Lock()
	if t, ok := c.byName[name]; ok {
		if time.Since(c.at) >= CatalogFresh {
			c.refreshLocked()
		}
		c.mu.Unlock()
		return t, true, nil
	}
	var f *refreshing
	switch {
	case c.flight != nil:
		f = c.flight
	case c.at.IsZero() || time.Since(c.asked) >= CatalogRetry:
		f = c.refreshLocked()
	}
	c.mu.Unlock()
	if f == nil {
		return intent.ToolInfo{}, false, nil // asked less than CatalogRetry ago
	}
	select {
	case <-f.done:
	case <-ctx.Done():
		return intent.ToolInfo{}, false, ctx.Err()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.at.IsZero() {
		return intent.ToolInfo{}, false, f.err
	}
	t, ok := c.byName[name]
	return t, ok, nil
}

// toolSpec is what the client needs to know of a tool.
type toolSpec struct {
	key      intent.KeySpec
	noLedger bool          // reads and ledger-less idempotent tools: no Nats-Msg-Id, no ledger watch
	leaseFor time.Duration // the tool's lease, from the catalogue; 0: unknown
	learned  bool          // not set WithKeySpec: learned from the catalogue, or the default for want of it
	// retryFailed: a failure is no answer for a later call, which runs the
	// operation again (intent.OnFailureRetry), so its intents must reach a
	// worker: no Nats-Msg-Id.
	retryFailed bool
	// rejectRepeat: a completion another call caused is answered
	// already_done (intent.OnCompleteReject).
	rejectRepeat bool
}

// lease is the tool's lease, or the default one when the catalogue did not
// say.
func (ts toolSpec) lease() time.Duration {
	if ts.leaseFor > 0 {
		return ts.leaseFor
	}
	return dedup.DefaultLease
}

// spec returns tool's key derivation (see learn).
func (c *Client) spec(ctx context.Context, tool string) toolSpec {
	ts, _, _, _ := c.learn(ctx, tool)
	return ts
}

// learn returns tool's key derivation — configured with WithKeySpec (the
// catalogue is then not asked), else learned from the catalogue (Tool),
// else the default derivation: for a tool the catalogue does not list (the
// workers will say so), or when no worker answered (err) — and the
// catalogue's entry, when it lists the tool (known).
func (c *Client) learn(ctx context.Context, tool string) (ts toolSpec, info intent.ToolInfo, known bool, err error) {
	c.mu.Lock()
	set, ok := c.specs[tool]
	c.mu.Unlock()
	if ok {
		return set, intent.ToolInfo{}, false, nil // the catalogue is not asked
	}
	info, known, err = c.cat.tool(ctx, tool)
	if err != nil || !known {
		return toolSpec{learned: true}, intent.ToolInfo{}, false, err
	}
	return toolSpec{key: info.KeySpec(), noLedger: !info.Ledger, learned: true,
		leaseFor:    time.Duration(info.LeaseSeconds * float64(time.Second)),
		retryFailed: info.OnFailure == intent.OnFailureRetry, rejectRepeat: info.OnComplete == intent.OnCompleteReject}, info, known, nil
}

// relearnSpec asks the catalogue again and returns tool's key derivation
// from its answer (see spec).
func (c *Client) relearnSpec(ctx context.Context, tool string) toolSpec {
	_, _ = c.cat.get(ctx, 0) // without an answer, the one remembered
	return c.spec(ctx, tool)
}
