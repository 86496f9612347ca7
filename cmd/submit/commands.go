package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemgate/idemgate/pkg/client"
	"github.com/idemgate/idemgate/pkg/intent"
)

// envelopeFlags build one intent from the command line.
type envelopeFlags struct {
	tool, args, session, key, callID, createdAt string
}

func (e *envelopeFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&e.tool, "tool", "", "tool name")
	fs.StringVar(&e.args, "args", "{}", "tool arguments, a JSON object")
	fs.StringVar(&e.session, "session", "", "session or tenant scope of the key")
	fs.StringVar(&e.key, "key", "", "explicit key naming the operation (overrides derivation from args)")
	fs.StringVar(&e.callID, "call-id", "", "the model's tool_call_id (informational)")
	fs.StringVar(&e.createdAt, "created-at", "", "RFC 3339 creation time (for tools keyed by time window)")
}

// envelope builds the JSON text of the intent and decodes it with the same
// strict rules the workers apply. A problem inside --args is reported as
// such, with its byte position in --args.
func (e *envelopeFlags) envelope() (*intent.Envelope, error) {
	if e.tool == "" {
		return nil, errors.New("no intent: give --tool (and --args), --file or --jsonl")
	}
	// --args goes in first and unparsed, so that a problem in it has a
	// position counted from the start of --args.
	const head = `{"args":`
	var b strings.Builder
	b.WriteString(head)
	b.WriteString(e.args)
	rest, _ := json.Marshal(map[string]string{"tool": e.tool})
	b.WriteString(",")
	b.Write(rest[1 : len(rest)-1])
	for _, f := range [][2]string{{"session", e.session}, {"key", e.key}, {"call_id", e.callID}, {"created_at", e.createdAt}} {
		if f[1] != "" {
			kv, _ := json.Marshal(map[string]string{f[0]: f[1]})
			b.WriteString(",")
			b.Write(kv[1 : len(kv)-1])
		}
	}
	b.WriteString("}")
	env, err := intent.Decode([]byte(b.String()), intent.Limits{})
	var se *intent.SyntaxError
	if errors.As(err, &se) && se.Offset >= len(head) && se.Offset <= len(head)+len(e.args) {
		return nil, argsError(e.args, se.Offset-len(head), se.Msg)
	}
	if err != nil && !json.Valid([]byte(e.args)) {
		// A value cut short (e.g. '{"a":1') runs into the text after it.
		return nil, argsError(e.args, len(e.args), "the JSON text is incomplete")
	}
	return env, err
}

// argsError reports a problem at byte pos of --args, showing where: "not
// valid JSON" when it is not, "refused" when it is JSON that breaks a rule
// of the protocol (a repeated name, a number beyond 2^53).
func argsError(args string, pos int, msg string) error {
	const context = 30
	from := max(0, pos-context)
	to := min(len(args), pos+context)
	what, hint := "is not valid JSON", " (write a JSON object, e.g. --args '{\"to\":\"ada@example.com\"}')"
	if json.Valid([]byte(args)) {
		what, hint = "is refused", ""
	}
	return fmt.Errorf("--args %s: at byte %d: %s\n  %s\n  %s^%s", what, pos, msg, args[from:to], strings.Repeat(" ", pos-from), hint)
}

// subcommandAfterFlags is the error of a subcommand named after flags
// (submit --nats-url X get KEY): it says where the subcommand goes, with the
// command line rearranged.
func subcommandAfterFlags(sub string, args []string) error {
	i := slices.Index(args, sub)
	fixed := []string{"submit", sub}
	for j, a := range args {
		if j != i {
			fixed = append(fixed, shellQuote(a))
		}
	}
	return fmt.Errorf("%q is a subcommand: name it first, its flags after it: %s", sub, strings.Join(fixed, " "))
}

// shellQuote quotes a for a POSIX shell when it needs it.
func shellQuote(a string) string {
	if a != "" && strings.Trim(a, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_./:=@,+-") == "" {
		return a
	}
	return "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
}

func cmdSubmit(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) (int, error) {
	fs := newFlagSet("submit", "submit --tool T --args JSON | --file FILE | --jsonl FILE [flags]", args, stdout, stderr)
	fs.Usage = func() { fmt.Fprint(fs.Output(), usage+"\nFlags:\n"); fs.PrintDefaults() }
	var c common
	var e envelopeFlags
	c.register(fs)
	e.register(fs)
	file := fs.String("file", "", `a JSON intent envelope to publish ("-" for stdin)`)
	jsonl := fs.String("jsonl", "", `a file of intent envelopes, one JSON object per line ("-" for stdin)`)
	strict := fs.Bool("strict", false, "with --jsonl: send nothing when any line is invalid (default: report invalid lines, send the valid ones)")
	wait := fs.Duration("wait", defaultWait, "how long to wait for an answer (0: publish only and print the key)")
	inflight := fs.Int("concurrency", 64, "with --jsonl: intents awaiting answers at once")
	waitFinal := fs.Bool("wait-final", false, "wait past awaiting_approval and uncertain answers for the final one")
	if err := c.parse(fs, args); err != nil {
		return exitError, err
	}
	if fs.NArg() > 0 {
		if slices.Contains(subcommands, fs.Arg(0)) {
			return exitError, subcommandAfterFlags(fs.Arg(0), args)
		}
		return exitError, fmt.Errorf("unexpected argument %q (subcommands: %s; submit help explains them)", fs.Arg(0), strings.Join(subcommands, ", "))
	}
	if *jsonl != "" {
		return submitMany(ctx, c, *jsonl, stdin, stdout, stderr, *wait, *inflight, *strict)
	}
	var env *intent.Envelope
	var err error
	if *file != "" {
		var data []byte
		if data, err = readInput(*file, stdin); err != nil {
			return exitError, err
		}
		env, err = intent.Decode(data, intent.Limits{})
	} else {
		env, err = e.envelope()
	}
	if err != nil {
		return exitError, err
	}
	nc, cl, err := c.connect()
	if err != nil {
		return exitError, err
	}
	defer nc.Close()

	s, err := cl.Publish(ctx, env)
	if err != nil {
		return exitError, err
	}
	if *wait <= 0 {
		return exitFired, printJSON(stdout, map[string]any{"key": s.Key, "fingerprint": s.Fingerprint, "duplicate": s.Duplicate, "sequence": s.Sequence})
	}
	wctx, cancel := context.WithTimeout(ctx, *wait)
	defer cancel()
	wait1 := s.Wait
	if *waitFinal {
		wait1 = s.WaitFinal
	}
	res, err := wait1(wctx)
	if errors.Is(err, client.ErrNoAnswer) {
		return exitTimeout, err
	}
	if err != nil {
		return exitError, err
	}
	return exitCode(res), printJSON(stdout, res)
}

// submitMany publishes every envelope of a JSON-lines file, keeps up to
// inflight awaiting answers, prints one result per line and a progress line
// on stderr. Every line is checked first: an invalid one is reported (its
// line number and error) and not sent, the valid ones are sent — or, with
// strict, nothing is sent when any line is invalid. Each output line is the
// answer with the input's "line" number added, or {"line", "key"?, "error"}.
//
// It exits with the worst outcome among the lines: 1 on an error that
// stopped the batch, 2 when some got no answer in time, 5 when some line was
// invalid or answered failed, rejected or denied, 4 when some was a
// conflict, 6 when some awaits approval or is uncertain, else 0 (every line
// completed, fired or replayed).
func submitMany(ctx context.Context, c common, path string, stdin io.Reader, stdout, stderr io.Writer, wait time.Duration, inflight int, strict bool) (int, error) {
	if inflight < 1 {
		return exitError, errors.New("--concurrency must be at least 1")
	}
	data, err := readInput(path, stdin)
	if err != nil {
		return exitError, err
	}
	type line struct {
		n   int
		env *intent.Envelope
	}
	var (
		envs    []line
		invalid []map[string]any
	)
	sc := bufio.NewScanner(bytesReader(data))
	sc.Buffer(make([]byte, 0, 64<<10), intent.DefaultMaxBytes+1)
	for n := 1; sc.Scan(); n++ {
		if len(bytes.TrimSpace(sc.Bytes())) == 0 {
			continue
		}
		env, err := intent.Decode(sc.Bytes(), intent.Limits{})
		if err != nil {
			invalid = append(invalid, map[string]any{"line": n, "status": intent.StatusRejected, "error": map[string]string{"code": intent.Code(err), "message": err.Error()}})
			fmt.Fprintf(stderr, "%s:%d: %v\n", path, n, err)
			continue
		}
		envs = append(envs, line{n: n, env: env})
	}
	if err := sc.Err(); err != nil {
		return exitError, fmt.Errorf("%s: %w", path, err)
	}
	enc := json.NewEncoder(stdout)
	for _, r := range invalid {
		_ = enc.Encode(r)
	}
	if strict && len(invalid) > 0 {
		return exitFailed, fmt.Errorf("%d of %d lines are invalid; nothing was sent (--strict)", len(invalid), len(invalid)+len(envs))
	}
	worst := outcomes{}
	if len(invalid) > 0 {
		worst.add(exitFailed)
	}
	if len(envs) == 0 {
		return worst.code(), worst.err(len(invalid), 0, wait)
	}
	nc, cl, err := c.connect()
	if err != nil {
		return exitError, err
	}
	defer nc.Close()

	var (
		mu                                       sync.Mutex
		sent, answered, fired, replayed, missing atomic.Int64
		failures                                 atomic.Int64
		firstErr                                 error
	)
	start := time.Now()
	progress := func(final bool) {
		end := "\r"
		if final {
			end = "\n"
		}
		fmt.Fprintf(stderr, "sent %d/%d answered %d (fired %d, replayed %d, not completed %d) unanswered %d invalid %d %.1fs%s",
			sent.Load(), len(envs), answered.Load(), fired.Load(), replayed.Load(), failures.Load(), missing.Load(), len(invalid), time.Since(start).Seconds(), end)
	}
	tick := time.NewTicker(500 * time.Millisecond)
	done := make(chan struct{})
	go func() {
		for {
			select {
			case <-tick.C:
				progress(false)
			case <-done:
				return
			}
		}
	}()
	sem := make(chan struct{}, inflight)
	var wg sync.WaitGroup
	for _, l := range envs {
		sem <- struct{}{}
		s, err := cl.Publish(ctx, l.env)
		if err != nil {
			<-sem
			mu.Lock()
			firstErr = errors.Join(firstErr, fmt.Errorf("%s:%d: %w", path, l.n, err))
			mu.Unlock()
			break
		}
		sent.Add(1)
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			wctx, cancel := context.WithTimeout(ctx, wait)
			defer cancel()
			res, err := s.Wait(wctx)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				missing.Add(1)
				worst.add(exitTimeout)
				_ = enc.Encode(map[string]any{"line": l.n, "key": s.Key, "error": err.Error()})
				return
			}
			answered.Add(1)
			switch {
			case res.Status != intent.StatusCompleted:
				failures.Add(1)
			case res.Replayed:
				replayed.Add(1)
			default:
				fired.Add(1)
			}
			worst.add(exitCode(res))
			_ = enc.Encode(withLine(res, l.n))
		}()
	}
	wg.Wait()
	tick.Stop()
	close(done)
	progress(true)
	if firstErr != nil {
		return exitError, firstErr
	}
	return worst.code(), worst.err(len(invalid), int(missing.Load()), wait)
}

// withLine is res as a JSON object with the input's line number added.
func withLine(res *intent.Result, n int) json.RawMessage {
	data, _ := json.Marshal(res)
	return append([]byte(`{"line":`+strconv.Itoa(n)+`,`), data[1:]...)
}

// outcomes keeps the worst exit status of a batch.
type outcomes struct{ seen map[int]bool }

func (o *outcomes) add(code int) {
	if o.seen == nil {
		o.seen = map[int]bool{}
	}
	o.seen[code] = true
}

// code ranks the statuses seen: error, no answer, failed/rejected/invalid,
// conflict, open; replayed and fired are both success for a batch.
func (o *outcomes) code() int {
	for _, c := range []int{exitError, exitTimeout, exitFailed, exitConflict, exitOpen} {
		if o.seen[c] {
			return c
		}
	}
	return exitFired
}

func (o *outcomes) err(invalid, missing int, wait time.Duration) error {
	var errs []error
	if invalid > 0 {
		errs = append(errs, fmt.Errorf("%d invalid lines were not sent", invalid))
	}
	if missing > 0 {
		errs = append(errs, fmt.Errorf("%d intents got no answer within %s", missing, wait))
	}
	if len(errs) == 0 && o.code() != exitFired {
		errs = append(errs, errors.New("some intents were not completed (see their lines)"))
	}
	return errors.Join(errs...)
}

func cmdGet(ctx context.Context, args []string, stdout, stderr io.Writer) (int, error) {
	fs := newFlagSet("submit get", "submit get KEY [flags]", args, stdout, stderr)
	var c common
	c.register(fs)
	if err := c.parse(fs, args); err != nil {
		return exitError, err
	}
	if fs.NArg() != 1 {
		return exitError, errors.New("usage: submit get KEY")
	}
	nc, cl, err := c.connect()
	if err != nil {
		return exitError, err
	}
	defer nc.Close()
	rec, err := cl.Get(ctx, fs.Arg(0))
	if err != nil {
		return exitError, err
	}
	if t := rec.ForgottenText(); t != "" {
		fmt.Fprintf(stderr, "%s: %s; its next call runs it again\n", fs.Arg(0), t)
	}
	return exitFired, printJSON(stdout, rec)
}

func cmdKey(ctx context.Context, args []string, stdout, stderr io.Writer) (int, error) {
	fs := newFlagSet("submit key", "submit key --tool T --args JSON [--session S] [--spec JSON | --tools FILE [--webhook-allow CIDRS] | --default-spec] [-q | -f | -l [--layout N]]", args, stdout, stderr)
	var c common
	var e envelopeFlags
	c.register(fs)
	e.register(fs)
	keyArgs := fs.String("key-args", "", "comma-separated distinguishing args (instead of the workers' catalogue)")
	window := fs.Duration("window", 0, "time window of the key, e.g. 168h (instead of the workers' catalogue)")
	specJSON := fs.String("spec", "", `the tool's key spec as the catalogue gives it, e.g. '{"key_args":["to"],"volatile_args":["body"]}'`)
	toolsFile := fs.String("tools", "", "read the tool's key spec from this tools file (as the workers' --tools)")
	hookAllow := fs.String("webhook-allow", "", "with --tools: as the workers' --webhook-allow, the private addresses the file's mcp url upstreams may be listed at, e.g. 127.0.0.0/8")
	defaultSpec := fs.Bool("default-spec", false, "use the default derivation (all args, no window) without asking the workers")
	quiet := fs.Bool("q", false, "print only the key")
	onlyFP := fs.Bool("f", false, "print only the fingerprint")
	onlyLedger := fs.Bool("l", false, "print only the key as the ledger stores it (its KV key, docs/protocol.md 6.2): what nats kv get and watch take")
	layout := fs.Int("layout", intent.DefaultLayout, "with -l: the ledger's key layout (its stream metadata idemgate.layout; 1 when it has none)")
	if err := c.parse(fs, args); err != nil {
		return exitError, err
	}
	if !intent.ValidLedgerLayout(*layout) {
		return exitError, fmt.Errorf("--layout %d: give %d or %d, as the ledger records it (nats stream info KV_<bucket> shows idemgate.layout; none recorded is %d)",
			*layout, intent.LayoutCompact, intent.LayoutFull, intent.LayoutFull)
	}
	env, err := e.envelope()
	if err != nil {
		return exitError, err
	}
	spec, source, err := keySpecFor(ctx, c, env.Tool, keySpecFlags{keyArgs: *keyArgs, window: *window, spec: *specJSON, tools: *toolsFile, allow: *hookAllow, def: *defaultSpec})
	if err != nil {
		return exitError, err
	}
	now := time.Now()
	id, err := intent.Derive(env, spec, now)
	if err != nil {
		return exitError, err
	}
	switch {
	case btoi(*quiet)+btoi(*onlyFP)+btoi(*onlyLedger) > 1:
		return exitError, errors.New("give one of -q (the key), -f (the fingerprint) and -l (the ledger's KV key)")
	case *quiet:
		_, err := fmt.Fprintln(stdout, id.Key)
		return exitFired, err
	case *onlyLedger:
		lk, err := intent.LedgerKey(id.Key, *layout)
		if err != nil {
			return exitError, err
		}
		_, err = fmt.Fprintln(stdout, lk)
		return exitFired, err
	case *onlyFP:
		_, err := fmt.Fprintln(stdout, id.Fingerprint)
		return exitFired, err
	}
	material, err := intent.Material(env, spec, now)
	if err != nil {
		return exitError, err
	}
	return exitFired, printJSON(stdout, map[string]any{"key": id.Key, "fingerprint": id.Fingerprint, "material": string(material), "spec": source})
}

// keySpecFlags are the ways submit key is told a tool's key spec.
type keySpecFlags struct {
	keyArgs     string
	window      time.Duration
	spec, tools string
	allow       string // with tools: the --webhook-allow CIDRs
	def         bool
}

// keySpecFor returns the key spec tool derives keys with, and where it came
// from: the flags, a spec or tools file given, the default derivation when
// asked for, else the workers' catalogue. Without any of them it fails: a
// key derived with a guessed spec is one the workers may not use.
func keySpecFor(ctx context.Context, c common, tool string, f keySpecFlags) (intent.KeySpec, string, error) {
	given := 0
	for _, b := range []bool{f.keyArgs != "" || f.window != 0, f.spec != "", f.tools != "", f.def} {
		if b {
			given++
		}
	}
	switch {
	case given > 1:
		return intent.KeySpec{}, "", errors.New("give one of --key-args/--window, --spec, --tools and --default-spec")
	case f.keyArgs != "" || f.window != 0:
		return intent.KeySpec{Window: f.window, KeyArgs: splitList(f.keyArgs)}, "flags", nil
	case f.def:
		return intent.KeySpec{}, "default", nil
	case f.spec != "":
		var info intent.ToolInfo
		dec := json.NewDecoder(strings.NewReader(f.spec))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&info); err != nil {
			return intent.KeySpec{}, "", fmt.Errorf(`--spec: %w (write e.g. {"key_args":["to"],"window_seconds":0,"volatile_args":["body"]})`, err)
		}
		spec := info.KeySpec()
		if err := spec.Validate(); err != nil {
			return intent.KeySpec{}, "", fmt.Errorf("--spec: %w", err)
		}
		return spec, "--spec", nil
	case f.tools != "":
		spec, err := toolsFileSpec(f.tools, f.allow, tool)
		return spec, "tools file " + f.tools, err
	}
	nc, cl, err := c.connect()
	if err != nil {
		return intent.KeySpec{}, "", fmt.Errorf("%w: the key depends on the tool's key spec, which the workers' catalogue gives; give it with --spec or --tools FILE, or ask for the default derivation with --default-spec", err)
	}
	defer nc.Close()
	cat, err := cl.Tools(ctx)
	if err != nil {
		return intent.KeySpec{}, "", fmt.Errorf("tool catalogue: %w (give the key spec with --spec or --tools FILE, or --default-spec)", err)
	}
	var names []string
	for _, t := range cat.Tools {
		if t.Name == tool {
			return t.KeySpec(), "catalogue", nil
		}
		names = append(names, t.Name)
	}
	return intent.KeySpec{}, "", fmt.Errorf("the workers serve no tool %q%s (an intent for it is answered unknown_tool)", tool, closestHint(tool, names))
}

func cmdTools(ctx context.Context, args []string, stdout, stderr io.Writer) (int, error) {
	fs := newFlagSet("submit tools", "submit tools [flags]", args, stdout, stderr)
	var c common
	c.register(fs)
	if err := c.parse(fs, args); err != nil {
		return exitError, err
	}
	nc, cl, err := c.connect()
	if err != nil {
		return exitError, err
	}
	defer nc.Close()
	cat, err := cl.Tools(ctx)
	if err != nil {
		return exitError, err
	}
	return exitFired, printJSON(stdout, cat)
}

func readInput(path string, stdin io.Reader) ([]byte, error) {
	if path == "-" {
		return io.ReadAll(stdin)
	}
	return os.ReadFile(path)
}

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// btoi is 1 for true, 0 for false.
func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}
