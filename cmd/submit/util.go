package main

import (
	"bytes"
	"io"
	"strings"
)

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
