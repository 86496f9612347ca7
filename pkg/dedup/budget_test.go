package dedup

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestBudgetWindowsAndKeys(t *testing.T) {
	t.Parallel()
	b := Budget{Scope: "session:run-7", Max: 3, Window: time.Hour}
	at := time.Date(2026, 12, 2, 13, 59, 59, 0, time.UTC)
	start, end := b.window(at)
	require.Equal(t, time.Date(2026, 12, 2, 13, 0, 0, 0, time.UTC), start)
	require.Equal(t, time.Date(2026, 12, 2, 14, 0, 0, 0, time.UTC), end)
	next, _ := b.window(at.Add(time.Second))
	require.Equal(t, end, next, "the next second is the next window")
	week := Budget{Window: 7 * 24 * time.Hour}
	start, _ = week.window(at)
	require.Zero(t, start.Unix()%(7*24*3600), "windows start at multiples since the epoch")

	key := budgetKey("send_email", b.Scope, start)
	require.True(t, isBudgetKey(key), key)
	require.NotEqual(t, key, budgetKey("send_email", "session:run-8", start), "a scope per session")
	require.False(t, isBudgetKey("send_email."+"0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"))
	require.False(t, isBudgetKey("_budget.0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"),
		"an operation of a tool named _budget")
	require.Len(t, opID("send_email.x"), 16)

	for _, bad := range []Budget{{Max: 0, Window: time.Hour}, {Max: MaxBudget + 1, Window: time.Hour}, {Max: 1, Window: 0}, {Max: 1, Window: 1500 * time.Millisecond}} {
		require.ErrorIs(t, bad.validate("k"), ErrInvalid, "%+v", bad)
	}
	require.NoError(t, b.validate("k"))
}
