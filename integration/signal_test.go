package integration

import "syscall"

var sigterm = syscall.SIGTERM
