package client

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/internal/natstest"
	"github.com/idemgate/idemgate/pkg/intent"
)

// A refresh of the catalogue that the workers are slow to answer (an
// unknown tool name forces one) holds up no call of a tool the catalogue
// knows; the callers that need the new answer get it from the one request
// in flight.
func TestSlowCatalogueRefreshBlocksNoKnownTool(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	nc := natstest.Connect(t, s.ClientURL())
	cl, err := New(nc)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// The workers' catalogue service: the first request is answered at
	// once; later ones only when released, with a new tool.
	asked := make(chan struct{}, 8)
	release := make(chan struct{})
	var requests atomic.Int32
	workers := natstest.Connect(t, s.ClientURL())
	_, err = workers.Subscribe(cl.Names().ToolsSubject, func(m *nats.Msg) {
		n := requests.Add(1)
		cat := intent.Catalog{Tools: []intent.ToolInfo{{Name: "known", Class: "unsafe", Ledger: true}}}
		if n > 1 {
			asked <- struct{}{}
			<-release
			cat.Tools = append(cat.Tools, intent.ToolInfo{Name: "new_tool", Class: "unsafe", Ledger: true})
		}
		data, _ := json.Marshal(cat)
		_ = m.Respond(data)
	})
	require.NoError(t, err)
	require.NoError(t, workers.Flush())

	c := cl.cat
	_, ok, err := c.tool(ctx, "known")
	require.NoError(t, err)
	require.True(t, ok)
	// Time passes: the catalogue is stale and may be asked again.
	c.mu.Lock()
	c.at, c.asked = c.at.Add(-time.Minute), c.asked.Add(-time.Minute)
	c.mu.Unlock()

	type found struct {
		ok  bool
		err error
	}
	unknown := make(chan found, 2)
	for range 2 {
		go func() {
			_, ok, err := c.tool(ctx, "new_tool")
			unknown <- found{ok, err}
		}()
	}
	select {
	case <-asked:
	case <-ctx.Done():
		t.Fatal("no refresh reached the workers")
	}
	// While the workers have not answered: a known tool is answered.
	_, ok, err = c.tool(ctx, "known")
	require.NoError(t, err)
	require.True(t, ok)
	select {
	case f := <-unknown:
		t.Fatalf("a call of the new tool ended before the workers answered: %+v", f)
	default:
	}
	close(release)
	for range 2 {
		f := <-unknown
		require.NoError(t, f.err)
		require.True(t, f.ok, "the new tool, from the refresh's answer")
	}
	require.EqualValues(t, 2, requests.Load(), "one request for both callers")
}
