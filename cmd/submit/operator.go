package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/idemgate/idemgate/pkg/client"
	"github.com/idemgate/idemgate/pkg/intent"
)

// cmdDecide publishes an operator decision: approve KEY, deny KEY, resolve KEY.
func cmdDecide(ctx context.Context, op string, args []string, stdout, stderr io.Writer) (int, error) {
	fs := flag.NewFlagSet("submit "+op, flag.ContinueOnError)
	fs.SetOutput(stderr)
	var c common
	c.register(fs)
	var d intent.Control
	fs.StringVar(&d.By, "by", "", "who decides (recorded)")
	fs.StringVar(&d.Reason, "reason", "", "why (recorded; a deny's reason is the callers' error message)")
	if op == intent.ControlApprove {
		fs.StringVar(&d.Fingerprint, "fingerprint", "", "the fingerprint of the arguments approved (submit get KEY shows it); refused if the record's differs")
	}
	var result string
	if op == intent.ControlResolve {
		fs.StringVar(&d.Outcome, "outcome", "", "what happened: succeeded or failed")
		fs.StringVar(&result, "result", "", "with --outcome succeeded: the operation's result, JSON")
	}
	wait := fs.Duration("wait", defaultWait, "how long to wait for the answer")
	if err := c.parse(fs, args); err != nil {
		return exitError, err
	}
	if fs.NArg() != 1 {
		return exitError, fmt.Errorf("usage: submit %s KEY [flags]", op)
	}
	d.Key = fs.Arg(0)
	if result != "" {
		if !json.Valid([]byte(result)) {
			return exitError, errors.New("--result is not valid JSON")
		}
		d.Result = json.RawMessage(result)
	}
	nc, cl, err := c.connect()
	if err != nil {
		return exitError, err
	}
	defer nc.Close()
	wctx, cancel := context.WithTimeout(ctx, *wait)
	defer cancel()
	res, err := cl.Decide(wctx, op, d)
	if errors.Is(err, client.ErrNoAnswer) {
		return exitTimeout, err
	}
	if err != nil {
		return exitError, err
	}
	code := exitCode(res)
	if res.Status == intent.StatusCompleted {
		code = exitFired // the decision took effect
	}
	return code, printJSON(stdout, res)
}

// cmdDLQ lists or replays dead letters: dlq list [--limit N], dlq replay SEQ.
func cmdDLQ(ctx context.Context, args []string, stdout, stderr io.Writer) (int, error) {
	if len(args) == 0 || (args[0] != "list" && args[0] != "replay") {
		return exitError, errors.New("usage: submit dlq list [--limit N] | submit dlq replay SEQ")
	}
	fs := flag.NewFlagSet("submit dlq "+args[0], flag.ContinueOnError)
	fs.SetOutput(stderr)
	var c common
	c.register(fs)
	limit := fs.Int("limit", 0, "list at most this many (0: all)")
	if err := c.parse(fs, args[1:]); err != nil {
		return exitError, err
	}
	if args[0] == "list" && fs.NArg() > 0 {
		return exitError, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	nc, cl, err := c.connect()
	if err != nil {
		return exitError, err
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if args[0] == "list" {
		letters, err := cl.DeadLetters(ctx, *limit)
		enc := json.NewEncoder(stdout)
		for _, d := range letters {
			if err := enc.Encode(d); err != nil {
				return exitError, err
			}
		}
		if err != nil {
			return exitError, err
		}
		fmt.Fprintf(stderr, "%d dead letters\n", len(letters))
		return exitFired, nil
	}
	if fs.NArg() != 1 {
		return exitError, errors.New("usage: submit dlq replay SEQ")
	}
	seq, err := strconv.ParseUint(fs.Arg(0), 10, 64)
	if err != nil || seq == 0 {
		return exitError, fmt.Errorf("SEQ %q: give the dead letter's seq (submit dlq list shows it)", fs.Arg(0))
	}
	newSeq, err := cl.ReplayDeadLetter(ctx, seq)
	if err != nil {
		return exitError, err
	}
	return exitFired, printJSON(stdout, map[string]any{"replayed": seq, "stream_seq": newSeq})
}
