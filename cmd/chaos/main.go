// Command chaos checks "nothing lost, nothing fired twice" under real faults.
//
// It runs a real JetStream (one nats-server process, or three clustered with
// --cluster), a webhook sink that logs every request with its
// Idempotency-Key, Idem-Holder and Idem-Attempt (cmd/sink), and several
// worker processes, each start of one a holder of its own name; publishes a
// load of tool intents with many kinds of duplicates (a share of them to a
// second tool capped at one in flight), every copy following the retry rule
// of docs/protocol.md 7.2; injects faults while the load runs (workers
// SIGKILLed and restarted, the JetStream process or one cluster node
// SIGKILLed and restarted on its store, a ledger outage of over a minute, a
// power loss that cuts a node's store back to what the disk holds, effects
// that hang past their lease, a sink that fails at random); then makes sure
// every copy has an answer (or its key a final ledger record) and reconciles
// the answers with the requests the sink saw and the workers' logs. The
// workers run with the shipped durability unless a flag says otherwise, and
// the verdict names what a run changed. It prints a verdict (--json for
// JSON) and exits 1 when the verdict has a violation, 2 when the run itself
// failed.
//
//	chaos --intents 100000                 single node, every fault
//	chaos --intents 100000 --cluster       three nodes, R3, one node killed mid-load, then two for the outage
//	chaos --intents 100000 --synced        the work stream synced (the workers' --async-intents=false)
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/idemgate/idemgate/pkg/dedup"
	"github.com/idemgate/idemgate/pkg/intent"
)

// config is the run's configuration, from flags.
type config struct {
	intents       int
	agents        int
	workers       int
	concurrency   int
	ledgerBatch   int  // the workers' --ledger-batch; -1: not passed
	batchInFlight int  // the workers' --ledger-batch-inflight; 0: not passed
	synced        bool // the workers' --async-intents=false
	partitions    int
	cluster       bool
	natsServer    string
	binDir        string
	workDir       string
	keep          bool
	sync          string
	seed          uint64
	jsonOut       bool
	killEvery     time.Duration
	maxKills      int
	restartAt     float64
	downFor       time.Duration
	outageAt      float64
	outageFor     time.Duration
	powerLossAt   float64
	cappedShare   float64
	probedShare   float64
	failRate      float64
	hangRate      float64
	hang          time.Duration
	lease         time.Duration
	ackWait       time.Duration
	dupWindow     time.Duration
	answerWait    time.Duration
	settle        time.Duration
	timeout       time.Duration
	singleShare   float64
	allowOutage   bool
	progressEach  time.Duration
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cfg, err := parseFlags(args, stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintln(stderr, "chaos:", err)
		return 2
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.timeout)
	defer cancel()
	v, err := runChaos(ctx, cfg, stderr)
	if err != nil {
		fmt.Fprintln(stderr, "chaos:", err)
		return 2
	}
	if cfg.jsonOut {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		_ = enc.Encode(v)
	} else {
		v.print(stdout)
	}
	if !v.OK {
		return 1
	}
	return 0
}

// answerBudget is how long one copy may take to be published and answered
// during the load: --answer-wait, plus the ledger outage when there is one
// (a copy caught by it waits it out).
func (c config) answerBudget() time.Duration {
	if c.outageAt >= 0 {
		return c.answerWait + c.outageFor
	}
	return c.answerWait
}

func parseFlags(args []string, stderr io.Writer) (config, error) {
	var c config
	fs := flag.NewFlagSet("chaos", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.IntVar(&c.intents, "intents", 100000, "intents to publish, duplicates included")
	fs.Float64Var(&c.singleShare, "single-share", 0.45, "share of operations published once; the others get copies of one duplicate kind")
	fs.IntVar(&c.agents, "agents", 96, "operations in flight at once")
	fs.IntVar(&c.workers, "workers", 3, "worker processes")
	fs.IntVar(&c.concurrency, "concurrency", 64, "intents each worker handles at once")
	fs.IntVar(&c.ledgerBatch, "ledger-batch", -1, "pass the workers --ledger-batch N (0: every ledger write on its own); -1: not passed, their default")
	fs.IntVar(&c.batchInFlight, "ledger-batch-inflight", 0, "pass the workers --ledger-batch-inflight N; 0: not passed, their default")
	fs.BoolVar(&c.synced, "synced", false, "run the workers with --async-intents=false: the work stream syncs every intent and ack before acknowledging it (without it the workers run with no durability flag: at one replica the work stream persists asynchronously and the load's callers follow the retry rule, docs/protocol.md 7.2)")
	fs.IntVar(&c.partitions, "partitions", 1, "the workers' --ledger-partitions; with --cluster the node killed mid-load is the one leading the most partitions")
	fs.BoolVar(&c.cluster, "cluster", false, "three clustered JetStream nodes, stream and ledger at R3; one node is killed mid-load instead of the single node")
	fs.StringVar(&c.natsServer, "nats-server", "", "nats-server binary (default: built from the pinned module into the work directory)")
	fs.StringVar(&c.binDir, "bin-dir", "", "directory of the worker and sink binaries (default: this binary's directory)")
	fs.StringVar(&c.workDir, "work-dir", "", "directory for stores, logs and the sink log (default: a temporary directory)")
	fs.BoolVar(&c.keep, "keep", false, "keep the work directory")
	fs.StringVar(&c.sync, "sync", "always", "JetStream sync_interval: always, or an interval like 2m (the server's default)")
	fs.Uint64Var(&c.seed, "seed", 0, "random seed (0: from the clock)")
	fs.BoolVar(&c.jsonOut, "json", false, "print the verdict as JSON")
	fs.BoolVar(&c.allowOutage, "allow-outage-repeats", false, "accept repeats (same key, higher attempt) whose holder logged it was cut off from the ledger past its lease deadline; they are still counted and reported")
	fs.DurationVar(&c.killEvery, "kill-every", 4*time.Second, "SIGKILL a random worker this often (0: never)")
	fs.IntVar(&c.maxKills, "max-kills", 0, "stop killing workers after this many (0: no limit)")
	fs.Float64Var(&c.restartAt, "restart-at", 0.5, "SIGKILL and restart JetStream (one node with --cluster) when this share of the intents is published (negative: never)")
	fs.DurationVar(&c.downFor, "down-for", 2*time.Second, "how long the killed JetStream process stays down")
	fs.Float64Var(&c.outageAt, "outage-at", 0.25, "take the ledger down for --outage-for when this share of the intents is published: the JetStream process, or with --cluster two of the three nodes (no quorum): holders cut off by it must keep their outcomes through it (negative: never)")
	fs.Float64Var(&c.powerLossAt, "power-loss-at", 0.75, "cut the power of JetStream when this share of the intents is published (with --cluster: of the node leading the intent stream): SIGKILL it, cut every store file back to what the disk holds (the page cache's dirty pages are lost) and start it again (negative: never)")
	fs.DurationVar(&c.outageFor, "outage-for", 75*time.Second, "how long the ledger outage lasts: many leases, and over a minute")
	fs.Float64Var(&c.cappedShare, "capped-share", 0.1, "share of the operations sent to a second tool, "+cappedTool+", with max_in_flight: 1 (0: none)")
	fs.Float64Var(&c.probedShare, "probed-share", 0.1, "share of the operations sent to a third tool, "+probedTool+", whose probe asks the sink before a takeover fires again (0: none)")
	fs.Float64Var(&c.failRate, "fail-rate", 0.05, "share of sink requests answered 503")
	fs.Float64Var(&c.hangRate, "hang-rate", 0.003, "share of sink requests that hang for --hang")
	fs.DurationVar(&c.hang, "hang", 5*time.Second, "how long a hanging request hangs (more than --lease)")
	fs.DurationVar(&c.lease, "lease", 2*time.Second, "the tool's lease")
	fs.DurationVar(&c.ackWait, "ack-wait", 3*time.Second, "the workers' --ack-wait")
	fs.DurationVar(&c.dupWindow, "dup-window", 4*time.Second, "the workers' --dup-window (delayed copies are sent after it)")
	fs.DurationVar(&c.answerWait, "answer-wait", 45*time.Second, "how long one copy waits for its answer during the load")
	fs.DurationVar(&c.settle, "settle", 3*time.Minute, "after the load, how long copies without an answer may watch the ledger")
	fs.DurationVar(&c.timeout, "timeout", 2*time.Hour, "bound of the whole run")
	fs.DurationVar(&c.progressEach, "progress", 10*time.Second, "progress line interval on stderr (0: none)")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	var errs []error
	check := func(ok bool, format string, a ...any) {
		if !ok {
			errs = append(errs, fmt.Errorf(format, a...))
		}
	}
	check(c.intents >= 10, "--intents %d: use at least 10", c.intents)
	check(c.agents >= 1, "--agents %d: use at least 1", c.agents)
	check(c.workers >= 1, "--workers %d: use at least 1", c.workers)
	check(c.concurrency >= 1, "--concurrency %d: use at least 1", c.concurrency)
	check(intent.ValidPartitions(c.partitions), "--partitions %d: use a power of two from 1 to %d", c.partitions, intent.MaxPartitions)
	check(c.ledgerBatch >= -1 && c.ledgerBatch <= dedup.MaxBatch, "--ledger-batch %d: use 0 (off) to %d, or -1 (the workers' default)", c.ledgerBatch, dedup.MaxBatch)
	check(c.batchInFlight >= 0 && c.batchInFlight <= 8, "--ledger-batch-inflight %d: use 1 to 8, or 0 (the workers' default)", c.batchInFlight)
	check(c.singleShare >= 0 && c.singleShare < 1, "--single-share %v: use [0, 1)", c.singleShare)
	check(c.failRate >= 0 && c.failRate < 0.5, "--fail-rate %v: use [0, 0.5)", c.failRate)
	check(c.hangRate >= 0 && c.hangRate <= 0.1, "--hang-rate %v: use [0, 0.1]", c.hangRate)
	check(c.hangRate == 0 || c.hang > c.lease, "--hang %s: must exceed --lease %s, or hangs prove nothing", c.hang, c.lease)
	check(c.lease >= time.Second, "--lease %s: use at least 1s", c.lease)
	check(c.ackWait >= time.Second, "--ack-wait %s: use at least 1s", c.ackWait)
	check(c.dupWindow >= time.Second, "--dup-window %s: use at least 1s", c.dupWindow)
	check(c.restartAt < 1, "--restart-at %v: use a share below 1, or negative for never", c.restartAt)
	check(c.powerLossAt < 1, "--power-loss-at %v: use a share below 1, or negative for never", c.powerLossAt)
	check(c.outageAt < 1, "--outage-at %v: use a share below 1, or negative for never", c.outageAt)
	check(c.outageAt < 0 || c.outageFor >= time.Second, "--outage-for %s: use at least 1s", c.outageFor)
	check(c.cappedShare >= 0 && c.cappedShare <= 0.5, "--capped-share %v: use [0, 0.5]", c.cappedShare)
	check(c.probedShare >= 0 && c.probedShare <= 0.5, "--probed-share %v: use [0, 0.5]", c.probedShare)
	check(c.answerWait > 0 && c.settle > 0 && c.timeout > 0, "--answer-wait, --settle and --timeout must be positive")
	if err := errors.Join(errs...); err != nil {
		return c, err
	}
	if c.binDir == "" {
		exe, err := os.Executable()
		if err != nil {
			return c, fmt.Errorf("find this binary's directory (pass --bin-dir): %w", err)
		}
		c.binDir = filepath.Dir(exe)
	}
	for _, b := range []string{"worker", "sink"} {
		if _, err := os.Stat(filepath.Join(c.binDir, b)); err != nil {
			return c, fmt.Errorf("no %s binary in %s (go build -o bin/ ./cmd/..., or pass --bin-dir)", b, c.binDir)
		}
	}
	if c.seed == 0 {
		c.seed = uint64(time.Now().UnixNano())
	}
	return c, nil
}
