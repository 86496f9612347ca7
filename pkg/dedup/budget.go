package dedup

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/idemgate/idemgate/pkg/dedup/internal/jsbackend"
	"github.com/idemgate/idemgate/pkg/retry"
)

// Budget is an effect budget a claim spends from (ClaimRequest.Budget): at
// most Max distinct operations per Scope in each Window. A claim that would
// create the key's record — the operation is new to the ledger, or its
// record is gone — first counts the operation in the window's count, by
// compare-and-set, and is refused (OverBudget) when the count is full. The
// count keeps the operations it counted, so an operation counts once in a
// window however often it is claimed: a replay (the key has a record) never
// spends, nor does a takeover, a retry after a release or the firing of an
// approval.
type Budget struct {
	// Scope names the count within the tool: the session for a budget per
	// session, "" for one count for every caller. Stored as a digest.
	Scope string
	// Max is how many distinct operations a window allows, 1 to MaxBudget.
	Max int
	// Window is the length of a window, whole seconds; windows start at its
	// multiples since the Unix epoch, on the claimant's clock.
	Window time.Duration
	// Park makes a claim over the budget create the record anyway, without
	// counting it, and report ClaimResult.OverBudget: the caller parks the
	// operation for an approval. Without it such a claim writes nothing and
	// reports OverBudget.
	Park bool
}

// MaxBudget is the largest Budget.Max.
const MaxBudget = 1000

// budgetPrefix starts the ledger's KV key of every budget count: a key no
// operation's record has (a record's KV key has one dot; a count's three).
const budgetPrefix = "_budget."

// budgetSlack keeps a window's count a little past the window's end, for
// claimants whose clocks lag.
const budgetSlack = time.Minute

// maxSpendRounds bounds how often a spend re-reads a count that another
// claimant wrote first. Each lost round is another claimant's spend, so
// it is bounded by the claimants of one window.
const maxSpendRounds = 64

func (b Budget) validate(key string) error {
	switch {
	case b.Max < 1 || b.Max > MaxBudget:
		return fmt.Errorf("%w: claim %s: Budget.Max %d: set 1 to %d", ErrInvalid, key, b.Max, MaxBudget)
	case b.Window < time.Second || b.Window%time.Second != 0:
		return fmt.Errorf("%w: claim %s: Budget.Window %s: set a whole number of seconds, at least 1s", ErrInvalid, key, b.Window)
	}
	return nil
}

// budgetCount is a window's count as stored: the operations it counted, each
// as the first 16 hex digits of its key's SHA-256.
type budgetCount struct {
	Tool        string    `json:"tool"`
	WindowStart time.Time `json:"window_start"`
	Max         int       `json:"max"`
	Ops         []string  `json:"ops"`
}

// budgetWindow is the window of b that holds now: its start and end.
func (b Budget) window(now time.Time) (start, end time.Time) {
	w := int64(b.Window / time.Second)
	s := now.Unix() / w * w
	return time.Unix(s, 0).UTC(), time.Unix(s+w, 0).UTC()
}

// budgetKey is the KV key of tool's count in scope for the window starting
// at start.
func budgetKey(tool, scope string, start time.Time) string {
	sum := sha256.Sum256([]byte(scope))
	return budgetPrefix + tool + "." + hex.EncodeToString(sum[:8]) + "." + strconv.FormatInt(start.Unix(), 10)
}

// isBudgetKey reports whether a KV key of the ledger is a budget count's.
func isBudgetKey(stored string) bool {
	return strings.HasPrefix(stored, budgetPrefix) && strings.Count(stored, ".") == 3
}

// opID is how a count names the operation of key.
func opID(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:8])
}

// spend counts the operation of req.Key in req.Budget's window at now, unless
// the window's count has it already, and reports ok; or, when the count is
// full, reports !ok and the window's end. The count lives in partition 0, by
// compare-and-set on the revision read, with a TTL past the window's end.
func (l *Ledger) spend(ctx context.Context, req ClaimRequest, now time.Time) (ok bool, retryAt time.Time, err error) {
	b := req.Budget
	start, end := b.window(now)
	key := budgetKey(req.Tool, b.Scope, start)
	op := opID(req.Key)
	ttl := (end.Sub(now) + budgetSlack + time.Second - 1).Truncate(time.Second)
	bucket := l.parts[0]
	var pauses backoff.BackOff // made at the first lost round: most spends lose none
	for range maxSpendRounds {
		e, err := bucket.Read(ctx, key)
		if err != nil {
			return false, time.Time{}, fmt.Errorf("budget %s: %w", key, err)
		}
		c := budgetCount{Tool: req.Tool, WindowStart: start, Max: b.Max}
		if e.Live() {
			if err := json.Unmarshal(e.Data, &c); err != nil {
				return false, time.Time{}, fmt.Errorf("%w: budget %s: decode count at revision %d: %w", ErrInvalid, key, e.Rev, err)
			}
		}
		switch {
		case slices.Contains(c.Ops, op):
			return true, time.Time{}, nil // counted already
		case len(c.Ops) >= b.Max:
			return false, end, nil
		}
		c.Max = b.Max
		c.Ops = append(c.Ops, op)
		data, err := json.Marshal(c)
		if err != nil {
			return false, time.Time{}, fmt.Errorf("budget %s: %w", key, err)
		}
		_, err = bucket.Update(ctx, key, data, e.Rev, ttl, jsbackend.Alone)
		switch {
		case err == nil:
			return true, time.Time{}, nil
		case !errors.Is(err, jsbackend.ErrRevision):
			return false, time.Time{}, fmt.Errorf("budget %s: %w", key, err)
		}
		// Another claimant counted first: read again, after a pause that
		// spreads the next tries.
		if pauses == nil {
			pauses = spendPauses(ctx)
		}
		if !retry.Wait(ctx, pauses) {
			if err := ctx.Err(); err != nil {
				return false, time.Time{}, fmt.Errorf("budget %s: %w", key, err)
			}
			break
		}
	}
	return false, time.Time{}, fmt.Errorf("budget %s: %w", key, ErrContended)
}

// spendPauses are the pauses of a spend after a lost compare-and-set, one a
// round, spread so that the claimants of a window do not try again in step:
// each uniform in [0, d], d 1ms doubling up to 32ms (1, 2, 4, 8, 16, 32,
// 32ms ...), maxSpendRounds of them, cut short when ctx is done.
func spendPauses(ctx context.Context) backoff.BackOff {
	return backoff.WithMaxRetries(retry.Spread(ctx, time.Millisecond, 32*time.Millisecond), maxSpendRounds)
}

// budgetAllows is what a claim about to create req.Key's record does about
// its budget at now: nil when it has none or the operation is counted;
// otherwise the result to report (OverBudget, or for Park the time to
// mark the created record's result with).
func (l *Ledger) budgetAllows(ctx context.Context, req ClaimRequest, now time.Time) (over bool, retryAt time.Time, err error) {
	if req.Budget == nil {
		return false, time.Time{}, nil
	}
	ok, retryAt, err := l.spend(ctx, req, now)
	return !ok, retryAt, err
}
