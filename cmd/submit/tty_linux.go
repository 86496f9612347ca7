package main

import (
	"os"
	"syscall"
	"unsafe"
)

// isatty reports whether f is a terminal: the terminal attributes can be read.
func isatty(f *os.File) bool {
	var t syscall.Termios
	_, _, e := syscall.Syscall(syscall.SYS_IOCTL, f.Fd(), syscall.TCGETS, uintptr(unsafe.Pointer(&t)))
	return e == 0
}
