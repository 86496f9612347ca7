package auth

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestParseTokens(t *testing.T) {
	t.Parallel()
	h := strings.Repeat("a", 64)
	h2 := strings.Repeat("b", 64)
	ts, err := ParseTokens(strings.NewReader("# callers\n\n" + h + " agent team-a planner\n" + h2 + " operator *\n"))
	require.NoError(t, err)
	require.Equal(t, 2, ts.Len())
	require.Equal(t, "token-bbbbbbbb", ts.byHash[h2].Name, "a default name")

	for _, c := range []struct{ file, want string }{
		{"", "no tokens"},
		{h + " agent", "want <sha256-hex> <agent|operator> <namespace> [name]"},
		{"ABC agent a", "is not a SHA-256 in lowercase hex"},
		{strings.ToUpper(h) + " agent a", "is not a SHA-256 in lowercase hex"},
		{h + " admin a", `role "admin": use agent or operator`},
		{h + " agent *", "namespace * is for operators"},
		{h + " agent team/a", "namespace \"team/a\""},
		{h + " agent a bad name!", "want <sha256-hex>"},
		{h + " agent a x\n" + h + " agent b y", "the same token as line 1"},
		{h + " agent a x\n" + h2 + " agent b x", `name "x" is already used on line 1`},
	} {
		_, err := ParseTokens(strings.NewReader(c.file))
		require.ErrorIs(t, err, ErrTokens, c.file)
		require.ErrorContains(t, err, c.want, c.file)
	}
}

func TestNewTokenIsAdmitted(t *testing.T) {
	t.Parallel()
	secret, line, err := NewToken(RoleAgent, "team-a", "bot")
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(secret, "idg_"))
	require.NotContains(t, line, secret, "the line holds the hash only")
	ts, err := ParseTokens(strings.NewReader(line))
	require.NoError(t, err)
	tok, ok := ts.Lookup(secret)
	require.True(t, ok)
	require.Equal(t, Token{Name: "bot", Role: RoleAgent, Namespace: "team-a", hash: tok.hash}, *tok)
	_, ok = ts.Lookup(secret + "x")
	require.False(t, ok)
	other, _, err := NewToken(RoleAgent, "team-a", "bot")
	require.NoError(t, err)
	require.NotEqual(t, secret, other)
	_, _, err = NewToken(RoleAgent, "*", "")
	require.ErrorIs(t, err, ErrTokens)
}

func TestNamespaces(t *testing.T) {
	t.Parallel()
	a := &Token{Namespace: "team-a"}
	require.Equal(t, "team-a", a.Scope(""))
	require.Equal(t, "team-a/run-7", a.Scope("run-7"))
	require.True(t, a.Reaches("team-a"))
	require.True(t, a.Reaches("team-a/run-7"))
	require.False(t, a.Reaches("team-ab"), "a prefix is not a namespace")
	require.False(t, a.Reaches("team-b/run-7"))
	require.False(t, a.Reaches(""))
	all := &Token{Namespace: AllNamespaces}
	require.Equal(t, "run-7", all.Scope("run-7"))
	require.True(t, all.Reaches("team-b/x"))
	require.True(t, all.Reaches(""))
}
