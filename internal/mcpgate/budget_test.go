package mcpgate

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/pkg/intent"
)

// A tool's description tells the model its effect budget, so that it does
// not vary its arguments to get around a refusal.
func TestDescriptionStatesTheBudget(t *testing.T) {
	t.Parallel()
	info := intent.ToolInfo{Name: "send", Class: intent.ClassUnsafe, Ledger: true, KeyArgs: []string{"to"},
		Budget: &intent.Budget{Per: intent.BudgetPerSession, Max: 5, WindowSeconds: 3600, OverBudget: intent.OverBudgetRefuse}}
	d := describe(info)
	require.Contains(t, d, "At most 5 distinct operations run per session in each 1h0m0s")
	require.Contains(t, d, "do not vary the arguments")
	info.Budget.Per, info.Budget.OverBudget = intent.BudgetPerTool, intent.OverBudgetApprove
	require.Contains(t, describe(info), "for all callers together")
	require.Contains(t, describe(info), "parked for an operator's approval")
	info.Budget = nil
	require.NotContains(t, describe(info), "At most")
}
