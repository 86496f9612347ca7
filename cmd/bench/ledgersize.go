package main

// The ledger-size scenario: fill a ledger to millions of keys, in steps,
// with records as the worker writes them (a claim, then the completion by
// compare-and-set with the retention as its TTL), on a nats-server in its own
// process; at each step print the create rate, the server's heap and RSS per
// key, leader-read and duplicate-claim latency and the store's disk per key.
//
//	bench ledger-size -nats-server bin/nats-server -keys 4000000 -step 1000000

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemgate/idemgate/pkg/dedup"
	"github.com/idemgate/idemgate/pkg/intent"
)

// ledgerSizeConfig is the scenario's configuration (its flags).
type ledgerSizeConfig struct {
	Server      string        // nats-server executable
	Keys        int           // keys at the last step
	Step        int           // keys added per step
	Concurrency int           // writing goroutines
	Samples     int           // reads and duplicate claims timed per step
	Partitions  int           // ledger partitions
	ResultBytes int           // bytes of each record's result
	Layout      int           // the ledger's key layout (intent.LedgerKey)
	TTL         time.Duration // the records' retention
	StoreDir    string        // parent of the server's fresh store directory
	Sync        string        // the server's sync_interval ("" for its default)
	Keep        bool          // keep the store directory
}

// ledgerSizeMain runs the scenario with the given flags.
func ledgerSizeMain(ctx context.Context, args []string, out io.Writer) error {
	fset := flag.NewFlagSet("bench ledger-size", flag.ContinueOnError)
	var c ledgerSizeConfig
	fset.StringVar(&c.Server, "nats-server", "bin/nats-server", "nats-server executable, run as its own process so its heap and RSS are its own (go build -o bin/nats-server github.com/nats-io/nats-server/v2)")
	fset.IntVar(&c.Keys, "keys", 4_000_000, "keys in the ledger at the last step")
	fset.IntVar(&c.Step, "step", 1_000_000, "keys added per step")
	fset.IntVar(&c.Concurrency, "concurrency", 64, "goroutines claiming and completing keys")
	fset.IntVar(&c.Samples, "samples", 2000, "leader reads and duplicate claims timed at each step")
	fset.IntVar(&c.Partitions, "partitions", 1, "ledger partitions (a power of two)")
	fset.IntVar(&c.Layout, "layout", intent.DefaultLayout, "the ledger's key layout: 2 stores each derived key with 22 base64url characters of its digest, 1 as it is (64 hex digits); docs/protocol.md 6.2")
	fset.IntVar(&c.ResultBytes, "result-bytes", 48, "bytes of each record's result (a JSON string)")
	fset.DurationVar(&c.TTL, "ttl", dedup.DefaultTTL, "the records' retention (long enough that none expires during the run)")
	fset.StringVar(&c.StoreDir, "store-dir", os.TempDir(), "parent of the server's fresh store directory (removed afterwards)")
	fset.StringVar(&c.Sync, "sync", "", "the server's sync_interval: empty for its default (lazy, 2m), always, or a duration")
	fset.BoolVar(&c.Keep, "keep", false, "keep the store directory")
	if err := fset.Parse(args); err != nil {
		return err
	}
	if err := c.validate(); err != nil {
		return err
	}
	_, err := runLedgerSize(ctx, c, out)
	return err
}

func (c ledgerSizeConfig) validate() error {
	var errs []error
	if c.Keys < 1 || c.Step < 1 || c.Step > c.Keys {
		errs = append(errs, fmt.Errorf("-keys %d -step %d: give 1 <= step <= keys", c.Keys, c.Step))
	}
	if c.Concurrency < 1 || c.Samples < 1 {
		errs = append(errs, fmt.Errorf("-concurrency %d -samples %d: give positive numbers", c.Concurrency, c.Samples))
	}
	if !intent.ValidLedgerLayout(c.Layout) {
		errs = append(errs, fmt.Errorf("-layout %d: give %d (compact keys) or %d (keys as they are)", c.Layout, intent.LayoutCompact, intent.LayoutFull))
	}
	if c.ResultBytes < 0 {
		errs = append(errs, fmt.Errorf("-result-bytes %d: give 0 or more", c.ResultBytes))
	}
	if c.TTL < time.Second {
		errs = append(errs, fmt.Errorf("-ttl %s: give at least 1s", c.TTL))
	}
	if c.Partitions < 1 || c.Partitions&(c.Partitions-1) != 0 {
		errs = append(errs, fmt.Errorf("-partitions %d: give a power of two (1, 2, 4, ...)", c.Partitions))
	}
	if _, err := os.Stat(c.Server); err != nil {
		errs = append(errs, fmt.Errorf("-nats-server %s: %w (build it: go build -o bin/nats-server github.com/nats-io/nats-server/v2)", c.Server, err))
	}
	return errors.Join(errs...)
}

// natsProc is a nats-server child process with a profiling port.
type natsProc struct {
	cmd      *exec.Cmd
	url      string
	profURL  string
	dir      string
	storeDir string
}

func startNatsProc(ctx context.Context, c ledgerSizeConfig) (*natsProc, error) {
	dir, err := os.MkdirTemp(c.StoreDir, "idemgate-ledger-size-")
	if err != nil {
		return nil, err
	}
	ports, err := freePorts(2)
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	p := &natsProc{
		url:      fmt.Sprintf("nats://127.0.0.1:%d", ports[0]),
		profURL:  fmt.Sprintf("http://127.0.0.1:%d", ports[1]),
		dir:      dir,
		storeDir: filepath.Join(dir, "store"),
	}
	conf := fmt.Sprintf("listen: \"127.0.0.1:%d\"\nprof_port: %d\nserver_name: ledger-size\njetstream { store_dir: %q }\n", ports[0], ports[1], p.storeDir)
	if c.Sync != "" {
		conf = strings.Replace(conf, "jetstream {", fmt.Sprintf("jetstream { sync_interval: %s,", c.Sync), 1)
	}
	confFile := filepath.Join(dir, "nats.conf")
	if err := os.WriteFile(confFile, []byte(conf), 0o600); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	log, err := os.Create(filepath.Join(dir, "nats.log"))
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	defer func() { _ = log.Close() }()
	p.cmd = exec.Command(c.Server, "-c", confFile)
	p.cmd.Stdout, p.cmd.Stderr = log, log
	if err := p.cmd.Start(); err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("start %s: %w", c.Server, err)
	}
	deadline := time.Now().Add(readyTimeout)
	for {
		conn, err := net.DialTimeout("tcp", strings.TrimPrefix(p.url, "nats://"), time.Second)
		if err == nil {
			_ = conn.Close()
			return p, nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			p.stop(false)
			return nil, fmt.Errorf("nats-server did not listen on %s within %s (log: %s)", p.url, readyTimeout, filepath.Join(dir, "nats.log"))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (p *natsProc) stop(keep bool) {
	_ = p.cmd.Process.Signal(os.Interrupt)
	done := make(chan struct{})
	go func() { _ = p.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		_ = p.cmd.Process.Kill()
		<-done
	}
	if !keep {
		_ = os.RemoveAll(p.dir)
	}
}

// rss is the server process's resident set, from /proc.
func (p *natsProc) rss() (uint64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	if err != nil {
		return 0, err
	}
	defer func() { _ = f.Close() }()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			if fs := strings.Fields(rest); len(fs) > 0 {
				kb, err := strconv.ParseUint(fs[0], 10, 64)
				return kb << 10, err
			}
		}
	}
	return 0, fmt.Errorf("no VmRSS in /proc/%d/status", p.cmd.Process.Pid)
}

// heap is the server's Go heap in use after a garbage collection, as its
// profiling port reports it (the runtime.MemStats lines of a debug=1 heap
// profile).
func (p *natsProc) heap(ctx context.Context) (uint64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.profURL+"/debug/pprof/heap?debug=1&gc=1", nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, fmt.Errorf("server heap: %w", err)
	}
	defer func() { _ = resp.Body.Close() }()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "# HeapInuse = "); ok {
			return strconv.ParseUint(strings.TrimSpace(rest), 10, 64)
		}
	}
	return 0, fmt.Errorf("server heap: no HeapInuse in the heap profile (%v)", sc.Err())
}

// disk is the bytes of the files under the store's ledger streams.
func (p *natsProc) disk() (uint64, error) {
	var n uint64
	err := filepath.WalkDir(p.storeDir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() && strings.Contains(path, string(filepath.Separator)+"KV_") {
			info, err := d.Info()
			if err != nil {
				return err
			}
			n += uint64(info.Size())
		}
		return nil
	})
	return n, err
}

// lsKey is the i-th key and fingerprint of the fill: a derived key's shape,
// <tool> "." 64 hex digits, which the ledger stores in its layout.
func lsKey(i int) (key, fingerprint string) {
	k := sha256.Sum256([]byte("ledger-size key " + strconv.Itoa(i)))
	f := sha256.Sum256([]byte("ledger-size fingerprint " + strconv.Itoa(i)))
	return "send_email." + hex.EncodeToString(k[:]), hex.EncodeToString(f[:])
}

// lsClaim is the i-th key's claim, with the fields the worker sets.
func lsClaim(i int) dedup.ClaimRequest {
	key, fp := lsKey(i)
	return dedup.ClaimRequest{
		Key: key, Tool: "send_email", Session: "agent-run-" + strconv.Itoa(i%1000),
		Fingerprint: fp, Holder: "worker-host-12345", Lease: 30 * time.Second,
		IntentSeq: uint64(i + 1), CallID: "call_" + strconv.Itoa(i),
	}
}

type ledgerSizeRow struct {
	keys                  int
	rate                  float64 // keys/s of the step (claim + completion)
	heap, rss, disk       uint64
	heapKey, rssKey       float64 // bytes per key above the empty ledger's
	diskKey               float64
	getP50, getP99        time.Duration
	dupP50, dupP99        time.Duration
	getErrors, dupUnknown int
}

func runLedgerSize(ctx context.Context, c ledgerSizeConfig, out io.Writer) (rows []ledgerSizeRow, err error) {
	proc, _, ledger, stop, err := startLedgerProc(ctx, c, "bench-ledger-size", out)
	if err != nil {
		return nil, err
	}
	defer stop()
	result, _ := json.Marshal(strings.Repeat("r", max(c.ResultBytes-2, 0)))
	baseHeap, err := proc.heap(ctx)
	if err != nil {
		return nil, err
	}
	baseRSS, err := proc.rss()
	if err != nil {
		return nil, err
	}
	baseDisk, _ := proc.disk()
	if err := fillOne(ctx, ledger, -1, result); err != nil {
		return nil, err
	}
	done, _, err := ledger.Get(ctx, lsClaim(-1).Key)
	if err != nil {
		return nil, err
	}
	sample, _ := json.Marshal(done) // as the ledger stores it (its encoder writes what encoding/json does)
	stored, err := intent.LedgerKey(lsClaim(0).Key, ledger.Layout())
	if err != nil {
		return nil, err
	}
	_, _ = fmt.Fprintf(out, "ledger-size: nats-server %s (own process, pid %d), %d partition(s), sync %s, %d writers, records as the worker writes them (claim, then completion with TTL %s): %d-byte completed record, %d-byte key stored as a %d-byte KV key (layout %d)\n",
		c.Server, proc.cmd.Process.Pid, c.Partitions, cmpOr(c.Sync, "lazy (server default)"), c.Concurrency, c.TTL, len(sample), len(lsClaim(0).Key), len(stored), ledger.Layout())
	_, _ = fmt.Fprintf(out, "empty ledger: server heap %s, RSS %s. Heap: HeapInuse after a GC, from the server's profiling port; RSS: /proc/<pid>/status; per-key figures are above the empty ledger's. Times are wall-clock on a shared machine: noisy.\n",
		lsMiB(baseHeap), lsMiB(baseRSS))
	_, _ = fmt.Fprintf(out, "%10s %10s %10s %8s %10s %8s %10s %8s %9s %9s %9s %9s %5s\n",
		"keys", "create/s", "heap", "heap/key", "rss", "rss/key", "disk", "disk/key", "get p50", "get p99", "dup p50", "dup p99", "errs")
	var filled int
	for filled < c.Keys {
		n := min(c.Step, c.Keys-filled)
		start := time.Now()
		if err := fillLedger(ctx, ledger, filled, n, c.Concurrency, result); err != nil {
			return nil, err
		}
		elapsed := time.Since(start)
		filled += n
		row := ledgerSizeRow{keys: filled, rate: float64(n) / elapsed.Seconds()}
		if row.heap, err = proc.heap(ctx); err != nil {
			return nil, err
		}
		if row.rss, err = proc.rss(); err != nil {
			return nil, err
		}
		if row.disk, err = proc.disk(); err != nil {
			return nil, err
		}
		row.heapKey = perKey(row.heap, baseHeap, filled)
		row.rssKey = perKey(row.rss, baseRSS, filled)
		row.diskKey = perKey(row.disk, baseDisk, filled)
		if err := timeReads(ctx, ledger, filled, c.Samples, &row); err != nil {
			return nil, err
		}
		_, _ = fmt.Fprintf(out, "%10d %10.0f %10s %8.0f %10s %8.0f %10s %8.0f %9s %9s %9s %9s %5d\n",
			row.keys, row.rate, lsMiB(row.heap), row.heapKey, lsMiB(row.rss), row.rssKey, lsMiB(row.disk), row.diskKey,
			ms(row.getP50), ms(row.getP99), ms(row.dupP50), ms(row.dupP99), row.getErrors+row.dupUnknown)
		rows = append(rows, row)
		if (row.getErrors+row.dupUnknown)*100 > c.Samples {
			return rows, fmt.Errorf("at %d keys: %d reads failed, %d duplicate claims were not answered Done", filled, row.getErrors, row.dupUnknown)
		}
	}
	_, _ = fmt.Fprintf(out, "writes retried after an error (a timeout on a loaded machine): %d; keys left pending by a lost claim acknowledgement: %d\n",
		fillRetries.Load(), fillStuck.Load())
	return rows, nil
}

// startLedgerProc starts a nats-server process for c and opens the
// scenario's ledger on it over a connection named name; stop closes the
// ledger and the connection and stops the server (keeping its store with
// c.Keep).
func startLedgerProc(ctx context.Context, c ledgerSizeConfig, name string, out io.Writer) (proc *natsProc, js jetstream.JetStream, ledger *dedup.Ledger, stop func(), err error) {
	proc, err = startNatsProc(ctx, c)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	if c.Keep {
		_, _ = fmt.Fprintf(out, "store kept in %s\n", proc.dir)
	}
	nc, err := nats.Connect(proc.url, nats.Name(name))
	if err == nil {
		js, err = jetstream.New(nc)
		if err == nil {
			ledger, err = openBenchLedger(ctx, js, c)
		}
		if err != nil {
			nc.Close()
		}
	}
	if err != nil {
		proc.stop(c.Keep)
		return nil, nil, nil, nil, err
	}
	return proc, js, ledger, func() {
		ledger.Close()
		nc.Close()
		proc.stop(c.Keep)
	}, nil
}

// openBenchLedger opens the scenario's ledger: one bucket, or c.Partitions.
func openBenchLedger(ctx context.Context, js jetstream.JetStream, c ledgerSizeConfig) (*dedup.Ledger, error) {
	cfg := dedup.BucketConfig{TTL: c.TTL, Partitions: c.Partitions, Layout: c.Layout}
	return dedup.Open(ctx, js, cfg, dedup.WithConfirmedTakeover())
}

func cmpOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

func perKey(v, base uint64, keys int) float64 {
	if v < base {
		return 0
	}
	return float64(v-base) / float64(keys)
}

func lsMiB(b uint64) string { return fmt.Sprintf("%.0fMiB", float64(b)/(1<<20)) }

// fillLedger claims and completes keys from..from+n-1 with conc goroutines.
func fillLedger(ctx context.Context, l *dedup.Ledger, from, n, conc int, result json.RawMessage) error {
	var next atomic.Int64
	next.Store(int64(from))
	end := int64(from + n)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var first error
	for range conc {
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= end || ctx.Err() != nil {
					return
				}
				if err := fillOne(ctx, l, int(i), result); err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
					next.Store(end)
					return
				}
			}
		})
	}
	wg.Wait()
	if first != nil {
		return first
	}
	return ctx.Err()
}

// fillTries bounds the attempts of one write of the fill: on a loaded
// machine a write may time out, and its retry settles whether it landed.
const fillTries = 5

// fillOne claims and completes key i. A claim that timed out but landed is
// found Busy (by this filler) on its retry: the key then stays pending and
// is counted in stuck.
func fillOne(ctx context.Context, l *dedup.Ledger, i int, result json.RawMessage) error {
	var res dedup.ClaimResult
	var err error
	for try := 0; try < fillTries; try++ {
		if res, err = l.Claim(ctx, lsClaim(i)); err == nil || ctx.Err() != nil {
			break
		}
		fillRetries.Add(1)
	}
	if err != nil {
		return err
	}
	if res.Lease == nil {
		if res.Outcome == dedup.Busy && res.Record.Holder == lsClaim(i).Holder {
			fillStuck.Add(1)
			return nil
		}
		return fmt.Errorf("claim %s: %s, want acquired (is the store fresh?)", lsClaim(i).Key, res.Outcome)
	}
	for try := 0; try < fillTries; try++ {
		if _, err = res.Lease.Complete(ctx, result, 1); err == nil || ctx.Err() != nil {
			break
		}
		fillRetries.Add(1)
	}
	return err
}

// fillRetries counts the fill's writes tried again; fillStuck the keys left
// pending by a claim whose outcome was lost.
var fillRetries, fillStuck atomic.Int64

// timeReads times samples leader reads and duplicate claims of random keys
// among the first n, one at a time.
func timeReads(ctx context.Context, l *dedup.Ledger, n, samples int, row *ledgerSizeRow) error {
	gets := make([]time.Duration, 0, samples)
	dups := make([]time.Duration, 0, samples)
	for range samples {
		i := rand.IntN(n)
		req := lsClaim(i)
		t0 := time.Now()
		_, _, err := l.Get(ctx, req.Key)
		gets = append(gets, time.Since(t0))
		if err != nil {
			row.getErrors++
		}
		t0 = time.Now()
		res, err := l.Claim(ctx, req)
		dups = append(dups, time.Since(t0))
		if err != nil || res.Outcome != dedup.Done {
			row.dupUnknown++
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
	slices.Sort(gets)
	slices.Sort(dups)
	row.getP50, row.getP99 = lsPercentile(gets, .50), lsPercentile(gets, .99)
	row.dupP50, row.dupP99 = lsPercentile(dups, .50), lsPercentile(dups, .99)
	return nil
}

// lsPercentile is the p-th quantile of sorted d.
func lsPercentile(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	return d[min(len(d)-1, int(p*float64(len(d))))]
}
