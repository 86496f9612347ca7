package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
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
// strict rules the workers apply.
func (e *envelopeFlags) envelope() (*intent.Envelope, error) {
	if e.tool == "" {
		return nil, errors.New("no intent: give --tool (and --args), --file or --jsonl")
	}
	doc := map[string]any{"tool": e.tool, "args": json.RawMessage(e.args)}
	for k, v := range map[string]string{"session": e.session, "key": e.key, "call_id": e.callID, "created_at": e.createdAt} {
		if v != "" {
			doc[k] = v
		}
	}
	data, err := json.Marshal(doc)
	if err != nil {
		return nil, fmt.Errorf("--args is not valid JSON: %w", err)
	}
	return intent.Decode(data, intent.Limits{})
}

func cmdSubmit(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) (int, error) {
	fs := flag.NewFlagSet("submit", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var c common
	var e envelopeFlags
	c.register(fs)
	e.register(fs)
	file := fs.String("file", "", `a JSON intent envelope to publish ("-" for stdin)`)
	jsonl := fs.String("jsonl", "", `a file of intent envelopes, one JSON object per line ("-" for stdin)`)
	wait := fs.Duration("wait", defaultWait, "how long to wait for an answer (0: publish only and print the key)")
	inflight := fs.Int("concurrency", 64, "with --jsonl: intents awaiting answers at once")
	waitFinal := fs.Bool("wait-final", false, "wait past awaiting_approval and uncertain answers for the final one")
	if err := c.parse(fs, args); err != nil {
		return exitError, err
	}
	if fs.NArg() > 0 {
		return exitError, fmt.Errorf("unexpected argument %q (subcommands: get, key, tools, list, forget, approve, deny, resolve, dlq)", fs.Arg(0))
	}
	if *jsonl != "" {
		return submitMany(ctx, c, *jsonl, stdin, stdout, stderr, *wait, *inflight)
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
// inflight awaiting answers, prints each answer as a JSON line and a progress
// line on stderr. It exits 0 when every intent was answered, 2 when some were
// not in time, 1 on other errors.
func submitMany(ctx context.Context, c common, path string, stdin io.Reader, stdout, stderr io.Writer, wait time.Duration, inflight int) (int, error) {
	if inflight < 1 {
		return exitError, errors.New("--concurrency must be at least 1")
	}
	data, err := readInput(path, stdin)
	if err != nil {
		return exitError, err
	}
	var envs []*intent.Envelope
	sc := bufio.NewScanner(bytesReader(data))
	sc.Buffer(make([]byte, 0, 64<<10), intent.DefaultMaxBytes+1)
	for line := 1; sc.Scan(); line++ {
		if len(sc.Bytes()) == 0 {
			continue
		}
		env, err := intent.Decode(sc.Bytes(), intent.Limits{})
		if err != nil {
			return exitError, fmt.Errorf("%s:%d: %w", path, line, err)
		}
		envs = append(envs, env)
	}
	if err := sc.Err(); err != nil {
		return exitError, fmt.Errorf("%s: %w", path, err)
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
		fmt.Fprintf(stderr, "sent %d/%d answered %d (fired %d, replayed %d, not completed %d) unanswered %d %.1fs%s",
			sent.Load(), len(envs), answered.Load(), fired.Load(), replayed.Load(), failures.Load(), missing.Load(), time.Since(start).Seconds(), end)
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
	enc := json.NewEncoder(stdout)
	sem := make(chan struct{}, inflight)
	var wg sync.WaitGroup
	for _, env := range envs {
		sem <- struct{}{}
		s, err := cl.Publish(ctx, env)
		if err != nil {
			<-sem
			mu.Lock()
			firstErr = errors.Join(firstErr, err)
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
				_ = enc.Encode(map[string]any{"key": s.Key, "error": err.Error()})
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
			_ = enc.Encode(res)
		}()
	}
	wg.Wait()
	tick.Stop()
	close(done)
	progress(true)
	switch {
	case firstErr != nil:
		return exitError, firstErr
	case missing.Load() > 0:
		return exitTimeout, fmt.Errorf("%d intents got no answer within %s", missing.Load(), wait)
	}
	return exitFired, nil
}

func cmdGet(ctx context.Context, args []string, stdout, stderr io.Writer) (int, error) {
	fs := flag.NewFlagSet("submit get", flag.ContinueOnError)
	fs.SetOutput(stderr)
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
	return exitFired, printJSON(stdout, rec)
}

func cmdKey(ctx context.Context, args []string, stdout, stderr io.Writer) (int, error) {
	fs := flag.NewFlagSet("submit key", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var c common
	var e envelopeFlags
	c.register(fs)
	e.register(fs)
	keyArgs := fs.String("key-args", "", "comma-separated distinguishing args (default: as the workers' catalogue says, else all args)")
	window := fs.Duration("window", 0, "time window of the key, e.g. 168h (default: as the workers' catalogue says, else none)")
	if err := c.parse(fs, args); err != nil {
		return exitError, err
	}
	env, err := e.envelope()
	if err != nil {
		return exitError, err
	}
	spec, source := intent.KeySpec{Window: *window, KeyArgs: splitList(*keyArgs)}, "flags"
	if *keyArgs == "" && *window == 0 {
		spec, source = catalogSpec(ctx, c, env.Tool)
	}
	now := time.Now()
	id, err := intent.Derive(env, spec, now)
	if err != nil {
		return exitError, err
	}
	material, err := intent.Material(env, spec, now)
	if err != nil {
		return exitError, err
	}
	return exitFired, printJSON(stdout, map[string]any{"key": id.Key, "fingerprint": id.Fingerprint, "material": string(material), "spec": source})
}

// catalogSpec asks the workers' catalogue how tool derives keys; without an
// answer it is the default derivation.
func catalogSpec(ctx context.Context, c common, tool string) (intent.KeySpec, string) {
	nc, cl, err := c.connect()
	if err != nil {
		return intent.KeySpec{}, "default (no server)"
	}
	defer nc.Close()
	cat, err := cl.Tools(ctx)
	if err != nil {
		return intent.KeySpec{}, "default (no catalogue)"
	}
	for _, t := range cat.Tools {
		if t.Name == tool {
			return t.KeySpec(), "catalogue"
		}
	}
	return intent.KeySpec{}, "default (tool not in catalogue)"
}

func cmdTools(ctx context.Context, args []string, stdout, stderr io.Writer) (int, error) {
	fs := flag.NewFlagSet("submit tools", flag.ContinueOnError)
	fs.SetOutput(stderr)
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
