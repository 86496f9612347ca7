package worker

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/internal/natstest"
	"github.com/idemgate/idemgate/pkg/effects"
	"github.com/idemgate/idemgate/pkg/intent"
)

// A tool's schema binds every publisher, not only the front doors that
// validate before they publish: args that do not match are rejected and
// nothing fires.
func TestArgsAreCheckedAgainstTheToolsSchema(t *testing.T) {
	t.Parallel()
	var fired atomic.Int32
	b := start(t, Config{}, &effects.Tool{Name: "send_email",
		Schema: json.RawMessage(`{"type":"object","properties":{"to":{"type":"string"}},"required":["to"]}`),
		Effect: effects.EffectFunc(func(context.Context, effects.Call) (effects.Outcome, error) {
			fired.Add(1)
			return effects.Outcome{Result: json.RawMessage(`1`), Invocations: 1}, nil
		})})
	nc := natstest.Connect(t, b.url)
	for _, args := range []string{`{"to":5}`, `{}`} {
		res := sendRaw(t, nc, "send_email", args)
		require.Equal(t, intent.StatusRejected, res.Status, args)
		require.Equal(t, intent.CodeInvalidIntent, res.Error.Code)
		require.Contains(t, res.Error.Message, "schema", args)
	}
	require.Equal(t, intent.StatusCompleted, sendRaw(t, nc, "send_email", `{"to":"a@b.c"}`).Status)
	require.EqualValues(t, 1, fired.Load())
}
