package main

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"strings"
)

// newFlagSet returns the flag set of a subcommand: its usage line first,
// printed to stdout when args ask for it (-h, --help: exit 0), else to
// stderr with the error.
func newFlagSet(name, synopsis string, args []string, stdout, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	for _, a := range args {
		if a == "--" {
			break
		}
		if a == "-h" || a == "-help" || a == "--help" {
			fs.SetOutput(stdout)
			break
		}
	}
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: %s\n(submit help lists the subcommands and exit statuses)\n\nFlags:\n", synopsis)
		fs.PrintDefaults()
	}
	return fs
}

func bytesReader(b []byte) io.Reader { return bytes.NewReader(b) }

// splitList splits a comma-separated list, dropping empty items.
func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}
