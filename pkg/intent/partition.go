package intent

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
)

// MaxPartitions is the most partitions a ledger may have.
const MaxPartitions = 256

// ValidPartitions reports whether n is a valid partition count: a power of
// two from 1 to MaxPartitions.
func ValidPartitions(n int) bool {
	return n >= 1 && n <= MaxPartitions && n&(n-1) == 0
}

// Partition returns the ledger partition, 0 to n-1, that holds key when the
// ledger has n partitions (a power of two; 0 for any other n). For a derived
// key (<tool> "." 64 hex digits) it is the first 8 hex digits of the digest
// read as a 32-bit big-endian number, modulo n — and the same for its
// compact form (LedgerKey), whose first 4 decoded bytes they are; for any
// other string, the first 4 bytes of its SHA-256 read the same way. Doubling n keeps a key in
// partition p or moves it to p + n, never elsewhere.
func Partition(key string, n int) int {
	if !ValidPartitions(n) || n == 1 {
		return 0
	}
	var b [4]byte
	if ValidKey(key) {
		digest := key[len(key)-64:]
		_, _ = hex.Decode(b[:], []byte(digest[:8]))
	} else if d, ok := compactDigest16(key); ok {
		copy(b[:], d[:4])
	} else {
		sum := sha256.Sum256([]byte(key))
		copy(b[:], sum[:4])
	}
	return int(binary.BigEndian.Uint32(b[:]) % uint32(n))
}
