package intent

import "time"

// CodeBudgetExceeded is the error code of an answer refused by its tool's
// effect budget (Budget): the session (or the tool) ran as many distinct
// operations as the budget allows in its window. Nothing was done and
// nothing was recorded: the same call may run once the window passes, at
// the answer's RetryAt.
const CodeBudgetExceeded = "budget_exceeded"

// BudgetScope is what a tool's effect budget counts over.
type BudgetScope string

// Budget scopes.
const (
	// BudgetPerSession: each session (the envelope's session; "" is one
	// session) has its own count. The default.
	BudgetPerSession BudgetScope = "session"
	// BudgetPerTool: one count for every caller of the tool.
	BudgetPerTool BudgetScope = "tool"
)

// OverBudget is what happens to an operation over its tool's budget.
type OverBudget string

// Over-budget policies.
const (
	// OverBudgetRefuse: the operation is answered budget_exceeded and never
	// fired. The default.
	OverBudgetRefuse OverBudget = "refuse"
	// OverBudgetApprove: the operation is parked awaiting approval, as a
	// tool with approval required parks every operation.
	OverBudgetApprove OverBudget = "approve"
)

// Budget is a tool's effect budget as the catalogue (ToolInfo.Budget)
// reports it: at most Max distinct operations per scope in each window of
// WindowSeconds (windows start at multiples of it since the Unix epoch).
type Budget struct {
	Per           BudgetScope `json:"per"`
	Max           int         `json:"max"`
	WindowSeconds int64       `json:"window_seconds"`
	OverBudget    OverBudget  `json:"over_budget"`
}

// Window is the budget's window.
func (b Budget) Window() time.Duration { return time.Duration(b.WindowSeconds) * time.Second }
