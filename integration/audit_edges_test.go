package integration

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/pkg/audit"
)

// exported is an export of a trail, read back: its entry lines and its
// last line, the checkpoints.
type exported struct {
	entries [][]byte
	cp      []byte
}

func readExport(t *testing.T, file string) exported {
	t.Helper()
	data, err := os.ReadFile(file)
	require.NoError(t, err)
	ls := bytes.Split(bytes.TrimSpace(data), []byte{'\n'})
	require.Greater(t, len(ls), 1)
	last := ls[len(ls)-1]
	require.True(t, bytes.HasPrefix(last, []byte(`{"checkpoints":`)), "an export ends with its checkpoint: %s", last)
	return exported{entries: ls[:len(ls)-1], cp: last}
}

// loc is an entry line's partition and position, and whether it is
// sealed (the last of its append).
func loc(t *testing.T, line []byte) (partition int, pos uint64, sealed bool) {
	t.Helper()
	var e struct {
		Partition int             `json:"partition"`
		Pos       uint64          `json:"pos"`
		Seal      json.RawMessage `json:"seal"`
	}
	require.NoError(t, json.Unmarshal(line, &e), string(line))
	return e.Partition, e.Pos, e.Seal != nil
}

// writeLines writes lines as a trail file and returns its path.
func writeLines(t *testing.T, name string, ls ...[]byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	require.NoError(t, os.WriteFile(p, append(bytes.Join(ls, []byte{'\n'}), '\n'), 0o644))
	return p
}

// checkpointSizes reads a checkpoint file's sizes by partition.
func checkpointSizes(t *testing.T, data []byte) map[int]uint64 {
	t.Helper()
	cps, err := audit.ParseCheckpoints(data)
	require.NoError(t, err)
	sizes := map[int]uint64{}
	for _, c := range cps {
		sizes[c.Partition] = c.Size
	}
	return sizes
}

// Two installations sharing one signing key, 4 partitions each. The
// genuine export verifies, with and without a checkpoint kept apart; the
// last append of a partition dropped, a partition removed, a partition
// replaced by the other installation's, and the file cut and checked
// against a checkpoint each fail, naming the partition and position. From
// a checkpoint verified before, verify accepts what extends it and refuses
// a rewritten past. The operator API serves the checkpoints.
func TestAuditTrailHoldsAtItsEdges(t *testing.T) {
	t.Parallel()
	urlA, urlB := jetStream(t), jetStream(t)
	tools := writeTools(t, `tools:
  echo:
    effect: noop
    key_args: [n]
`)
	key := filepath.Join(t.TempDir(), "shared.key")
	startWorker(t, "a1", urlA, tools, "--ledger-partitions", "4", "--audit-key", key)
	startWorker(t, "b1", urlB, tools, "--ledger-partitions", "4", "--audit-key", key)
	n := 0
	// fill runs operations on url until every partition's chain holds at
	// least min entries (two appends or more for most).
	fill := func(url string, min uint64) {
		t.Helper()
		for {
			for range 6 {
				n++
				s := submit(t, url, "--tool", "echo", "--args", fmt.Sprintf(`{"n":%d}`, n))
				require.Equal(t, 0, s.code, s.stdout+s.stderr)
			}
			cp := submit(t, url, "audit", "checkpoint")
			require.Equal(t, 0, cp.code, cp.stderr)
			sizes := checkpointSizes(t, []byte(cp.stdout))
			full := len(sizes) == 4
			for _, size := range sizes {
				full = full && size >= min
			}
			if full {
				return
			}
		}
	}
	fill(urlA, 4)
	fill(urlB, 4)

	dir := t.TempDir()
	ks := submit(t, urlA, "audit", "keys")
	require.Equal(t, 0, ks.code, ks.stderr)
	keysFile := filepath.Join(dir, "keys.json")
	require.NoError(t, os.WriteFile(keysFile, []byte(ks.stdout), 0o644))
	bks := submit(t, urlB, "audit", "keys")
	ka, err := audit.ParseKeys([]byte(ks.stdout))
	require.NoError(t, err)
	kb, err := audit.ParseKeys([]byte(bks.stdout))
	require.NoError(t, err)
	require.Equal(t, 1, ka.Len())
	require.Equal(t, ka.Keys()[0].ID, kb.Keys()[0].ID, "one key, published in both")
	verify := func(file string, extra ...string) submitted {
		t.Helper()
		return submit(t, urlA, append([]string{"audit", "verify", file, "--keys", keysFile}, extra...)...)
	}
	broken := regexp.MustCompile(`BROKEN: line (\d+) \(partition (\d+), position (\d+)\): (\w+)`)
	requireBreak := func(s submitted, kind string, partition int, pos uint64) {
		t.Helper()
		require.Equal(t, 7, s.code, s.stdout+s.stderr)
		m := broken.FindStringSubmatch(s.stdout)
		require.NotNil(t, m, s.stdout)
		require.Equal(t, kind, m[4], s.stdout)
		require.Equal(t, strconv.Itoa(partition), m[2], s.stdout)
		require.Equal(t, strconv.FormatUint(pos, 10), m[3], s.stdout)
	}

	// A checkpoint an auditor keeps; then more operations.
	kept := filepath.Join(dir, "kept.json")
	require.Equal(t, 0, submit(t, urlA, "audit", "checkpoint", "-o", kept).code)
	fill(urlA, 8)

	// The genuine exports verify, alone and against the kept checkpoint.
	fileA, fileB := filepath.Join(dir, "a.jsonl"), filepath.Join(dir, "b.jsonl")
	for url, file := range map[string]string{urlA: fileA, urlB: fileB} {
		exp := submit(t, url, "audit", "export", "-o", file)
		require.Equal(t, 0, exp.code, exp.stderr)
		require.Contains(t, exp.stderr, "up to the checkpoint")
	}
	v := verify(fileA)
	require.Equal(t, 0, v.code, v.stdout+v.stderr)
	require.Contains(t, v.stdout, "every one reached")
	v = verify(fileA, "--checkpoint", kept)
	require.Equal(t, 0, v.code, v.stdout+v.stderr)
	a, b := readExport(t, fileA), readExport(t, fileB)
	require.NotEqual(t, a.cp, b.cp)

	// The last append of partition 0 dropped: short of the checkpoint.
	var lastSealed, prevSealed uint64
	for _, l := range a.entries {
		if p, pos, sealed := loc(t, l); p == 0 && sealed {
			prevSealed, lastSealed = lastSealed, pos
		}
	}
	require.NotZero(t, prevSealed, "partition 0 holds two appends")
	var short [][]byte
	for _, l := range a.entries {
		if p, pos, _ := loc(t, l); p != 0 || pos <= prevSealed {
			short = append(short, l)
		}
	}
	requireBreak(verify(writeLines(t, "short.jsonl", append(short, a.cp)...)), "short", 0, prevSealed)

	// Partition 2 removed.
	sizes := checkpointSizes(t, a.cp)
	var removed [][]byte
	for _, l := range a.entries {
		if p, _, _ := loc(t, l); p != 2 {
			removed = append(removed, l)
		}
	}
	requireBreak(verify(writeLines(t, "removed.jsonl", append(removed, a.cp)...)), "missing_partition", 2, sizes[2])

	// Partition 1 replaced by installation B's (signed by the same key).
	var replaced [][]byte
	for _, l := range a.entries {
		if p, _, _ := loc(t, l); p != 1 {
			replaced = append(replaced, l)
		}
	}
	for _, l := range b.entries {
		if p, _, _ := loc(t, l); p == 1 {
			replaced = append(replaced, l)
		}
	}
	requireBreak(verify(writeLines(t, "replaced.jsonl", append(replaced, a.cp)...)), "other_installation", 1, 1)

	// The file cut in half: no checkpoint left in it, which verify refuses;
	// checked against the auditor's copy of the export's checkpoint, it
	// stops short of it, named where.
	half := a.entries[:len(a.entries)/2]
	for len(half) > 0 {
		if _, _, sealed := loc(t, half[len(half)-1]); sealed {
			break
		}
		half = half[:len(half)-1]
	}
	cut := writeLines(t, "cut.jsonl", half...)
	v = verify(cut)
	require.Equal(t, 7, v.code, v.stdout)
	require.Contains(t, v.stdout, "no_checkpoint")
	copyCP := writeLines(t, "copy.json", a.cp)
	v = verify(cut, "--checkpoint", copyCP)
	m := broken.FindStringSubmatch(v.stdout)
	require.NotNil(t, m, v.stdout)
	require.Contains(t, []string{"short", "missing_partition"}, m[4], v.stdout)
	p, err := strconv.Atoi(m[2])
	require.NoError(t, err)
	ends := map[int]uint64{}
	for _, l := range half {
		lp, pos, _ := loc(t, l)
		ends[lp] = pos
	}
	require.Less(t, ends[p], sizes[p], "the partition named is one the cut shortened")
	require.Equal(t, strconv.FormatUint(ends[p], 10), m[3], v.stdout)
	// Told it is partial, it verifies what it holds.
	v = verify(cut, "--partial")
	require.Equal(t, 0, v.code, v.stdout+v.stderr)

	// Incremental: from the export's checkpoint, verified, only what
	// follows is exported and verified.
	fill(urlA, sizes[0]+4)
	laterCP := filepath.Join(dir, "later.json")
	require.Equal(t, 0, submit(t, urlA, "audit", "checkpoint", "-o", laterCP).code)
	exp := submit(t, urlA, "audit", "export", "--from", copyCP, "-o", filepath.Join(dir, "next.jsonl"))
	require.Equal(t, 0, exp.code, exp.stderr)
	next := readExport(t, filepath.Join(dir, "next.jsonl"))
	for _, l := range next.entries {
		lp, pos, _ := loc(t, l)
		require.Greater(t, pos, sizes[lp], "only what follows the checkpoint")
	}
	v = verify(filepath.Join(dir, "next.jsonl"), "--from", copyCP)
	require.Equal(t, 0, v.code, v.stdout+v.stderr)
	require.Contains(t, v.stdout, "every one reached")
	// What follows the first export links its heads to those of a later
	// checkpoint: the first export is a prefix of what that one commits to.
	v = verify(filepath.Join(dir, "next.jsonl"), "--from", copyCP, "--checkpoint", laterCP)
	require.Equal(t, 0, v.code, v.stdout+v.stderr)
	// Installation B's later checkpoint is not.
	laterB := filepath.Join(dir, "later-b.json")
	require.Equal(t, 0, submit(t, urlB, "audit", "checkpoint", "-o", laterB).code)
	v = verify(filepath.Join(dir, "next.jsonl"), "--from", copyCP, "--checkpoint", laterB)
	require.Equal(t, 7, v.code, v.stdout)
	require.Contains(t, v.stdout, "other_installation")
	// A whole later export, from the same checkpoint: what it held is
	// skipped, the rest verified.
	later := filepath.Join(dir, "later.jsonl")
	require.Equal(t, 0, submit(t, urlA, "audit", "export", "-o", later).code)
	v = verify(later, "--from", copyCP)
	require.Equal(t, 0, v.code, v.stdout+v.stderr)
	require.Contains(t, v.stdout, "verified before")
	// A rewritten past: the entry at partition 0's checkpointed head
	// changed (its event's time), and the trail after it.
	l := readExport(t, later)
	for i, line := range l.entries {
		if lp, pos, _ := loc(t, line); lp == 0 && pos == sizes[0] {
			l.entries[i] = regexp.MustCompile(`"at":"[^"]*"`).ReplaceAll(bytes.Clone(line), []byte(`"at":"2026-01-01T00:00:00Z"`))
		}
	}
	requireBreak(verify(writeLines(t, "rewritten.jsonl", append(l.entries, l.cp)...), "--from", copyCP), "checkpoint", 0, sizes[0])
	// Installation B's trail is not a continuation of A's.
	v = verify(fileB, "--from", copyCP)
	require.Equal(t, 7, v.code, v.stdout)
	require.Contains(t, v.stdout, "other_installation")

	// The operator API serves the checkpoints, to operators.
	gw := startGateway(t, urlA)
	r := gw.do(t, http.MethodGet, "/v1/audit/checkpoint", operator, "")
	require.Equal(t, http.StatusOK, r.status, r.raw)
	cps, err := audit.ParseCheckpoints([]byte(r.raw))
	require.NoError(t, err)
	require.Len(t, cps, 4)
	keys, err := audit.LoadKeys(keysFile)
	require.NoError(t, err)
	for _, c := range cps {
		require.NoError(t, c.Verify(keys))
		require.GreaterOrEqual(t, c.Size, sizes[c.Partition])
		require.WithinDuration(t, time.Now(), c.At, time.Minute)
	}
	requireProblem(t, gw.do(t, http.MethodGet, "/v1/audit/checkpoint", agentA, ""), http.StatusForbidden, "forbidden")
}
