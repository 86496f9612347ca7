package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/idemgate/idemgate/pkg/client"
	"github.com/idemgate/idemgate/pkg/dedup"
)

// cmdList lists ledger records, one JSON object per line:
// list [--status S,...|open] [--tool T] [--session S] [--older-than D]
// [--past-lease] [--limit N] [--after SEQ] [--all].
func cmdList(ctx context.Context, args []string, stdout, stderr io.Writer) (int, error) {
	fs := newFlagSet("submit list", "submit list [--status S,...|open] [--tool T] [--session S] [--older-than D] [--past-lease] [--limit N] [--after SEQ] [--all] [flags]", args, stdout, stderr)
	var c common
	c.register(fs)
	status := fs.String("status", "", "comma-separated statuses to keep (pending, awaiting_approval, approved, uncertain, completed, failed, denied), or open for every unsettled one")
	tool := fs.String("tool", "", "keep this tool's records")
	session := fs.String("session", "", "keep this session's records")
	olderThan := fs.Duration("older-than", 0, "keep records claimed longer ago than this, e.g. 1h")
	pastLease := fs.Bool("past-lease", false, "keep pending records whose lease ran out (the holder is gone)")
	limit := fs.Int("limit", dedup.DefaultListLimit, fmt.Sprintf("records per page (at most %d)", dedup.MaxListLimit))
	after := fs.Uint64("after", 0, "the cursor: list records stored after this sequence (a page's last line says the next one)")
	all := fs.Bool("all", false, "follow every page to the end of the ledger")
	if err := c.parse(fs, args); err != nil {
		return exitError, err
	}
	if fs.NArg() > 0 {
		return exitError, fmt.Errorf("unexpected argument %q (submit list takes flags only)", fs.Arg(0))
	}
	statuses, err := dedup.ParseStatuses(*status)
	if err != nil {
		return exitError, err
	}
	if *olderThan < 0 {
		return exitError, fmt.Errorf("--older-than %s: give a positive duration", *olderThan)
	}
	q := dedup.Query{Statuses: statuses, Tool: *tool, Session: *session, PastLease: *pastLease, Limit: *limit, After: *after}
	if *olderThan > 0 {
		q.CreatedBefore = time.Now().Add(-*olderThan)
	}
	nc, cl, err := c.connect()
	if err != nil {
		return exitError, err
	}
	defer nc.Close()
	enc := json.NewEncoder(stdout)
	n := 0
	for {
		pctx, cancel := context.WithTimeout(ctx, time.Minute)
		page, err := cl.Records(pctx, q)
		cancel()
		if err != nil {
			return exitError, err
		}
		for _, r := range page.Records {
			if err := enc.Encode(r); err != nil {
				return exitError, err
			}
		}
		n += len(page.Records)
		if !page.More {
			fmt.Fprintf(stderr, "%d records\n", n)
			return exitFired, nil
		}
		if !*all {
			fmt.Fprintf(stderr, "%d records; more after --after %d\n", n, page.Next)
			return exitFired, nil
		}
		q.After = page.Next
	}
}

// cmdForget deletes an operation's ledger record so that it may run again,
// and clears the workers' answer caches: forget KEY [--force]. It exits 6
// when the operation is unresolved or in flight.
func cmdForget(ctx context.Context, args []string, stdout, stderr io.Writer) (int, error) {
	fs := newFlagSet("submit forget", "submit forget KEY [--force] [flags]", args, stdout, stderr)
	var c common
	c.register(fs)
	force := fs.Bool("force", false, "forget an unresolved operation too (pending, awaiting approval, uncertain): the next call may fire it again. "+
		"A pending one is forgotten only once its record stays unchanged for one more lease after its lease ran out (its holder is gone); "+
		"one that may be firing now is refused")
	timeout := fs.Duration("timeout", 5*time.Minute, "give up after this long (a forced forget of a pending operation waits one more lease)")
	by := fs.String("by", "", "who forgets the operation (recorded in the audit trail)")
	reason := fs.String("reason", "", "why, for the audit trail")
	if err := c.parse(fs, args); err != nil {
		return exitError, err
	}
	if fs.NArg() != 1 {
		return exitError, errors.New("usage: submit forget KEY [--force]")
	}
	nc, cl, err := c.connect()
	if err != nil {
		return exitError, err
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	opts := []client.ForgetOption{client.ForgetBy(*by, *reason)}
	if *force {
		opts = append(opts, client.Forced())
	}
	rec, err := cl.Forget(ctx, fs.Arg(0), opts...)
	switch {
	case errors.Is(err, client.ErrUnresolved):
		return exitOpen, fmt.Errorf("%w; submit forget --force %s forgets it anyway", err, fs.Arg(0))
	case errors.Is(err, client.ErrInFlight):
		return exitOpen, err
	case err != nil:
		return exitError, err
	}
	return exitFired, printJSON(stdout, map[string]any{"forgotten": fs.Arg(0), "record": rec})
}
