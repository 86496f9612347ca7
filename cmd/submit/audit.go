package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/idemgate/idemgate/pkg/audit"
)

// exitBroken is submit audit verify's status for a trail that does not
// verify.
const exitBroken = 7

// cmdAudit runs submit audit export | verify | show | keys.
func cmdAudit(ctx context.Context, args []string, stdout, stderr io.Writer) (int, error) {
	if len(args) == 0 {
		return exitError, errors.New("usage: submit audit export|verify FILE|show KEY|keys (submit help)")
	}
	switch args[0] {
	case "export":
		return auditExport(ctx, args[1:], stdout, stderr)
	case "verify":
		return auditVerify(ctx, args[1:], stdout, stderr)
	case "show":
		return auditShow(ctx, args[1:], stdout, stderr)
	case "keys":
		return auditKeys(ctx, args[1:], stdout, stderr)
	case "checkpoint":
		return auditCheckpoint(ctx, args[1:], stdout, stderr)
	}
	return exitError, fmt.Errorf("unknown audit subcommand %q: use export, verify, checkpoint, show or keys", args[0])
}

// parseTime reads an RFC 3339 time, or a duration back from now (1h).
func parseTime(flagName, v string) (time.Time, error) {
	if v == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
		return t, nil
	}
	if d, err := time.ParseDuration(v); err == nil && d > 0 {
		return time.Now().Add(-d), nil
	}
	return time.Time{}, fmt.Errorf("--%s %q: give an RFC 3339 time (2026-01-02T15:04:05Z) or a duration back from now (24h)", flagName, v)
}

// auditExport writes the trail as JSON lines, ending with the checkpoints
// it was taken against: submit audit export [--partition N] [--since T]
// [--until T] [--from CP] [-o FILE].
func auditExport(ctx context.Context, args []string, stdout, stderr io.Writer) (int, error) {
	const use = "submit audit export [--partition N] [--since T] [--until T] [--from CP] [-o FILE]"
	fs := newFlagSet("submit audit export", use, args, stdout, stderr)
	var c common
	c.register(fs)
	partition := fs.Int("partition", audit.AllPartitions, "the one ledger partition to export (default: all)")
	sinceS := fs.String("since", "", "export appends from this time on: RFC 3339, or a duration back from now (24h)")
	untilS := fs.String("until", "", "export appends up to this time: RFC 3339, or a duration back from now")
	fromFile := fs.String("from", "", "export only what follows these checkpoints (a checkpoint file verified before: submit audit verify --from takes it)")
	out := fs.String("o", "", "write to this file instead of standard output")
	if err := c.parse(fs, args); err != nil {
		return exitError, err
	}
	if fs.NArg() != 0 {
		return exitError, errors.New("usage: " + use)
	}
	since, err := parseTime("since", *sinceS)
	if err != nil {
		return exitError, err
	}
	until, err := parseTime("until", *untilS)
	if err != nil {
		return exitError, err
	}
	if *partition < audit.AllPartitions {
		return exitError, fmt.Errorf("--partition %d: give a partition number, 0 or more", *partition)
	}
	after := map[int]uint64{}
	if *fromFile != "" {
		from, err := audit.LoadCheckpoints(*fromFile)
		if err != nil {
			return exitError, fmt.Errorf("--from: %w", err)
		}
		for _, cp := range from {
			after[cp.Partition] = cp.Size
			// Its appends were stored before it was made; an hour's margin
			// for the clocks of the worker and the server.
			if t := cp.At.Add(-time.Hour); since.IsZero() || t.Before(since) {
				since = t
			}
		}
	}
	nc, cl, err := c.connect()
	if err != nil {
		return exitError, err
	}
	defer nc.Close()
	// The checkpoints first: every append they commit to is stored before
	// the read starts, and the read stops each partition at its checkpoint.
	cps, fresh, err := cl.Checkpoints(ctx)
	if err != nil {
		return exitError, fmt.Errorf("audit export: %w", err)
	}
	upTo := map[int]uint64{}
	for _, cp := range cps {
		upTo[cp.Partition] = cp.Size
	}
	w := stdout
	var f *os.File
	if *out != "" {
		if f, err = os.Create(*out); err != nil {
			return exitError, err
		}
		defer func() { _ = f.Close() }()
		w = f
	}
	bw := bufio.NewWriter(w)
	n := 0
	err = cl.ReadAudit(ctx, audit.Filter{Partition: *partition, Since: since, Until: until}, func(line []byte) error {
		var at struct {
			Partition int    `json:"partition"`
			Pos       uint64 `json:"pos"`
		}
		if json.Unmarshal(line, &at) == nil {
			if size, ok := upTo[at.Partition]; ok && at.Pos > size {
				return nil // after the checkpoint: the next export's
			}
			if size, ok := after[at.Partition]; ok && at.Pos <= size {
				return nil // verified before
			}
		}
		n++
		if _, err := bw.Write(line); err != nil {
			return err
		}
		return bw.WriteByte('\n')
	})
	if err == nil && len(cps) > 0 {
		if _, err = bw.Write(audit.MarshalCheckpoints(cps)); err == nil {
			err = bw.WriteByte('\n')
		}
	}
	if ferr := bw.Flush(); err == nil {
		err = ferr
	}
	if err == nil && f != nil {
		err = f.Sync()
	}
	if err != nil {
		return exitError, fmt.Errorf("audit export: %w", err)
	}
	switch {
	case len(cps) == 0:
		fmt.Fprintf(stderr, "%d entries exported, without a checkpoint (no worker answered, none stored): verify it with --partial\n", n)
	case fresh:
		fmt.Fprintf(stderr, "%d entries exported, up to the checkpoint of %s (its last line)\n", n, cps[0].At.UTC().Format(time.RFC3339))
	default:
		fmt.Fprintf(stderr, "%d entries exported, up to the latest stored checkpoint, of %s (no worker answered for a fresh one)\n", n,
			cps[0].At.UTC().Format(time.RFC3339))
	}
	return exitFired, nil
}

// auditCheckpoint prints the checkpoints of every partition: submit audit
// checkpoint [--stored] [-o FILE].
func auditCheckpoint(ctx context.Context, args []string, stdout, stderr io.Writer) (int, error) {
	const use = "submit audit checkpoint [--stored] [-o FILE]"
	fs := newFlagSet("submit audit checkpoint", use, args, stdout, stderr)
	var c common
	c.register(fs)
	stored := fs.Bool("stored", false, "print the latest checkpoints the workers stored, without asking for fresh ones")
	out := fs.String("o", "", "write to this file instead of standard output")
	if err := c.parse(fs, args); err != nil {
		return exitError, err
	}
	if fs.NArg() != 0 {
		return exitError, errors.New("usage: " + use)
	}
	nc, cl, err := c.connect()
	if err != nil {
		return exitError, err
	}
	defer nc.Close()
	var cps []audit.Checkpoint
	fresh := false
	if *stored {
		cps, err = cl.StoredCheckpoints(ctx)
	} else {
		cps, fresh, err = cl.Checkpoints(ctx)
	}
	if err != nil {
		return exitError, err
	}
	if len(cps) == 0 {
		return exitError, errors.New("no checkpoints: no worker answered, and none are stored (do workers run, with the trail on?)")
	}
	if !fresh && !*stored {
		fmt.Fprintln(stderr, "no worker answered: the latest stored checkpoints")
	}
	data := append(audit.MarshalCheckpoints(cps), '\n')
	if *out == "" {
		_, err = stdout.Write(data)
		return exitFired, err
	}
	if err := os.WriteFile(*out, data, 0o644); err != nil {
		return exitError, err
	}
	return exitFired, nil
}

// auditVerify checks an exported trail: submit audit verify FILE [--keys
// FILE] [--checkpoint CP] [--from CP] [--partial].
func auditVerify(ctx context.Context, args []string, stdout, stderr io.Writer) (int, error) {
	const use = "submit audit verify FILE [--keys FILE] [--checkpoint CP] [--from CP] [--partial]"
	fs := newFlagSet("submit audit verify", use, args, stdout, stderr)
	var c common
	c.register(fs)
	keysFile := fs.String("keys", "", "the public keys to trust (a keys file: submit audit keys writes one); default: the keys the workers published")
	cpFile := fs.String("checkpoint", "", "a checkpoint file kept apart from the trail (submit audit checkpoint): the trail must reach it and hold its heads")
	fromFile := fs.String("from", "", "verify only what follows this checkpoint file, verified before (an earlier export's last line), and that the trail extends it")
	partial := fs.Bool("partial", false, "accept a trail without a checkpoint, or short of it, or lacking partitions (an export of one partition, or --until)")
	if err := c.parse(fs, args); err != nil {
		return exitError, err
	}
	if fs.NArg() != 1 {
		return exitError, errors.New("usage: " + use + " (FILE: an export; - for standard input)")
	}
	var opts []audit.VerifyOption
	if *partial {
		opts = append(opts, audit.Partial())
	}
	for _, f := range []struct {
		path string
		opt  func([]audit.Checkpoint) audit.VerifyOption
	}{{*cpFile, audit.WithCheckpoints}, {*fromFile, audit.From}} {
		if f.path == "" {
			continue
		}
		cps, err := audit.LoadCheckpoints(f.path)
		if err != nil {
			return exitError, err
		}
		opts = append(opts, f.opt(cps))
	}
	var keys *audit.KeySet
	var err error
	if *keysFile != "" {
		if keys, err = audit.LoadKeys(*keysFile); err != nil {
			return exitError, err
		}
	} else {
		nc, cl, err := c.connect()
		if err != nil {
			return exitError, fmt.Errorf("%w (or give the keys with --keys FILE)", err)
		}
		keys, err = cl.PublishedKeys(ctx)
		nc.Close()
		if err != nil {
			return exitError, fmt.Errorf("%w (or give the keys with --keys FILE)", err)
		}
		fmt.Fprintf(stdout, "keys: the %d the workers published (pin your own with --keys FILE)\n", keys.Len())
	}
	open, cleanup, err := opener(fs.Arg(0))
	if err != nil {
		return exitError, err
	}
	defer cleanup()
	r, err := audit.Verify(open, keys, opts...)
	if err != nil {
		return exitError, err
	}
	if r.Installation != "" {
		fmt.Fprintf(stdout, "installation %s\n", r.Installation)
	}
	for _, p := range r.Partitions {
		fmt.Fprintf(stdout, "partition %d: positions %d to %d (%d entries", p.Partition, p.First, p.Last, p.Entries)
		if p.Skipped > 0 {
			fmt.Fprintf(stdout, ", %d verified before", p.Skipped)
		}
		fmt.Fprintf(stdout, "), head %s\n", p.Head)
		if p.Unbound {
			fmt.Fprintf(stdout, "note: partition %d's first link names no installation: written before chains were bound to their installation, so a chain of another installation sharing the key would pass up to its first checkpointed head\n", p.Partition)
		}
	}
	for _, g := range r.Gaps {
		fmt.Fprintf(stdout, "gap: partition %d position %d: %s dropped %d events from %s to %s\n", g.Partition, g.Pos, g.Holder, g.Dropped,
			g.From.UTC().Format(time.RFC3339Nano), g.To.UTC().Format(time.RFC3339Nano))
	}
	if r.Break != nil {
		fmt.Fprintf(stdout, "BROKEN: %v\n", r.Break)
		return exitBroken, fmt.Errorf("audit verify: %s: %w", fs.Arg(0), r.Break)
	}
	switch {
	case len(r.Checkpoints) > 0 && !*partial:
		fmt.Fprintf(stdout, "checkpoint: of %s, %d partitions: every one reached\n", r.Checkpoints[0].At.UTC().Format(time.RFC3339Nano), r.Checkpoints[0].Partitions)
	case *partial:
		fmt.Fprintln(stdout, "partial: where the trail ends was not checked against a checkpoint")
	}
	fmt.Fprintf(stdout, "verified: %d entries, %d partitions, %d gaps; signed by %s\n", r.Entries, len(r.Partitions), len(r.Gaps),
		strings.Join(r.Signers, ", "))
	return exitFired, nil
}

// opener opens path for each pass of the verification; standard input is
// read once, into memory.
func opener(path string) (func() (io.ReadCloser, error), func(), error) {
	if path != "-" {
		if _, err := os.Stat(path); err != nil {
			return nil, nil, err
		}
		return func() (io.ReadCloser, error) { return os.Open(path) }, func() {}, nil
	}
	data, err := io.ReadAll(os.Stdin)
	if err != nil {
		return nil, nil, err
	}
	return func() (io.ReadCloser, error) { return io.NopCloser(strings.NewReader(string(data))), nil }, func() {}, nil
}

// auditShow prints one operation's history: submit audit show KEY
// [--since T] [--json].
func auditShow(ctx context.Context, args []string, stdout, stderr io.Writer) (int, error) {
	fs := newFlagSet("submit audit show", "submit audit show KEY [--since T] [--json]", args, stdout, stderr)
	var c common
	c.register(fs)
	sinceS := fs.String("since", "", "read the trail from this time (RFC 3339, or a duration back from now); default: an hour before the record's creation, or all of it when the key has no record")
	asJSON := fs.Bool("json", false, "print the trail's entries as they are (JSON lines)")
	if err := c.parse(fs, args); err != nil {
		return exitError, err
	}
	if fs.NArg() != 1 {
		return exitError, errors.New("usage: submit audit show KEY [--since T] [--json]")
	}
	since, err := parseTime("since", *sinceS)
	if err != nil {
		return exitError, err
	}
	nc, cl, err := c.connect()
	if err != nil {
		return exitError, err
	}
	defer nc.Close()
	lines, err := cl.History(ctx, fs.Arg(0), since)
	if err != nil {
		return exitError, err
	}
	if len(lines) == 0 {
		return exitError, fmt.Errorf("no audit events of %s in the trail", fs.Arg(0))
	}
	for _, line := range lines {
		if *asJSON {
			fmt.Fprintf(stdout, "%s\n", line)
			continue
		}
		fmt.Fprintln(stdout, describeEntry(line))
	}
	return exitFired, nil
}

// describeEntry is one line of a history, for people.
func describeEntry(line []byte) string {
	var e struct {
		Partition int         `json:"partition"`
		Pos       uint64      `json:"pos"`
		Event     audit.Event `json:"event"`
	}
	if err := json.Unmarshal(line, &e); err != nil {
		return string(line)
	}
	ev := e.Event
	var b strings.Builder
	fmt.Fprintf(&b, "%s  %-9s", ev.At.UTC().Format("2006-01-02T15:04:05.000Z"), ev.Kind)
	field := func(name string, v any) {
		switch x := v.(type) {
		case string:
			if x == "" {
				return
			}
		case int:
			if x == 0 {
				return
			}
		case uint64:
			if x == 0 {
				return
			}
		}
		fmt.Fprintf(&b, " %s=%v", name, v)
	}
	field("status", string(ev.Status))
	field("holder", ev.Holder)
	field("attempt", ev.Attempt)
	field("attempts", ev.Attempts)
	field("op", ev.Op)
	field("by", ev.By)
	field("reason", ev.Reason)
	field("previous_holder", ev.PreviousHolder)
	field("effect", ev.Effect)
	field("destination", ev.Destination)
	field("error_code", ev.ErrorCode)
	field("fingerprint", ev.Fingerprint)
	field("record_fingerprint", ev.RecordFingerprint)
	field("result_digest", ev.ResultDigest)
	field("intent_seq", ev.IntentSeq)
	if ev.Sig != "" {
		field("signed_by", ev.Signer)
	}
	fmt.Fprintf(&b, "  (partition %d, position %d)", e.Partition, e.Pos)
	return b.String()
}

// auditKeys prints the public keys the workers published, as a keys file
// (submit audit verify --keys takes it): submit audit keys.
func auditKeys(ctx context.Context, args []string, stdout, stderr io.Writer) (int, error) {
	fs := newFlagSet("submit audit keys", "submit audit keys", args, stdout, stderr)
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
	keys, err := cl.PublishedKeys(ctx)
	if err != nil {
		return exitError, err
	}
	return exitFired, printJSON(stdout, keys)
}
