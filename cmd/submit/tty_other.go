//go:build !linux

package main

import "os"

// isatty reports whether f looks like a terminal: a character device other
// than the null device.
func isatty(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0 && f.Name() != os.DevNull
}
