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
	}
	return exitError, fmt.Errorf("unknown audit subcommand %q: use export, verify, show or keys", args[0])
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

// auditExport writes the trail as JSON lines: submit audit export
// [--partition N] [--since T] [--until T] [-o FILE].
func auditExport(ctx context.Context, args []string, stdout, stderr io.Writer) (int, error) {
	fs := newFlagSet("submit audit export", "submit audit export [--partition N] [--since T] [--until T] [-o FILE]", args, stdout, stderr)
	var c common
	c.register(fs)
	partition := fs.Int("partition", audit.AllPartitions, "the one ledger partition to export (default: all)")
	sinceS := fs.String("since", "", "export appends from this time on: RFC 3339, or a duration back from now (24h)")
	untilS := fs.String("until", "", "export appends up to this time: RFC 3339, or a duration back from now")
	out := fs.String("o", "", "write to this file instead of standard output")
	if err := c.parse(fs, args); err != nil {
		return exitError, err
	}
	if fs.NArg() != 0 {
		return exitError, errors.New("usage: submit audit export [--partition N] [--since T] [--until T] [-o FILE]")
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
	nc, cl, err := c.connect()
	if err != nil {
		return exitError, err
	}
	defer nc.Close()
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
		n++
		if _, err := bw.Write(line); err != nil {
			return err
		}
		return bw.WriteByte('\n')
	})
	if ferr := bw.Flush(); err == nil {
		err = ferr
	}
	if err == nil && f != nil {
		err = f.Sync()
	}
	if err != nil {
		return exitError, fmt.Errorf("audit export: %w", err)
	}
	fmt.Fprintf(stderr, "%d entries exported\n", n)
	return exitFired, nil
}

// auditVerify checks an exported trail: submit audit verify FILE [--keys
// FILE].
func auditVerify(ctx context.Context, args []string, stdout, stderr io.Writer) (int, error) {
	fs := newFlagSet("submit audit verify", "submit audit verify FILE [--keys FILE]", args, stdout, stderr)
	var c common
	c.register(fs)
	keysFile := fs.String("keys", "", "the public keys to trust (a keys file: submit audit keys writes one); default: the keys the workers published")
	if err := c.parse(fs, args); err != nil {
		return exitError, err
	}
	if fs.NArg() != 1 {
		return exitError, errors.New("usage: submit audit verify FILE [--keys FILE] (FILE: an export; - for standard input)")
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
	r, err := audit.Verify(open, keys)
	if err != nil {
		return exitError, err
	}
	for _, p := range r.Partitions {
		fmt.Fprintf(stdout, "partition %d: positions %d to %d (%d entries), head %s\n", p.Partition, p.First, p.Last, p.Entries, p.Head)
	}
	for _, g := range r.Gaps {
		fmt.Fprintf(stdout, "gap: partition %d position %d: %s dropped %d events from %s to %s\n", g.Partition, g.Pos, g.Holder, g.Dropped,
			g.From.UTC().Format(time.RFC3339Nano), g.To.UTC().Format(time.RFC3339Nano))
	}
	if r.Break != nil {
		fmt.Fprintf(stdout, "BROKEN: %v\n", r.Break)
		return exitBroken, fmt.Errorf("audit verify: %s: %w", fs.Arg(0), r.Break)
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
