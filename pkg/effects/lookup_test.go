package effects_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/pkg/effects"
	"github.com/idemgate/idemgate/pkg/effects/noop"
)

func TestNewRegistry(t *testing.T) {
	t.Parallel()
	noop, err := noop.New(noop.Config{Delay: time.Second})
	require.NoError(t, err)
	r, err := effects.NewRegistry(&effects.Tool{Name: "b", Kind: "noop", Effect: noop}, &effects.Tool{Name: "a", Effect: effects.EffectFunc(nil)})
	require.NoError(t, err)
	require.Equal(t, []string{"a", "b"}, r.Names())
	b, _ := r.Lookup("b")
	require.Equal(t, effects.DefaultLease, b.Lease)
	require.Equal(t, time.Second, b.MaxDuration)

	_, err = effects.NewRegistry(
		&effects.Tool{Name: "Bad", Effect: noop},
		&effects.Tool{Name: "x"},
		&effects.Tool{Name: "y", Effect: noop}, &effects.Tool{Name: "y", Effect: noop},
		&effects.Tool{Name: "z", Effect: noop, Lease: time.Millisecond},
	)
	require.ErrorContains(t, err, `"Bad"`)
	require.ErrorContains(t, err, `"x" has no effect`)
	require.ErrorContains(t, err, `"y" defined twice`)
	require.ErrorContains(t, err, `"z": lease 1ms is under 1s`)
}

func TestNewRegistryDefaultsThePolicy(t *testing.T) {
	t.Parallel()
	tool := &effects.Tool{Name: "x", Effect: effects.EffectFunc(nil)}
	_, err := effects.NewRegistry(tool)
	require.NoError(t, err)
	require.Equal(t, effects.DefaultPolicy(), tool.Policy)
}

func TestUnknownTool(t *testing.T) {
	t.Parallel()
	var tools []*effects.Tool
	for _, name := range []string{"send_email", "create_ticket", "refund"} {
		tools = append(tools, &effects.Tool{Name: name, Effect: effects.EffectFunc(nil)})
	}
	r, err := effects.NewRegistry(tools...)
	require.NoError(t, err)
	for name, want := range map[string]string{
		"send_emial": "send_email", "send-email": "send_email", "SendEmail": "send_email", "create_tickets": "create_ticket",
		"refnud": "refund", "refund": "", "charge_card": "", "x": "",
	} {
		require.Equal(t, want, r.Closest(name), name)
	}
	err = r.UnknownTool("send_emial")
	require.ErrorIs(t, err, effects.ErrUnknownTool)
	require.EqualError(t, err, `no tool "send_emial" is configured; did you mean "send_email"?`)
	require.EqualError(t, r.UnknownTool("charge_card"), `no tool "charge_card" is configured (configured: create_ticket, refund, send_email)`)
}
