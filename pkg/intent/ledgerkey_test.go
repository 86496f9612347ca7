package intent

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestLedgerKey(t *testing.T) {
	t.Parallel()
	key := "send_email.ea5b3b5ecc3fa233989582335bb7067cd6c904cb4d46baf4530950de5b22b7f6"
	got, err := LedgerKey(key, LayoutCompact)
	require.NoError(t, err)
	// base64url of ea5b3b5e cc3fa233 98958233 5bb7067c, unpadded.
	require.Equal(t, "send_email.6ls7Xsw_ojOYlYIzW7cGfA", got)
	require.Len(t, got, len("send_email.")+22)
	full, err := LedgerKey(key, LayoutFull)
	require.NoError(t, err)
	require.Equal(t, key, full)

	for _, c := range []struct {
		name, key string
	}{
		{"internal key", "_scan"},
		{"plain test key", "test.k1"},
		{"dotted key", "test.TestLedger.R1.ClaimOnce"},
		{"upper-case hex is not derived", key[:11] + strings.ToUpper(key[11:])},
		{"short digest", "send_email.ea5b3b5e"},
		{"21 characters", "send_email.6ls7Xsw_ojOYlYIzW7cGf"},
		{"23 characters", "send_email.6ls7Xsw_ojOYlYIzW7cGfAx"},
		{"invalid tool", "Send.6ls7Xsw_ojOYlYIzW7cGfA"},
		{"a compact key itself", "send_email.6ls7Xsw_ojOYlYIzW7cGfA"},
		{"any compact shape", "noop.AAAAAAAAAAAAAAAAAAAAAA"},
		{"compact shape with - and _", "t.-_-_-_-_-_-_-_-_-_-_-_"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			got, err := LedgerKey(c.key, LayoutCompact)
			require.NoError(t, err)
			require.Equal(t, c.key, got, "stored as it is")
			full, err := LedgerKey(c.key, LayoutFull)
			require.NoError(t, err)
			require.Equal(t, c.key, full)
		})
	}

	for _, layout := range []int{0, -1, 3, 10} {
		require.False(t, ValidLedgerLayout(layout), layout)
		_, err := LedgerKey(key, layout)
		require.ErrorIs(t, err, ErrInvalid, layout)
		require.ErrorContains(t, err, "layout "+strconv.Itoa(layout))
	}
	require.True(t, ValidLedgerLayout(LayoutFull))
	require.True(t, ValidLedgerLayout(LayoutCompact))
	require.Equal(t, LayoutCompact, DefaultLayout)
}

// Every derived key's compact form has the compact shape, keeps the tool,
// holds the digest's first 16 bytes (so its first 4, the partition's, are
// the same), and no two of many keys share one; no compact form is the
// stored form of a key kept as it is (those are refused).
func TestLedgerKeyShape(t *testing.T) {
	t.Parallel()
	seen := map[string]string{}
	for i := range 4096 {
		tool := []string{"send_email", "noop", "a", "charge-card_2"}[i%4]
		key := tool + "." + sha256hex(strconv.Itoa(i))
		got, err := LedgerKey(key, LayoutCompact)
		require.NoError(t, err)
		require.True(t, compactShaped(got), got)
		tl, b64, ok := strings.Cut(got, ".")
		require.True(t, ok)
		require.Equal(t, tool, tl)
		raw, err := base64.RawURLEncoding.DecodeString(b64)
		require.NoError(t, err)
		require.Len(t, raw, 16)
		require.Equal(t, key[len(tool)+1:len(tool)+33], hex.EncodeToString(raw))
		for _, n := range []int{2, 8, 64, 256} {
			require.Equal(t, Partition(key, n), int(binary.BigEndian.Uint32(raw[:4])%uint32(n)), "partition of %d", n)
		}
		if other, dup := seen[got]; dup {
			t.Fatalf("%s and %s share the ledger key %s", key, other, got)
		}
		seen[got] = key
		again, err := LedgerKey(got, LayoutCompact)
		require.NoError(t, err)
		require.Equal(t, got, again, "a compact key is its own stored form")
		require.True(t, CompactLedgerKey(got))
		for _, n := range []int{2, 8, 64, 256} {
			require.Equal(t, Partition(key, n), Partition(got, n), "a compact key is in its derived key's partition (%d)", n)
		}
	}
}

// Whatever the key, LedgerKey gives a derived key its compact form, in the
// same partition, and any other key itself.
func FuzzLedgerKey(f *testing.F) {
	for _, s := range []string{"_scan", "test.k1", "send_email.ea5b3b5ecc3fa233989582335bb7067cd6c904cb4d46baf4530950de5b22b7f6",
		"send_email.6ls7Xsw_ojOYlYIzW7cGfA", "noop.AAAAAAAAAAAAAAAAAAAAAA", "", ".", "a.b.c"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, key string) {
		got, err := LedgerKey(key, LayoutCompact)
		switch {
		case err != nil:
			t.Fatalf("LedgerKey(%q) refused: %v", key, err)
		case ValidKey(key):
			if !compactShaped(got) || !strings.HasPrefix(got, key[:len(key)-64]) || Partition(got, 256) != Partition(key, 256) {
				t.Fatalf("LedgerKey(%q) = %q, not its compact key", key, got)
			}
		case got != key:
			t.Fatalf("LedgerKey(%q) = %q, want it unchanged", key, got)
		}
		if full, err := LedgerKey(key, LayoutFull); err != nil || full != key {
			t.Fatalf("LedgerKey(%q, LayoutFull) = %q, %v", key, full, err)
		}
	})
}
