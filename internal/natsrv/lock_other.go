//go:build !unix

package natsrv

import (
	"fmt"
	"os"
)

// LockFile is the file in the store directory a running server holds a lock
// on. Without flock (this platform) the store is not locked.
const LockFile = "idemgate.lock"

// lockStore creates dir; this platform has no flock, so a second server on
// the same store is not refused.
func lockStore(dir string) (*os.File, error) {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("natsrv: store dir: %w", err)
	}
	return nil, nil
}
