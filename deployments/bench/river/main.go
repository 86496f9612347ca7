// Command river is the River yardstick of idemgate's unique row
// (docs/performance.md): N jobs unique by their key, as idemgate's intents
// are, inserted in batches by parallel inserters and worked by a River client
// with a noop worker, on the Postgres at DATABASE_URL. The rate is N over the
// time from the first insert to the last completion, as River reports it to
// subscribers once the completion is stored. It prints one line:
//
//	river unique-jobs n=20000 batch=1000 workers=256: 11058 jobs/s (cpu: river process 85 µs/job)
//
// It runs River's migrations and empties river_job first, so run it on a
// fresh throwaway database: deployments/bench/river.sh does.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "river:", err)
		os.Exit(1)
	}
}

// options are the flags.
type options struct {
	n, batch, inserters, workers, payload, pgPID int
	cooldown, poll, timeout                      time.Duration
	verbose                                      bool
}

func run() error {
	var o options
	flag.IntVar(&o.n, "n", 20000, "jobs")
	flag.IntVar(&o.batch, "batch", 1000, "jobs per InsertMany")
	flag.IntVar(&o.inserters, "inserters", 1, "InsertMany calls in parallel")
	flag.IntVar(&o.workers, "workers", 256, "the queue's MaxWorkers (the idemgate worker's concurrency is 256)")
	flag.IntVar(&o.payload, "payload", 256, "bytes of each job's args besides its key (idemgate's bench: 256 bytes of args)")
	flag.DurationVar(&o.cooldown, "fetch-cooldown", 2*time.Millisecond, "the client's FetchCooldown (River's default: 100ms)")
	flag.DurationVar(&o.poll, "fetch-poll", 20*time.Millisecond, "the client's FetchPollInterval (River's default: 1s)")
	flag.DurationVar(&o.timeout, "timeout", 5*time.Minute, "bound of the run")
	flag.IntVar(&o.pgPID, "pg-pid", 0, "the postmaster's process id, on this machine: the line adds Postgres's CPU per job (its processes')")
	flag.BoolVar(&o.verbose, "v", false, "also print to stderr when the last batch was inserted and the first job completed")
	flag.Parse()
	if o.n < 1 || o.batch < 1 || o.inserters < 1 || o.workers < 1 || o.payload < 0 {
		return errors.New("-n, -batch, -inserters and -workers must be at least 1, -payload not negative")
	}
	url := os.Getenv("DATABASE_URL")
	if url == "" {
		return errors.New("set DATABASE_URL")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()

	pcfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return err
	}
	// The inserters' connections, and the client's: its listener, producer
	// fetches, completer batches and maintenance.
	pcfg.MaxConns = int32(o.inserters + 8)
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	driver := riverpgxv5.New(pool)
	migrator, err := rivermigrate.New(driver, nil)
	if err != nil {
		return err
	}
	if _, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	// Not analyzed empty: statistics of an empty table would plan the
	// fetches as scans of the whole table (give each run a fresh database).
	if _, err := pool.Exec(ctx, "TRUNCATE river_job"); err != nil {
		return err
	}

	m, err := measure(ctx, driver, o)
	if err != nil {
		return err
	}
	perJob := func(d time.Duration) float64 { return float64(d.Microseconds()) / float64(o.n) }
	pg := ""
	if o.pgPID > 0 {
		pg = fmt.Sprintf(", postgres %.0f µs/job", perJob(m.pgCPU))
	}
	fmt.Printf("river unique-jobs n=%d batch=%d workers=%d: %.0f jobs/s (cpu: river process %.0f µs/job%s)\n",
		o.n, o.batch, o.workers, float64(o.n)/m.elapsed.Seconds(), perJob(m.cpu), pg)
	return nil
}

// measurement is a run's span, from the first insert to the last completion,
// and the CPU time this process and Postgres's took over it.
type measurement struct {
	elapsed, cpu, pgCPU time.Duration
}

// measure inserts and works the jobs.
func measure(ctx context.Context, driver *riverpgxv5.Driver, o options) (m measurement, err error) {
	workers := river.NewWorkers()
	var worked atomic.Int64
	river.AddWorker(workers, river.WorkFunc(func(context.Context, *river.Job[uniqueArgs]) error {
		worked.Add(1)
		return nil
	}))
	client, err := river.NewClient(driver, &river.Config{
		FetchCooldown:     o.cooldown,
		FetchPollInterval: o.poll,
		Logger:            slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
		Queues:            map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: o.workers}},
		Workers:           workers,
	})
	if err != nil {
		return m, err
	}
	events, unsubscribe := client.SubscribeConfig(&river.SubscribeConfig{
		ChanSize: o.n + 1, // never full: a dropped event would hang the count
		Kinds:    []river.EventKind{river.EventKindJobCompleted, river.EventKindJobFailed, river.EventKindJobCancelled},
	})
	defer unsubscribe()
	if err := client.Start(ctx); err != nil {
		return m, err
	}
	defer func() {
		stopCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if serr := client.Stop(stopCtx); serr != nil && err == nil {
			err = serr
		}
	}()

	// One job first, unmeasured, so that the clock starts on a client that is
	// fetching.
	if _, err := client.Insert(ctx, uniqueArgs{Key: "warmup"}, nil); err != nil {
		return m, err
	}
	select {
	case ev := <-events:
		if ev == nil || ev.Kind != river.EventKindJobCompleted {
			return m, errors.New("the warm-up job did not complete")
		}
	case <-ctx.Done():
		return m, fmt.Errorf("the warm-up job: %w", ctx.Err())
	}
	worked.Store(0)

	pad := strings.Repeat("x", o.payload)
	batches := make([][]river.InsertManyParams, 0, (o.n+o.batch-1)/o.batch)
	for i := 0; i < o.n; i += o.batch {
		b := make([]river.InsertManyParams, 0, min(o.batch, o.n-i))
		for j := i; j < i+cap(b); j++ {
			b = append(b, river.InsertManyParams{Args: uniqueArgs{Key: "k" + strconv.Itoa(j), Args: pad}})
		}
		batches = append(batches, b)
	}

	cpu0, pg0 := cpuTime(), pgCPU(o.pgPID)
	start := time.Now()
	insertErr := make(chan error, 1)
	go func() { insertErr <- insert(ctx, client, batches, o.inserters) }()

	var last time.Time
	for done := 0; done < o.n; {
		select {
		case ev := <-events:
			if ev == nil {
				return m, errors.New("the subscription closed")
			}
			if ev.Kind != river.EventKindJobCompleted {
				return m, fmt.Errorf("job %d: %s: %v", ev.Job.ID, ev.Kind, ev.Job.Errors)
			}
			done++
			last = time.Now()
			if done == 1 && o.verbose {
				fmt.Fprintf(os.Stderr, "river: first job completed after %s\n", last.Sub(start).Round(time.Millisecond))
			}
		case err := <-insertErr:
			if err != nil {
				return m, err
			}
			insertErr = nil
			if o.verbose {
				fmt.Fprintf(os.Stderr, "river: %d jobs inserted after %s, %d completed\n", o.n, time.Since(start).Round(time.Millisecond), done)
			}
		case <-ctx.Done():
			return m, fmt.Errorf("%d of %d jobs completed: %w", worked.Load(), o.n, ctx.Err())
		}
	}
	m.cpu, m.pgCPU = cpuTime()-cpu0, pgCPU(o.pgPID)-pg0
	if insertErr != nil {
		if err := <-insertErr; err != nil {
			return m, err
		}
	}
	if w := worked.Load(); w != int64(o.n) {
		return m, fmt.Errorf("%d jobs worked, want %d", w, o.n)
	}
	m.elapsed = last.Sub(start)
	return m, nil
}

// insert runs InsertMany on the batches from parallel inserters; a job
// skipped as a duplicate fails it, as none is.
func insert(ctx context.Context, client *river.Client[pgx.Tx], batches [][]river.InsertManyParams, inserters int) error {
	var (
		next atomic.Int64
		wg   sync.WaitGroup
		errs = make([]error, inserters)
	)
	for i := range inserters {
		wg.Go(func() {
			for {
				b := int(next.Add(1)) - 1
				if b >= len(batches) {
					return
				}
				res, err := client.InsertMany(ctx, batches[b])
				if err != nil {
					errs[i] = err
					return
				}
				for _, r := range res {
					if r.UniqueSkippedAsDuplicate {
						errs[i] = fmt.Errorf("job %d skipped as a duplicate", r.Job.ID)
						return
					}
				}
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// uniqueArgs is a job unique by its key, as an idemgate intent is.
type uniqueArgs struct {
	Key  string `json:"key" river:"unique"`
	Args string `json:"args"`
}

func (uniqueArgs) Kind() string { return "bench_noop" }

func (uniqueArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{UniqueOpts: river.UniqueOpts{ByArgs: true}}
}

// cpuTime is this process's user and system CPU time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// pgCPU is the CPU time of the postmaster pid and of its processes, live or
// ended: its own, its live children's, and what it has reaped of its ended
// ones (Linux /proc; 0 without a pid). A difference of two readings is
// Postgres's CPU in between.
func pgCPU(pid int) time.Duration {
	if pid <= 0 {
		return 0
	}
	// Fields after the command's closing parenthesis, from the state (3rd):
	// utime is the 14th field, stime 15th, cutime 16th, cstime 17th.
	stat := func(pid string) (ppid string, self, children int64, ok bool) {
		b, err := os.ReadFile("/proc/" + pid + "/stat")
		i := strings.LastIndexByte(string(b), ')')
		if err != nil || i < 0 {
			return "", 0, 0, false
		}
		f := strings.Fields(string(b[i+1:]))
		if len(f) < 15 {
			return "", 0, 0, false
		}
		n := func(s string) int64 { v, _ := strconv.ParseInt(s, 10, 64); return v }
		return f[1], n(f[11]) + n(f[12]), n(f[13]) + n(f[14]), true
	}
	root := strconv.Itoa(pid)
	_, self, reaped, ok := stat(root)
	if !ok {
		return 0
	}
	ticks := self + reaped
	procs, _ := os.ReadDir("/proc")
	for _, p := range procs {
		if ppid, self, _, ok := stat(p.Name()); ok && ppid == root {
			ticks += self
		}
	}
	return time.Duration(ticks) * time.Second / clockTicks
}

// clockTicks is Linux's USER_HZ, the unit of /proc's CPU times.
const clockTicks = 100
