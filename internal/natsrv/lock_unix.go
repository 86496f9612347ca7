//go:build unix

package natsrv

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// LockFile is the file in the store directory a running server holds a lock
// on, with the holder's process id in it.
const LockFile = "idemgate.lock"

// lockStore takes an exclusive lock on dir (creating it) for as long as the
// returned file stays open: a second server on the same store would corrupt
// it. The lock is the kernel's (flock), so it is released however the holder
// ends, a SIGKILL included. It fails with ErrStoreLocked when another process
// (or another server of this one) holds it.
func lockStore(dir string) (*os.File, error) {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("natsrv: store dir: %w", err)
	}
	path := filepath.Join(dir, LockFile)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o640)
	if err != nil {
		return nil, fmt.Errorf("natsrv: store dir lock: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		holder := "another process"
		if data, rerr := os.ReadFile(path); rerr == nil {
			if pid, perr := strconv.Atoi(strings.TrimSpace(string(data))); perr == nil && pid > 0 {
				holder = "process " + strconv.Itoa(pid)
			}
		}
		_ = f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w: %s is in use by %s (its lock is %s)", ErrStoreLocked, dir, holder, path)
		}
		return nil, fmt.Errorf("natsrv: store dir lock %s: %w", path, err)
	}
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return f, nil
}
