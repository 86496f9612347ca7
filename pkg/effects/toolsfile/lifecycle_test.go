package toolsfile

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/pkg/effects"
	"github.com/idemgate/idemgate/pkg/intent"
)

func TestRetentionParse(t *testing.T) {
	t.Parallel()
	reg, err := Parse([]byte(`tools:
  short: {effect: noop, key_args: all, retention: 1h}
  weekly: {effect: noop, key_args: all, window: 168h, retention: 192h}
  plain: {effect: noop, key_args: all}
`))
	require.NoError(t, err)
	for name, want := range map[string]time.Duration{"short": time.Hour, "weekly": 192 * time.Hour, "plain": 0} {
		tool, ok := reg.Lookup(name)
		require.True(t, ok, name)
		require.Equal(t, want, tool.Policy.Retention, name)
	}
}

func TestRetentionErrors(t *testing.T) {
	t.Parallel()
	cases := []struct{ name, tool, want string }{
		{"not a duration", `{effect: noop, retention: soon}`, `tools.yaml:2: t.retention: "soon" is not a duration`},
		{"under a second", `{effect: noop, retention: 500ms}`, `tools.yaml:2: t.retention: must be at least 1s`},
		{"fraction", `{effect: noop, retention: 1500ms}`, `tools.yaml:2: t.retention: 1.5s is not a whole number of seconds`},
		{"read", `{effect: noop, class: read, retention: 1h}`, `tools.yaml:2: t.retention: a tool without the ledger keeps no record`},
		{"shorter than the window", `{effect: noop, window: 168h, retention: 24h}`,
			`tools.yaml:2: t.retention: 24h is shorter than the tool's window (168h)`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse([]byte("tools:\n  t: " + c.tool + "\n"))
			require.ErrorContains(t, err, c.want)
		})
	}
}

func TestBudgetParse(t *testing.T) {
	t.Parallel()
	reg, err := Parse([]byte(`tools:
  send: {effect: noop, key_args: all, budget: {per: session, max: 5, window: 1h}}
  global:
    effect: noop
    key_args: all
    budget:
      per: tool
      max: 100
      window: 24h
    over_budget: approve
  defaults: {effect: noop, key_args: all, budget: {max: 3, window: 10m}}
  plain: {effect: noop, key_args: all}
`))
	require.NoError(t, err)
	for name, want := range map[string]effects.Budget{
		"send":     {Per: intent.BudgetPerSession, Max: 5, Window: time.Hour, OverBudget: intent.OverBudgetRefuse},
		"global":   {Per: intent.BudgetPerTool, Max: 100, Window: 24 * time.Hour, OverBudget: intent.OverBudgetApprove},
		"defaults": {Per: intent.BudgetPerSession, Max: 3, Window: 10 * time.Minute, OverBudget: intent.OverBudgetRefuse},
		"plain":    {},
	} {
		tool, ok := reg.Lookup(name)
		require.True(t, ok, name)
		require.Equal(t, want, tool.Policy.Budget, name)
	}
	send, _ := reg.Lookup("send")
	require.Equal(t, &intent.Budget{Per: "session", Max: 5, WindowSeconds: 3600, OverBudget: "refuse"}, send.Policy.Budget.Info())
	plain, _ := reg.Lookup("plain")
	require.Nil(t, plain.Policy.Budget.Info())
}

func TestBudgetErrors(t *testing.T) {
	t.Parallel()
	cases := []struct{ name, tool, want string }{
		{"scope", `{effect: noop, budget: {per: user, max: 5, window: 1h}}`, `tools.yaml:2: t.budget.per: unknown scope "user"`},
		{"no max", `{effect: noop, budget: {window: 1h}}`, `tools.yaml:2: t.budget: has no max`},
		{"max zero", `{effect: noop, budget: {max: 0, window: 1h}}`, `tools.yaml:2: t.budget.max: 0 is not from 1 to 1000`},
		{"max huge", `{effect: noop, budget: {max: 1001, window: 1h}}`, `tools.yaml:2: t.budget.max: 1001 is not from 1 to 1000`},
		{"max text", `{effect: noop, budget: {max: five, window: 1h}}`, `tools.yaml:2: t.budget.max: "five" is not a whole number`},
		{"no window", `{effect: noop, budget: {max: 5}}`, `tools.yaml:2: t.budget: has no window`},
		{"short window", `{effect: noop, budget: {max: 5, window: 10ms}}`, `tools.yaml:2: t.budget.window: must be at least 1s`},
		{"fraction", `{effect: noop, budget: {max: 5, window: 1500ms}}`, `tools.yaml:2: t.budget.window: 1.5s is not a whole number of seconds`},
		{"unknown field", `{effect: noop, budget: {max: 5, window: 1h, burst: 2}}`, `tools.yaml:2: t.budget.burst: unknown field`},
		{"not a mapping", `{effect: noop, budget: 5}`, `tools.yaml:2: t.budget: is`},
		{"over_budget value", `{effect: noop, budget: {max: 5, window: 1h}, over_budget: ask}`, `tools.yaml:2: t.over_budget: unknown policy "ask"`},
		{"over_budget alone", `{effect: noop, over_budget: approve}`, `tools.yaml:2: t.over_budget: is set but the tool has no budget`},
		{"read", `{effect: noop, class: read, budget: {max: 5, window: 1h}}`, `tools.yaml:2: t.budget: a budget counts operations in the ledger`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse([]byte("tools:\n  t: " + c.tool + "\n"))
			require.ErrorContains(t, err, c.want)
		})
	}
	// Each problem names its own line.
	_, err := Parse([]byte("tools:\n  t:\n    effect: noop\n    budget:\n      max: 5\n      window: forever\n"))
	require.ErrorContains(t, err, `tools.yaml:6: t.budget.window: "forever" is not a duration`)
}
