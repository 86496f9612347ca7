package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"strings"

	"github.com/nats-io/nats.go"

	"github.com/idemgate/idemgate/pkg/client"
	"github.com/idemgate/idemgate/pkg/effects"
	"github.com/idemgate/idemgate/pkg/effects/netguard"
	"github.com/idemgate/idemgate/pkg/effects/toolsfile"
	"github.com/idemgate/idemgate/pkg/intent"
)

// cmdWatch waits for the final record of KEY — an operation submitted
// earlier (after exit 2, or from another shell) — and prints it. It exits 0
// when the operation completed, 5 when it failed or was denied, 2 when no
// final record came in time. It reports the operation's outcome, not which
// call caused it.
func cmdWatch(ctx context.Context, args []string, stdout, stderr io.Writer) (int, error) {
	fs := newFlagSet("submit watch", "submit watch KEY [--wait D]", args, stdout, stderr)
	var c common
	c.register(fs)
	wait := fs.Duration("wait", defaultWait, "how long to wait for the final answer")
	if err := c.parse(fs, args); err != nil {
		return exitError, err
	}
	if fs.NArg() != 1 {
		return exitError, errors.New("usage: submit watch KEY (the key submit printed, or submit key -q ... derives)")
	}
	key := fs.Arg(0)
	if !intent.ValidKey(key) {
		return exitError, fmt.Errorf("%q is not a key: a key is <tool>.<64 hex digits>, as submit prints it", key)
	}
	nc, cl, err := c.connect()
	if err != nil {
		return exitError, err
	}
	defer nc.Close()
	wctx, cancel := context.WithTimeout(ctx, *wait)
	defer cancel()
	if rec, err := cl.Get(wctx, key); err == nil && !rec.Status.Final() {
		fmt.Fprintf(stderr, "%s is %s; waiting for its final answer\n", key, rec.Status)
	} else if errors.Is(err, client.ErrNotFound) {
		fmt.Fprintf(stderr, "%s has no record yet; waiting for one\n", key)
	}
	rec, err := cl.WatchFinal(wctx, key)
	if errors.Is(err, client.ErrNoAnswer) {
		return exitTimeout, err
	}
	if errors.Is(err, client.ErrForgotten) {
		fmt.Fprintf(stderr, "%s was %s; its next call runs it again\n", key, rec.ForgottenText())
		return exitFailed, printJSON(stdout, rec)
	}
	if err != nil {
		return exitError, err
	}
	code := exitFired
	if rec.Status != intent.StatusCompleted {
		code = exitFailed
	}
	return code, printJSON(stdout, rec)
}

// toolsFileSpec reads tool's key spec from a tools file, as the workers
// would (the file is only parsed: no effect is built to fire).
func toolsFileSpec(path, allow, tool string) (intent.KeySpec, error) {
	var prefixes []netip.Prefix
	if allow != "" {
		p, err := netguard.ParsePrefixes(strings.Split(allow, ","))
		if err != nil {
			return intent.KeySpec{}, fmt.Errorf("--webhook-allow: %w", err)
		}
		prefixes = p
	}
	reg, err := toolsfile.LoadFile(path, toolsfile.WithNATSConn(new(nats.Conn)), toolsfile.WithAllowPrivate(prefixes...))
	if err != nil {
		return intent.KeySpec{}, err
	}
	defer func() { _ = reg.Close() }()
	t, ok := reg.Lookup(tool)
	if !ok {
		return intent.KeySpec{}, fmt.Errorf("--tools %s: %w", path, reg.UnknownTool(tool))
	}
	return t.KeySpec, nil
}

// closestHint is "; did you mean X?" for the name in known nearest to name,
// else "".
func closestHint(name string, known []string) string {
	if c := effects.Closest(name, known); c != "" {
		return fmt.Sprintf("; did you mean %q?", c)
	}
	return ""
}
