package client

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/idemgate/idemgate/pkg/dedup"
	"github.com/idemgate/idemgate/pkg/intent"
)

// catalogTimeout bounds a request to the workers' tool catalogue.
const catalogTimeout = 2 * time.Second

// Tools asks the workers' tool catalogue which tools exist and how each
// derives its keys.
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

// forgetSpec drops what the catalogue said of tool, so that the next
// submission asks it again.
func (c *Client) forgetSpec(tool string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if ts, ok := c.specs[tool]; ok && ts.learned {
		delete(c.specs, tool)
	}
}

// spec returns tool's key derivation: configured with WithKeySpec, else
// learned from the catalogue, else the default derivation. An answer from the
// catalogue is remembered; without one the default is used for this call only.
func (c *Client) spec(ctx context.Context, tool string) toolSpec {
	c.mu.Lock()
	ts, ok := c.specs[tool]
	c.mu.Unlock()
	if ok {
		return ts
	}
	cat, err := c.Tools(ctx)
	if err != nil {
		return toolSpec{learned: true} // the default, for this call only
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, t := range cat.Tools {
		if _, set := c.specs[t.Name]; !set {
			c.specs[t.Name] = toolSpec{key: t.KeySpec(), noLedger: !t.Ledger, learned: true,
				leaseFor:    time.Duration(t.LeaseSeconds * float64(time.Second)),
				retryFailed: t.OnFailure == intent.OnFailureRetry, rejectRepeat: t.OnComplete == intent.OnCompleteReject}
		}
	}
	if _, ok := c.specs[tool]; !ok {
		c.specs[tool] = toolSpec{learned: true} // unknown to the workers: they will say so
	}
	return c.specs[tool]
}
