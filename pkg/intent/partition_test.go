package intent

import (
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestPartition(t *testing.T) {
	t.Parallel()
	key := "send_email.ea5b3b5ecc3fa233989582335bb7067cd6c904cb4d46baf4530950de5b22b7f6"
	// 0xea5b3b5e: the digest's first 8 hex digits.
	require.Equal(t, 0, Partition(key, 1))
	require.Equal(t, 0xea5b3b5e%8, Partition(key, 8))
	require.Equal(t, 0x5e, Partition(key, 256))
	for _, n := range []int{0, -4, 3, 12, 512} {
		require.False(t, ValidPartitions(n), n)
		require.Equal(t, 0, Partition(key, n), "an invalid count has one partition")
	}
	// Any other string: the first 4 bytes of its SHA-256 (8254c329... for "k").
	require.Equal(t, 0x8254c329%64, Partition("k", 64))
	// Doubling the count keeps a key in p or moves it to p+n.
	counts := make([]int, 16)
	for i := range 4096 {
		k := "t." + sha256hex(strconv.Itoa(i))
		p8, p16 := Partition(k, 8), Partition(k, 16)
		require.Contains(t, []int{p8, p8 + 8}, p16)
		counts[p16]++
	}
	for p, c := range counts {
		require.InDelta(t, 256, c, 80, "partition %d holds %d of 4096 keys", p, c)
	}
}

func sha256hex(s string) string { return digest([]byte(s)) }
