package client

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/internal/natstest"
	"github.com/idemgate/idemgate/internal/worker"
	"github.com/idemgate/idemgate/internal/worker/workertest"
	"github.com/idemgate/idemgate/pkg/effects/toolsfile"
	"github.com/idemgate/idemgate/pkg/intent"
)

// A submission derived from a key spec the workers no longer use is
// answered key_mismatch; the client asks the catalogue again, derives the
// key from the intent it built — not parsed again — under the workers'
// spec, publishes again and gets the answer.
func TestAStaleKeySpecIsRelearned(t *testing.T) {
	t.Parallel()
	srv := natstest.RunServer(t)
	reg, err := toolsfile.Parse([]byte("tools:\n  refund:\n    effect: noop\n    key_args: [order_id]\n"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = reg.Close() })
	workertest.Run(t, natstest.Connect(t, srv.ClientURL()), reg, worker.Config{})
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()

	cl, err := New(natstest.Connect(t, srv.ClientURL()))
	require.NoError(t, err)
	// The catalogue the client remembers is an older one: refund keyed by
	// all its args.
	cl.cat.mu.Lock()
	stale := intent.ToolInfo{Name: "refund", Class: intent.ClassUnsafe, Ledger: true}
	cl.cat.cat, cl.cat.at, cl.cat.byName = intent.Catalog{Tools: []intent.ToolInfo{stale}}, time.Now(), map[string]intent.ToolInfo{"refund": stale}
	cl.cat.mu.Unlock()

	env := &intent.Envelope{Tool: "refund", Args: []byte(`{ "order_id": "o-1", "note": "late" }`)}
	sub, err := cl.Publish(ctx, env)
	require.NoError(t, err)
	staleKey := sub.Key
	res, err := sub.Wait(ctx)
	require.NoError(t, err)
	require.Equal(t, intent.StatusCompleted, res.Status, "%+v", res)

	want, err := intent.Derive(env, intent.KeySpec{KeyArgs: []string{"order_id"}}, time.Time{})
	require.NoError(t, err)
	require.NotEqual(t, staleKey, want.Key)
	require.Equal(t, want.Key, sub.Key, "the workers' key")
	require.Equal(t, want.Key, res.Key)
	info, known, err := cl.Tool(ctx, "refund")
	require.NoError(t, err)
	require.True(t, known)
	require.Equal(t, []string{"order_id"}, info.KeyArgs, "the catalogue remembered is the workers' now")
}
