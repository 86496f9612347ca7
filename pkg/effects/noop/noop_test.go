package noop_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/idemgate/idemgate/pkg/effects"
	"github.com/idemgate/idemgate/pkg/effects/noop"
)

func TestNoop(t *testing.T) {
	t.Parallel()
	call := effects.Call{Key: "demo_echo.1", Tool: "demo_echo", Args: json.RawMessage(`{"a":1}`)}

	t.Run("Echo", func(t *testing.T) {
		t.Parallel()
		n, err := noop.New(noop.Config{})
		require.NoError(t, err)
		out, err := n.Fire(context.Background(), call)
		require.NoError(t, err)
		require.JSONEq(t, `{"echo":{"a":1}}`, string(out.Result))
		require.Equal(t, 1, out.Invocations)
	})

	t.Run("ConfiguredResult", func(t *testing.T) {
		t.Parallel()
		n, err := noop.New(noop.Config{Result: json.RawMessage(`{"ok":true}`)})
		require.NoError(t, err)
		out, err := n.Fire(context.Background(), call)
		require.NoError(t, err)
		require.JSONEq(t, `{"ok":true}`, string(out.Result))
	})

	t.Run("Delay", func(t *testing.T) {
		t.Parallel()
		n, err := noop.New(noop.Config{Delay: 20 * time.Millisecond})
		require.NoError(t, err)
		require.Equal(t, 20*time.Millisecond, n.MaxDuration())
		start := time.Now()
		_, err = n.Fire(context.Background(), call)
		require.NoError(t, err)
		require.GreaterOrEqual(t, time.Since(start), 20*time.Millisecond)
	})

	t.Run("CancelDuringDelay", func(t *testing.T) {
		t.Parallel()
		n, err := noop.New(noop.Config{Delay: time.Hour})
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		out, err := n.Fire(ctx, call)
		require.ErrorIs(t, err, context.Canceled)
		require.Equal(t, 0, out.Invocations)
		_, perm := effects.IsPermanent(err)
		require.False(t, perm)
	})

	t.Run("Invalid", func(t *testing.T) {
		t.Parallel()
		_, err := noop.New(noop.Config{Delay: -time.Second, Result: json.RawMessage(`{`)})
		require.ErrorContains(t, err, "negative")
		require.ErrorContains(t, err, "not valid JSON")
	})
}

var (
	_ effects.Effect  = (*noop.Effect)(nil)
	_ effects.Bounded = (*noop.Effect)(nil)
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
