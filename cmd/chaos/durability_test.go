package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/idemgate/idemgate/pkg/intent"
)

// cleanFacts is a run with one operation fired once and answered, judged
// with the durability evidence dur.
func cleanFacts(dur durabilityFacts) runFacts {
	o := &op{id: "a", kind: kindSingle, tool: toolName, key: "chaos_op.a", fp: "fp-a", recordHolder: "w1.1",
		copies: []copyOut{{Published: true, Via: "answer", Status: intent.StatusCompleted, Result: json.RawMessage(`1`)}}}
	now := time.Now()
	return runFacts{ops: []*op{o}, reqs: []request{{Time: now, Arrived: now, Key: o.key, Status: 200, Holder: "w1.1", Attempt: 1, op: o.id}},
		leases: newLeaseLog(), concurrency: 64, durability: dur}
}

// A run must say which durability settings it changed: the verdict fails
// when the server's configuration, the workers' command lines or their logs
// show a setting other than the shipped one that the run did not declare.
func TestVerdictFailsOnUndeclaredDurability(t *testing.T) {
	t.Parallel()
	always := "jetstream {\n  store_dir: \"/s\"\n  sync_interval: always\n}\n"
	worker := []string{"--nats-url", "nats://x", "--holder", "w1.1", "--concurrency", "64"}
	with := func(extra ...string) [][]string {
		return [][]string{append(append([]string(nil), worker...), extra...)}
	}
	cases := []struct {
		name     string
		cfg      config
		dur      durabilityFacts
		ran      string // the verdict's durability, joined
		declared bool   // the verdict passes
	}{
		{"the defaults", config{sync: "always", ledgerBatch: -1},
			durabilityFacts{serverConfs: []string{always}, workerArgs: with(), persist: []string{"Async"}, replicas: 1}, "", true},
		{"the defaults on a cluster", config{sync: "always", ledgerBatch: -1, cluster: true},
			durabilityFacts{serverConfs: []string{always, always, always}, workerArgs: with(), persist: []string{"Default"}, replicas: 3}, "", true},
		{"a default value passed is no change", config{sync: "always", ledgerBatch: 500},
			durabilityFacts{serverConfs: []string{always}, workerArgs: with("--ledger-batch=500"), persist: []string{"Async"}, replicas: 1}, "", true},
		{"synced, declared", config{sync: "always", synced: true, ledgerBatch: -1},
			durabilityFacts{serverConfs: []string{always}, workerArgs: with("--async-intents=false"), persist: []string{"Default"}, replicas: 1}, "--async-intents=false", true},
		{"synced, not declared", config{sync: "always", ledgerBatch: -1},
			durabilityFacts{serverConfs: []string{always}, workerArgs: with("--async-intents=false"), persist: []string{"Default"}, replicas: 1}, "--async-intents=false", false},
		{"a ledger batch as two arguments, not declared", config{sync: "always", ledgerBatch: -1},
			durabilityFacts{serverConfs: []string{always}, workerArgs: with("--ledger-batch", "0"), persist: []string{"Async"}, replicas: 1}, "--ledger-batch=0", false},
		{"a work stream that syncs though no flag says so", config{sync: "always", ledgerBatch: -1},
			durabilityFacts{serverConfs: []string{always}, workerArgs: with(), persist: []string{"Async", "Default"}, replicas: 1}, "intents_persist=Default", false},
		{"a lazy server, not declared", config{sync: "always", ledgerBatch: -1},
			durabilityFacts{serverConfs: []string{strings.Replace(always, "always", "2m", 1)}, workerArgs: with(), persist: []string{"Async"}, replicas: 1}, "sync_interval=2m", false},
		{"a lazy server, declared", config{sync: "2m", ledgerBatch: -1},
			durabilityFacts{serverConfs: []string{strings.Replace(always, "always", "2m", 1)}, workerArgs: with(), persist: []string{"Async"}, replicas: 1}, "sync_interval=2m", true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			v := &Verdict{DurabilityDeclared: c.cfg.declaredDurability()}
			judge(v, cleanFacts(c.dur))
			require.Equal(t, c.ran, strings.Join(v.Durability, " "))
			require.Equal(t, c.declared, v.OK, "violations: %v", v.Violations)
			if !c.declared {
				require.Contains(t, strings.Join(v.Violations, "\n"), "durability settings it did not declare")
			}
		})
	}
	// The flags the run declares are the flags its workers get.
	for _, cfg := range []config{{synced: true, ledgerBatch: 0, batchInFlight: 2}, {ledgerBatch: -1}} {
		cfg.sync = "always"
		v := &Verdict{DurabilityDeclared: cfg.declaredDurability()}
		judge(v, cleanFacts(durabilityFacts{serverConfs: []string{always}, workerArgs: with(cfg.workerDurabilityArgs()...),
			persist: []string{map[bool]string{true: "Default", false: "Async"}[cfg.synced]}, replicas: 1}))
		require.True(t, v.OK, "%+v: %v", cfg, v.Violations)
	}
}

// The power loss's verdict counts the acknowledged intents it took — stored
// by the start it cut, above the work stream's last sequence kept — and
// fails when one of them is not answered, or when it took an acknowledged
// ledger write.
func TestVerdictOfAPowerLoss(t *testing.T) {
	t.Parallel()
	answered := intent.StatusCompleted
	facts := func(ledgerAfter uint64, copies ...copyOut) runFacts {
		f := cleanFacts(durabilityFacts{replicas: 1})
		f.ops[0].copies = append(f.ops[0].copies, copies...)
		f.powerLoss = &PowerLoss{Node: "n1", WorkStream: "IDEM_INTENTS", epoch: 2,
			Before: map[string]uint64{"IDEM_INTENTS": 40, "KV_IDEM_LEDGER": 100, "IDEM_AUDIT": 9},
			After:  map[string]uint64{"IDEM_INTENTS": 10, "KV_IDEM_LEDGER": ledgerAfter, "IDEM_AUDIT": 3}}
		f.powerLossWanted = true
		return f
	}
	kept := copyOut{Published: true, Seq: 10, Epoch: 2, Status: answered, Result: json.RawMessage(`1`)}
	takenRepublished := copyOut{Published: true, Seq: 11, Epoch: 2, Republished: 1, Status: answered, Result: json.RawMessage(`1`)}
	takenAnswered := copyOut{Published: true, Seq: 12, Epoch: 2, Status: answered, Result: json.RawMessage(`1`)}
	earlierStart := copyOut{Published: true, Seq: 30, Epoch: 1, Status: answered, Result: json.RawMessage(`1`)}
	ambiguous := copyOut{Published: true, Seq: 30, Epoch: -1, Status: answered, Result: json.RawMessage(`1`)}
	duplicate := copyOut{Published: true, Duplicate: true, Epoch: 2, Status: answered, Result: json.RawMessage(`1`)}
	takenUnanswered := copyOut{Published: true, Seq: 13, Epoch: 2}

	v := &Verdict{}
	judge(v, facts(104, kept, takenRepublished, takenAnswered, earlierStart, ambiguous, duplicate))
	require.True(t, v.OK, "violations: %v", v.Violations)
	require.Equal(t, 2, v.PowerLoss.IntentsTaken)
	require.Equal(t, 1, v.PowerLoss.Republished)
	require.Equal(t, 2, v.PowerLoss.Answered)
	require.Empty(t, v.PowerLoss.LedgerWritesTaken, "the audit stream is not the ledger")

	v = &Verdict{}
	judge(v, facts(104, kept, takenRepublished, takenUnanswered))
	require.False(t, v.OK)
	require.Equal(t, 2, v.PowerLoss.IntentsTaken)
	require.Contains(t, strings.Join(v.Violations, "\n"), "1 of the 2 acknowledged intents the power loss took were never answered")

	v = &Verdict{}
	judge(v, facts(97, kept, takenRepublished))
	require.False(t, v.OK)
	require.Equal(t, map[string]uint64{"KV_IDEM_LEDGER": 3}, v.PowerLoss.LedgerWritesTaken)
	require.Contains(t, strings.Join(v.Violations, "\n"), "the power loss took acknowledged ledger writes")

	// A run that was to cut the power and did not.
	f := facts(104)
	f.powerLoss = nil
	v = &Verdict{}
	judge(v, f)
	require.False(t, v.OK)
	require.Contains(t, strings.Join(v.Violations, "\n"), "the power loss did not happen")
}

// cutToDisk keeps of each file what the disk holds: what was synced, not
// what is only in the page cache.
func TestCutToDiskKeepsWhatWasSynced(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	if err := checkDiskBacked(dir); err != nil {
		t.Skip(err)
	}
	page := int64(os.Getpagesize())
	write := func(name string, synced, unsynced int64) string {
		path := filepath.Join(dir, name)
		f, err := os.Create(path)
		require.NoError(t, err)
		defer f.Close()
		_, err = f.Write(make([]byte, synced))
		require.NoError(t, err)
		require.NoError(t, f.Sync())
		b := make([]byte, unsynced)
		for i := range b {
			b[i] = 'x'
		}
		_, err = f.Write(b)
		require.NoError(t, err)
		return path
	}
	partly := write("partly.blk", 3*page, 2*page+100)
	synced := write("synced.blk", 2*page+17, 0)
	never := write("never.dat", 0, 61)
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "sub"), 0o755))
	nested := write(filepath.Join("sub", "nested.blk"), page, page)
	for _, p := range []string{partly, never, nested} {
		f, err := os.Open(p)
		require.NoError(t, err)
		var st unix.Cachestat_t
		err = unix.Cachestat(uint(f.Fd()), &unix.CachestatRange{}, &st, 0)
		f.Close()
		if err != nil {
			t.Skipf("cachestat: %v", err)
		}
		if st.Dirty+st.Writeback == 0 {
			t.Skipf("the kernel wrote %s back before the test could cut it", p)
		}
	}
	var cuts []string
	files, bytes, err := cutToDisk(dir, func(path string, from, to int64) { cuts = append(cuts, filepath.Base(path)) })
	require.NoError(t, err)
	size := func(p string) int64 {
		fi, err := os.Stat(p)
		require.NoError(t, err)
		return fi.Size()
	}
	require.Equal(t, 3*page, size(partly), "the synced pages are kept, the unsynced ones taken")
	require.Equal(t, 2*page+17, size(synced), "a synced file is kept whole")
	require.Zero(t, size(never), "a file never synced is taken whole")
	require.Equal(t, page, size(nested))
	require.Equal(t, 3, files, "cut: %v", cuts)
	require.Equal(t, 2*page+100+61+page, bytes)
}
