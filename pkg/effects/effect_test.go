package effects_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/idemgate/idemgate/pkg/effects"
	"github.com/idemgate/idemgate/pkg/intent"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

var _ effects.Effect = effects.EffectFunc(nil)

func TestEffectFunc(t *testing.T) {
	t.Parallel()
	f := effects.EffectFunc(func(_ context.Context, call effects.Call) (effects.Outcome, error) {
		return effects.Outcome{Result: json.RawMessage(`"` + call.Key + `"`), Invocations: 1}, nil
	})
	out, err := f.Fire(context.Background(), effects.Call{Key: "k1"})
	require.NoError(t, err)
	require.JSONEq(t, `"k1"`, string(out.Result))
	require.Equal(t, 1, out.Invocations)
}

func TestPermanentError(t *testing.T) {
	t.Parallel()

	t.Run("Permanent", func(t *testing.T) {
		t.Parallel()
		err := effects.Permanent("", "mailbox does not exist")
		require.ErrorIs(t, err, effects.ErrPermanent)
		pe, ok := effects.IsPermanent(err)
		require.True(t, ok)
		require.Equal(t, intent.CodeEffectFailed, pe.Code)
		require.Equal(t, "effect_failed: mailbox does not exist", err.Error())
		require.Equal(t, intent.Error{Code: intent.CodeEffectFailed, Message: "mailbox does not exist"}, pe.IntentError())
	})

	t.Run("PermanentfWraps", func(t *testing.T) {
		t.Parallel()
		cause := errors.New("550 no such user")
		err := fmt.Errorf("send: %w", effects.Permanentf("bad_address", "deliver to %s: %w", "a@b", cause))
		require.ErrorIs(t, err, effects.ErrPermanent)
		require.ErrorIs(t, err, cause)
		pe, ok := effects.IsPermanent(err)
		require.True(t, ok)
		require.Equal(t, "bad_address", pe.Code)
		require.Equal(t, "deliver to a@b: 550 no such user", pe.Message)
		require.Equal(t, "bad_address: deliver to a@b: 550 no such user", pe.Error())
	})

	t.Run("UnderlyingShown", func(t *testing.T) {
		t.Parallel()
		pe := &effects.PermanentError{Message: "rejected", Err: errors.New("quota")}
		require.Equal(t, "effect_failed: rejected: quota", pe.Error())
	})

	t.Run("TransientIsNot", func(t *testing.T) {
		t.Parallel()
		for _, err := range []error{errors.New("boom"), context.Canceled, effects.ErrExhausted, nil} {
			_, ok := effects.IsPermanent(err)
			require.False(t, ok)
			require.NotErrorIs(t, err, effects.ErrPermanent)
		}
	})
}

func TestErrorMessagesAreCapped(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("é", 3000)
	e := effects.Permanent("", long).(*effects.PermanentError).IntentError()
	require.LessOrEqual(t, len(e.Message), effects.MaxErrorMessage)
	require.True(t, strings.HasSuffix(e.Message, "…"))
	require.Equal(t, "short", effects.TruncateMessage("short", 10))
	require.Equal(t, "ab…", effects.TruncateMessage("abcdef", 5))
	require.Equal(t, "\uFFFD", effects.TruncateMessage("\xff", 10))
}

func TestReservedHeader(t *testing.T) {
	t.Parallel()
	for name, want := range map[string]bool{
		"Idempotency-Key": true,
		"idempotency-key": true,
		"Idem-Tool":       true,
		"IDEM-SESSION":    true,
		"idem-call-id":    true,
		"Idem-Holder":     true,
		"Idem-Attempt":    true,
		"Idem-Anything":   true,
		"Authorization":   false,
		"X-Idem-Tool":     false,
		"Idem":            false,
		"Idempotency":     false,
	} {
		require.Equal(t, want, effects.ReservedHeader(name), name)
	}
	for name := range (effects.Call{Key: "k", Tool: "t", Session: "s", CallID: "c", Holder: "h", Attempt: 1}).Headers() {
		require.True(t, effects.ReservedHeader(name), "%s, a header the effects set, is reserved", name)
	}
}
