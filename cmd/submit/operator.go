package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/idemgate/idemgate/pkg/client"
	"github.com/idemgate/idemgate/pkg/intent"
)

// cmdDecide publishes an operator decision: approve KEY, deny KEY, resolve
// KEY, probe KEY.
//
// An approval without --fingerprint first reads the record and shows the
// arguments it would let fire; it then asks for confirmation when stdin is a
// terminal, proceeds with --yes, and refuses otherwise. The approval it sends
// is bound to the fingerprint shown, so arguments changed meanwhile are not
// approved.
//
// It exits 0 when the decision took effect (an approval whose operation then
// completed, a denial, a resolution, a probe that found the operation
// done), 5 when it was rejected (no such key,
// wrong state, other arguments) or the approved operation failed, 2 when no
// answer came in time.
func cmdDecide(ctx context.Context, op string, args []string, stdin io.Reader, stdout, stderr io.Writer) (int, error) {
	synopsis := map[string]string{
		intent.ControlApprove: "submit approve KEY [--fingerprint FP | --yes] [--by NAME] [--reason R]",
		intent.ControlDeny:    "submit deny KEY [--by NAME] [--reason R]",
		intent.ControlResolve: "submit resolve KEY --outcome succeeded|failed [--result JSON] [--by NAME] [--reason R]",
		intent.ControlProbe:   "submit probe KEY [--by NAME] [--reason R]",
	}[op]
	fs := newFlagSet("submit "+op, synopsis, args, stdout, stderr)
	var c common
	c.register(fs)
	var d intent.Control
	fs.StringVar(&d.By, "by", "", "who decides (recorded)")
	fs.StringVar(&d.Reason, "reason", "", "why (recorded; a deny's reason is the callers' error message)")
	var yes *bool
	if op == intent.ControlApprove {
		fs.StringVar(&d.Fingerprint, "fingerprint", "", "the fingerprint of the arguments approved (submit get KEY shows it); refused if the record's differs. Without it the arguments are shown and confirmed")
		yes = fs.Bool("yes", false, "without --fingerprint: approve the arguments shown without asking (needed when stdin is not a terminal)")
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
		return exitError, fmt.Errorf("usage: %s", synopsis)
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
	if op == intent.ControlApprove && d.Fingerprint == "" {
		fp, err := confirmApproval(wctx, cl, d.Key, *yes, stdin, stderr)
		if err != nil {
			return exitError, err
		}
		d.Fingerprint = fp
	}
	res, err := cl.Decide(wctx, op, d)
	if errors.Is(err, client.ErrNoAnswer) {
		return exitTimeout, err
	}
	if err != nil {
		return exitError, err
	}
	return decisionCode(op, res), printJSON(stdout, res)
}

// decisionCode is the exit status of a decision's answer.
func decisionCode(op string, res *intent.Result) int {
	switch {
	case res.Status == intent.StatusRejected:
		return exitFailed
	case op == intent.ControlDeny && res.Status == intent.StatusDenied,
		op == intent.ControlResolve && (res.Status == intent.StatusCompleted || res.Status == intent.StatusFailed),
		op == intent.ControlProbe && res.Status == intent.StatusCompleted,
		op == intent.ControlApprove && res.Status == intent.StatusCompleted:
		return exitFired // the decision took effect
	}
	return exitCode(res)
}

// confirmApproval shows what an approval of key would let fire and returns
// the fingerprint to bind it to: at once with yes, after a "y" on a
// terminal, and an error without a terminal. A key that is not awaiting
// approval is sent as it is (fingerprint ""): the worker's answer says why
// it does not apply.
func confirmApproval(ctx context.Context, cl *client.Client, key string, yes bool, stdin io.Reader, stderr io.Writer) (string, error) {
	rec, err := cl.Get(ctx, key)
	if errors.Is(err, client.ErrNotFound) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	if rec.Status != intent.StatusAwaitingApproval {
		return "", nil
	}
	args := "(not recorded)"
	if env, err := intent.Decode(rec.Intent, intent.Limits{}); err == nil {
		var pretty bytes.Buffer
		if json.Indent(&pretty, env.Args, "  ", "  ") == nil {
			args = pretty.String()
		}
		if env.Session != "" {
			args += "\n  session: " + env.Session
		}
	}
	fmt.Fprintf(stderr, "approve %s\n  tool: %s\n  args: %s\n  fingerprint: %s\n", key, rec.Tool, args, rec.Fingerprint)
	if yes {
		return rec.Fingerprint, nil
	}
	if !isTerminal(stdin) {
		return "", errors.New("approve without --fingerprint shows the arguments above and asks; stdin is not a terminal: give --yes to approve them, or --fingerprint " + rec.Fingerprint)
	}
	fmt.Fprint(stderr, "Fire it with these arguments? [y/N] ")
	answer, _ := bufio.NewReader(stdin).ReadString('\n')
	if a := strings.ToLower(strings.TrimSpace(answer)); a != "y" && a != "yes" {
		return "", errors.New("not approved")
	}
	return rec.Fingerprint, nil
}

// isTerminal reports whether r is a terminal (not merely a character
// device: /dev/null is one too).
func isTerminal(r io.Reader) bool {
	f, ok := r.(*os.File)
	return ok && isatty(f)
}

// cmdDLQ lists or replays dead letters: dlq list [--limit N], dlq replay SEQ.
func cmdDLQ(ctx context.Context, args []string, stdout, stderr io.Writer) (int, error) {
	if len(args) == 0 || (args[0] != "list" && args[0] != "replay") {
		return exitError, errors.New("usage: submit dlq list [--limit N] | submit dlq replay SEQ")
	}
	fs := newFlagSet("submit dlq "+args[0], "submit dlq list [--limit N] | submit dlq replay SEQ", args, stdout, stderr)
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
