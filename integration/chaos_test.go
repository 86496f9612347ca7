package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// chaosVerdict is the part of cmd/chaos's JSON verdict the test checks.
type chaosVerdict struct {
	IntentsPublished  int            `json:"intents_published"`
	UniqueOperations  int            `json:"unique_operations"`
	DuplicatesByKind  map[string]int `json:"duplicates_injected_by_kind"`
	DuplicateShare    float64        `json:"duplicate_share"`
	DelayedDeduped    int            `json:"delayed_copies_deduplicated"`
	FaultsByKind      map[string]int `json:"faults_injected_by_kind"`
	ResultsReceived   int            `json:"results_received"`
	SettledByLedger   int            `json:"settled_from_ledger"`
	Unanswered        int            `json:"unanswered_copies"`
	LedgerNotFinal    map[string]int `json:"ledger_not_final"`
	EffectsObserved   int            `json:"effects_observed"`
	OperationsFired   int            `json:"operations_fired"`
	LostOperations    int            `json:"lost_operations"`
	CompletedNotFired int            `json:"completed_without_firing"`
	FiredMoreThanOnce int            `json:"operations_fired_more_than_once"`
	ExtraFirings      int            `json:"extra_firings"`
	RepeatsCrash      int            `json:"repeats_in_crash_window"`
	RepeatsOutage     int            `json:"repeats_after_ledger_outage"`
	RepeatsOtherKey   int            `json:"repeats_with_other_keys"`
	RepeatsUnexplain  int            `json:"repeats_unexplained"`
	RepeatsPhantom    int            `json:"repeats_after_phantom_lease_loss"`
	RepeatsSameAtt    int            `json:"repeats_with_same_attempt"`
	KeyMismatches     int            `json:"requests_with_wrong_key"`
	ForeignRequests   int            `json:"requests_of_no_operation"`
	Unattributed      int            `json:"requests_without_holder_or_attempt"`
	CrashPerKill      []struct {
		Holder  string `json:"holder"`
		Repeats int    `json:"repeats"`
		Bound   int    `json:"bound"`
	} `json:"crash_repeats_per_kill"`
	ByTool map[string]struct {
		Operations int `json:"operations"`
		Fired      int `json:"fired"`
	} `json:"by_tool"`
	Durability         []string `json:"durability"`
	DurabilityDeclared []string `json:"durability_declared"`
	PowerLoss          *struct {
		Node              string            `json:"node"`
		FilesCut          int               `json:"files_cut"`
		BytesCut          int64             `json:"bytes_cut"`
		IntentsTaken      int               `json:"acknowledged_intents_taken"`
		Republished       int               `json:"taken_republished"`
		Answered          int               `json:"taken_answered"`
		LedgerWritesTaken map[string]uint64 `json:"ledger_writes_taken"`
	} `json:"power_loss"`
	Disagreeing int            `json:"disagreeing_answers"`
	Unexpected  map[string]int `json:"unexpected_answers"`
	Violations  []string       `json:"violations"`
	OK          bool           `json:"ok"`
}

// diskDir is a temporary directory on a disk: the power loss cuts the
// stores back to what the disk holds, which a directory in memory (tmpfs)
// does not model.
func diskDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err == nil && st.Type != unix.TMPFS_MAGIC && st.Type != unix.RAMFS_MAGIC {
		return dir
	}
	require.NoError(t, os.MkdirAll(filepath.Join("..", "bin"), 0o755))
	dir, err := os.MkdirTemp(filepath.Join("..", "bin"), "chaos-")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	abs, err := filepath.Abs(dir)
	require.NoError(t, err)
	return abs
}

// requirePowerLoss checks what the power loss did: it took acknowledged
// intents the server had not synced; their callers published again each
// one no record answered, and every one was answered. The ledger, synced
// before it acknowledges, lost nothing.
func requirePowerLoss(t *testing.T, v chaosVerdict) {
	t.Helper()
	pl := v.PowerLoss
	require.NotNil(t, pl, "the power loss happened")
	require.Positive(t, pl.BytesCut, "the power loss took what the disk did not hold")
	require.Positive(t, pl.IntentsTaken, "the power loss took acknowledged intents (unless the kernel wrote the work stream back first)")
	require.Positive(t, pl.Republished, "callers published again intents the power loss took before a worker claimed them")
	require.Equal(t, pl.IntentsTaken, pl.Answered, "every acknowledged intent the power loss took was answered")
	require.Empty(t, pl.LedgerWritesTaken, "the ledger kept every write it acknowledged")
}

// cachestat reports why the kernel cannot say which pages of a file in dir
// are dirty (cachestat(2), Linux 6.5), or nil.
func cachestat(dir string) error {
	f, err := os.CreateTemp(dir, "cachestat-")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	defer f.Close()
	var st unix.Cachestat_t
	return unix.Cachestat(uint(f.Fd()), &unix.CachestatRange{}, &st, 0)
}

// chaosLongOutage makes TestChaosShort's ledger outage last 75 s, as the full
// runs' does, instead of 10 s.
var chaosLongOutage = flag.Bool("chaos-long-outage", false,
	"TestChaosShort: a 75s ledger outage instead of 10s (about 2 minutes longer)")

// The short chaos run, on the shipped defaults (the workers get no
// durability flag, so the work stream persists asynchronously): a few
// thousand intents with every kind of duplicate, a tenth of the operations
// to a tool capped at one in flight, three worker processes on a JetStream
// process, one worker SIGKILLed, the JetStream process SIGKILLed and
// restarted on its store, a ledger outage of many leases (10 s; 75 s with
// -chaos-long-outage), a power loss (the process SIGKILLed, its store cut
// back to what the disk holds), hanging effects and a sink failing at
// random. Nothing may be lost: every acknowledged intent the power loss
// took is published again by its caller (docs/protocol.md 7.2) and
// answered, and the ledger keeps every write it acknowledged; nothing may
// fire twice except in the crash window of a holder that was killed, with
// the operation's key and a higher attempt. It runs alone (not in parallel)
// to keep the faults timely.
func TestChaosShort(t *testing.T) {
	if testing.Short() {
		t.Skip("chaos run skipped in -short mode")
	}
	dir := t.TempDir()
	natsServer := filepath.Join(dir, "nats-server")
	build := exec.Command("go", "build", "-o", natsServer, "github.com/nats-io/nats-server/v2")
	build.Dir = ".."
	out, err := build.CombinedOutput()
	require.NoError(t, err, "build nats-server: %s", out)

	bound, timeout, settle := 150*time.Second, "140s", "45s"
	faults := []string{"--outage-at", "0.6", "--outage-for", "10s", "--capped-share", "0.1"}
	if *chaosLongOutage {
		bound, timeout, settle = 6*time.Minute, "350s", "90s"
		faults[3] = "75s"
	}
	work := diskDir(t)
	powerLoss := "0.8"
	if err := cachestat(work); err != nil {
		// The power loss reads the page cache; without it the run has none.
		t.Logf("no power loss in this run: %v", err)
		powerLoss = "-1"
	}
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	args := append([]string{"--json",
		"--intents", "3000", "--agents", "64",
		"--kill-every", "3s", "--max-kills", "1",
		"--restart-at", "0.4", "--down-for", "1500ms",
		"--fail-rate", "0.05", "--hang-rate", "0.01", "--hang", "4s",
		"--lease", "3s", "--ack-wait", "3s", "--dup-window", "3s",
		"--power-loss-at", powerLoss,
		"--answer-wait", "30s", "--settle", settle, "--timeout", timeout, "--progress", "0",
		"--nats-server", natsServer, "--bin-dir", binDir, "--work-dir", filepath.Join(work, "run")}, faults...)
	cmd := exec.CommandContext(ctx, bin("chaos"), args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err = cmd.Run()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatalf("run chaos: %v\n%s", err, stderr.String())
	}
	t.Logf("chaos log:\n%s", stderr.String())
	var v chaosVerdict
	require.NoError(t, json.Unmarshal(stdout.Bytes(), &v), "verdict: %s\n%s", stdout.String(), stderr.String())
	t.Logf("verdict:\n%s", stdout.String())

	// The load was what it claims.
	require.GreaterOrEqual(t, v.IntentsPublished, 3000)
	require.Greater(t, v.UniqueOperations, 1000)
	require.GreaterOrEqual(t, v.DuplicateShare, 0.30)
	for _, kind := range []string{"sequential", "concurrent", "delayed", "no_msg_id", "batch"} {
		require.Positive(t, v.DuplicatesByKind[kind], "duplicates of kind %s", kind)
	}
	require.Zero(t, v.DelayedDeduped, "delayed copies are past the publish-dedup window")
	if powerLoss == "-1" {
		require.Equal(t, 1, v.FaultsByKind["worker_kill"])
	} else {
		require.Equal(t, 1+3, v.FaultsByKind["worker_kill"], "one by the injector and the three workers the power loss took")
		require.Equal(t, 1, v.FaultsByKind["power_loss"])
	}
	require.Equal(t, 1, v.FaultsByKind["jetstream_restart"])
	require.Positive(t, v.FaultsByKind["sink_5xx"])
	require.Positive(t, v.FaultsByKind["effect_hang"])
	require.Equal(t, 1, v.FaultsByKind["ledger_outage"])
	require.Empty(t, v.Durability, "the run used the shipped durability")
	require.Empty(t, v.DurabilityDeclared)
	require.Positive(t, v.ByTool["chaos_capped"].Operations)
	require.Positive(t, v.ByTool["chaos_probed"].Operations, "a share goes to the tool with a probe")

	// Nothing lost: every copy answered (at worst from the ledger), every
	// operation fired and recorded final.
	require.Zero(t, v.LostOperations)
	require.Zero(t, v.Unanswered)
	require.Empty(t, v.LedgerNotFinal)
	require.Equal(t, v.IntentsPublished, v.ResultsReceived+v.SettledByLedger)
	require.Equal(t, v.UniqueOperations, v.OperationsFired)
	require.Zero(t, v.CompletedNotFired)

	// What the power loss took was republished and answered.
	if powerLoss == "-1" {
		require.Nil(t, v.PowerLoss)
	} else {
		requirePowerLoss(t, v)
	}

	// Nothing fired twice but in the windows the design admits, and every
	// repeat carried the operation's key for the downstream to absorb.
	require.Zero(t, v.RepeatsUnexplain)
	require.Zero(t, v.RepeatsPhantom, "a live holder was told it lost its lease before anyone took it over")
	require.Zero(t, v.RepeatsOtherKey)
	require.Zero(t, v.KeyMismatches)
	require.Zero(t, v.ForeignRequests)
	require.Zero(t, v.RepeatsOutage, "a live holder cut off by the JetStream restart was taken over")
	require.Zero(t, v.RepeatsSameAtt, "an operation fired twice under one claim")
	require.Zero(t, v.Unattributed, "every request names its holder and attempt")
	for _, k := range v.CrashPerKill {
		require.LessOrEqual(t, k.Repeats, k.Bound, "kill of %s", k.Holder)
	}
	require.Equal(t, v.FiredMoreThanOnce, v.RepeatsCrash)
	require.Equal(t, v.UniqueOperations+v.ExtraFirings, v.EffectsObserved, "2xx requests = one per operation + the repeats")

	// Every caller of an operation was told the same thing, and nothing
	// was answered conflict, rejected or failed.
	require.Zero(t, v.Disagreeing)
	require.Empty(t, v.Unexpected)
	require.True(t, v.OK, "violations: %v", v.Violations)
	require.Nil(t, ee, "chaos exited %v", err)
}
