package worker

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/internal/natstest"
	"github.com/idemgate/idemgate/pkg/audit"
	"github.com/idemgate/idemgate/pkg/effects"
	"github.com/idemgate/idemgate/pkg/intent"
)

// Config.DisableTrail keeps the receipts and writes no trail; by default a
// worker writes both. The bench's audit scenario reads its rows so.
func TestDisableTrailKeepsTheReceipts(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name        string
		cfg         Config
		trail, sign bool
	}{
		{"default", Config{}, true, true},
		{"DisableTrail", Config{DisableTrail: true}, false, true},
		{"DisableAudit", Config{DisableAudit: true}, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tool := &effects.Tool{Name: "send", Effect: effects.EffectFunc(func(ctx context.Context, c effects.Call) (effects.Outcome, error) {
				return effects.Outcome{Result: json.RawMessage(`{"sent":true}`), Invocations: 1}, nil
			})}
			b := start(t, tc.cfg, tool)
			res := submit(t, b.client, "send", `{"to":"a@example.com"}`)
			require.Equal(t, intent.StatusCompleted, res.Status)
			// A stopped worker has written what its trail held: what the
			// trail shows now is all it will show.
			require.NoError(t, b.stop())

			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			js, err := jetstream.New(natstest.Connect(t, b.url))
			require.NoError(t, err)
			names := b.worker.Names()
			if tc.sign {
				keys, err := audit.PublishedKeys(ctx, js, names)
				require.NoError(t, err)
				_, err = audit.VerifyReceipt(*res, keys)
				require.NoError(t, err, "the answer's receipt verifies")
			} else {
				require.Empty(t, res.Receipt)
			}

			lines, err := audit.History(ctx, js, names, b.worker.res.partitions, res.Key, time.Time{})
			if !tc.trail {
				require.Zero(t, len(lines), "no trail is written, but it holds %d entries of the key (%v)", len(lines), err)
				return
			}
			require.NoError(t, err)
			var kinds []audit.Kind
			for _, l := range lines {
				var e struct{ Event audit.Event }
				require.NoError(t, json.Unmarshal(l, &e))
				kinds = append(kinds, e.Event.Kind)
			}
			require.Equal(t, []audit.Kind{audit.KindFired, audit.KindOutcome}, kinds)
		})
	}
}
