package effects

import (
	"errors"
	"fmt"
	"strings"

	"github.com/idemgate/idemgate/pkg/effects/internal/text"
)

// ErrUnknownTool is matched by errors.Is for the error UnknownTool returns.
var ErrUnknownTool = errors.New("effects: unknown tool")

// maxListedTools is how many configured tools an unknown-tool message lists
// when none is close to the name asked for.
const maxListedTools = 10

// Closest returns the configured tool whose name is nearest to name — a
// typo, a case or separator slip (send-email, SendEmail) — or "" when none is
// close. It never returns name itself when that is configured.
func (r *Registry) Closest(name string) string { return Closest(name, r.names) }

// Closest returns the name in known nearest to name (at most two edits,
// ignoring case and the separators '-', '_', '.', and fewer edits than a
// third of its length), or "" when none is close or name is among them.
func Closest(name string, known []string) string {
	norm := func(s string) string {
		return strings.NewReplacer("-", "", "_", "", " ", "", ".", "").Replace(strings.ToLower(s))
	}
	want := norm(name)
	best, bestDist := "", 0
	for _, n := range known {
		if n == name {
			return ""
		}
		d := text.EditDistance(want, norm(n))
		if d > 2 || d*3 > max(len(want), 3) {
			continue
		}
		if best == "" || d < bestDist {
			best, bestDist = n, d
		}
	}
	return best
}

// UnknownToolError is an intent's tool that is not configured.
type UnknownToolError struct {
	Name       string   // the tool asked for
	Suggestion string   // the closest configured tool (see Closest), or ""
	Configured []string // the configured tools, sorted
}

// Error says the tool is not configured, with "did you mean …?" when a
// configured tool has a close name, else the configured tools (the first
// few of them).
func (e *UnknownToolError) Error() string {
	switch n := e.Configured; {
	case e.Suggestion != "":
		return fmt.Sprintf("no tool %q is configured; did you mean %q?", e.Name, e.Suggestion)
	case len(n) == 0:
		return fmt.Sprintf("no tool %q is configured (the workers have no tools)", e.Name)
	case len(n) > maxListedTools:
		return fmt.Sprintf("no tool %q is configured (configured: %s, and %d more: the tool catalogue lists them all)",
			e.Name, strings.Join(n[:maxListedTools], ", "), len(n)-maxListedTools)
	default:
		return fmt.Sprintf("no tool %q is configured (configured: %s)", e.Name, strings.Join(n, ", "))
	}
}

// Is reports whether target is ErrUnknownTool.
func (e *UnknownToolError) Is(target error) bool { return target == ErrUnknownTool }

// UnknownTool returns the *UnknownToolError (matching ErrUnknownTool) for an
// intent naming tool name, which is not configured.
func (r *Registry) UnknownTool(name string) error {
	return &UnknownToolError{Name: name, Suggestion: r.Closest(name), Configured: r.Names()}
}
