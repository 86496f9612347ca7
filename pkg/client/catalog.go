package client

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

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

// spec returns tool's key derivation: configured with WithKeySpec, else
// learned from the catalogue (once), else the default derivation.
func (c *Client) spec(ctx context.Context, tool string) intent.KeySpec {
	c.mu.Lock()
	spec, ok := c.specs[tool]
	c.mu.Unlock()
	if ok {
		return spec
	}
	cat, err := c.Tools(ctx)
	c.mu.Lock()
	defer c.mu.Unlock()
	if err == nil {
		for _, t := range cat.Tools {
			if _, set := c.specs[t.Name]; !set {
				c.specs[t.Name] = t.KeySpec()
			}
		}
	}
	if _, ok := c.specs[tool]; !ok {
		// Unknown to the catalogue (or no catalogue): the default derivation.
		// Remembered so later calls don't ask again.
		c.specs[tool] = intent.KeySpec{}
	}
	return c.specs[tool]
}
