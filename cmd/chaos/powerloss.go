package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sys/unix"
)

// PowerLoss is what the power loss of one JetStream node did and what the
// server kept. The judge fills in what it took from the load.
type PowerLoss struct {
	Node     string    `json:"node"`
	At       time.Time `json:"at"`
	FilesCut int       `json:"files_cut"`
	BytesCut int64     `json:"bytes_cut"`
	// Before and After are each stream's last sequence read from the
	// server just before the power loss and after it (single node: from the
	// restarted store before anyone could publish to it; cluster: once the
	// node is back).
	Before     map[string]uint64 `json:"last_seq_before"`
	After      map[string]uint64 `json:"last_seq_after"`
	WorkStream string            `json:"work_stream"`
	// WorkersKilled are the holders that died with a single node: the
	// machine's power.
	WorkersKilled []string `json:"workers_killed,omitempty"`
	// epoch is the JetStream start whose acknowledgements the power loss
	// may have taken.
	epoch int64

	// IntentsTaken are the copies the killed start acknowledged as stored
	// above the work stream's last sequence after the power loss; of them,
	// Republished were published again by their callers under the retry
	// rule (docs/protocol.md 7.2) and Answered got their answer.
	IntentsTaken int `json:"acknowledged_intents_taken"`
	Republished  int `json:"taken_republished"`
	Answered     int `json:"taken_answered"`
	// LedgerWritesTaken is, per ledger (KV) stream whose last sequence went
	// back, how many acknowledged writes the power loss took: the ledger
	// syncs before it acknowledges, so none.
	LedgerWritesTaken map[string]uint64 `json:"ledger_writes_taken"`
}

// errNoCachestat: the kernel cannot tell which pages of a file are on disk.
var errNoCachestat = errors.New("the power loss needs cachestat(2) (Linux 6.5 or later) to tell which pages of a store file are on disk")

// powerLoss waits until cfg.powerLossAt of the intents are published, then
// cuts the power of JetStream (with --cluster, of the node leading the
// intent stream): it reads every stream's last sequence, SIGKILLs the node
// (a single node with every worker: they share its machine, and no worker
// starts again until it is back),
// cuts each of its store files back to what the disk holds (cutToDisk), and
// starts it again on that store. On a single node it first starts the store
// on ports no one else knows, to read what the streams kept before anyone
// can publish again. Like the other node faults, it runs under run.
func (r *chaosRun) powerLoss(ctx, run context.Context) error {
	if !r.waitPublished(ctx, r.cfg.powerLossAt) {
		return nil
	}
	victim := r.nodes[0]
	if len(r.nodes) > 1 {
		victim = r.victims(ctx, 1)[0]
	}
	r.nodeMu.Lock()
	defer r.nodeMu.Unlock()
	pl := &PowerLoss{Node: victim.name, WorkStream: r.loader.cl.Names().Stream}
	var err error
	if pl.Before, err = lastSeqs(run, r.js); err != nil {
		return fmt.Errorf("read the streams before the power loss: %w", err)
	}
	r.loader.nodesDown.Store(true)
	pl.At = time.Now()
	pl.epoch = r.loader.epoch.Load()
	if len(r.nodes) == 1 {
		// The machine's power: the workers die with the server, as a
		// worker with its embedded server does.
		r.machineDown.Lock()
		defer r.machineDown.Unlock()
		for _, s := range r.sups {
			at := time.Now()
			if holder, ok := s.kill(); ok {
				r.record(event{Kind: faultWorkerKill, Target: holder, At: at, Until: time.Now()})
				pl.WorkersKilled = append(pl.WorkersKilled, holder)
			}
		}
	}
	victim.kill()
	var errs []error
	pl.FilesCut, pl.BytesCut, err = cutToDisk(victim.store, func(path string, from, to int64) {
		rel, _ := filepath.Rel(r.dir, path)
		r.logf("power loss: %s cut from %d to %d bytes", rel, from, to)
	})
	if err != nil {
		errs = append(errs, err)
	}
	if len(r.nodes) == 1 && err == nil {
		if pl.After, err = r.inspect(run, victim); err != nil {
			errs = append(errs, err)
		}
	}
	r.loader.epoch.Add(1)
	if err := victim.start(); err != nil {
		errs = append(errs, err)
	} else if err := victim.ready(run, 2*time.Minute); err != nil {
		errs = append(errs, err)
	}
	if len(r.nodes) > 1 && len(errs) == 0 {
		if pl.After, err = lastSeqs(run, r.js); err != nil {
			errs = append(errs, err)
		}
	}
	r.loader.recovered.Store(time.Now().UnixNano())
	r.loader.nodesDown.Store(false)
	r.record(event{Kind: faultPowerLoss, Target: victim.name, At: pl.At, Until: time.Now()})
	if err := errors.Join(errs...); err != nil {
		return err
	}
	r.evMu.Lock()
	r.powerLossDone = pl
	r.evMu.Unlock()
	r.logf("power loss of %s: %d files cut by %d bytes; last sequences before %v, after %v", victim.name, pl.FilesCut, pl.BytesCut, pl.Before, pl.After)
	return nil
}

// inspect starts node's store on ports of its own, reads every stream's
// last sequence, and stops it: what the power loss kept, before any client
// or worker can reach the store.
func (r *chaosRun) inspect(run context.Context, node *natsNode) (map[string]uint64, error) {
	ports, err := freePorts(2)
	if err != nil {
		return nil, err
	}
	b, err := os.ReadFile(node.conf)
	if err != nil {
		return nil, err
	}
	conf := regexp.MustCompile(`(?m)^listen: .*$`).ReplaceAllString(string(b), fmt.Sprintf("listen: \"127.0.0.1:%d\"", ports[0]))
	conf = regexp.MustCompile(`(?m)^http: .*$`).ReplaceAllString(conf, fmt.Sprintf("http: \"127.0.0.1:%d\"", ports[1]))
	path := node.conf + ".inspect"
	if err := os.WriteFile(path, []byte(conf), 0o644); err != nil {
		return nil, err
	}
	n := &natsNode{proc: &proc{name: node.name + "-inspect", path: node.path, args: []string{"-c", path}, log: filepath.Join(r.dir, node.name+"-inspect.log")},
		clientPort: ports[0], httpPort: ports[1]}
	if err := n.start(); err != nil {
		return nil, err
	}
	defer n.stop(30 * time.Second)
	if err := n.ready(run, 2*time.Minute); err != nil {
		return nil, err
	}
	nc, err := nats.Connect(n.url(), nats.Name("idemgate-chaos-inspect"))
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	return lastSeqs(run, js)
}

// lastSeqs reads every stream's last sequence.
func lastSeqs(ctx context.Context, js jetstream.JetStream) (map[string]uint64, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	out := map[string]uint64{}
	l := js.ListStreams(ctx)
	for info := range l.Info() {
		out[info.Config.Name] = info.State.LastSeq
	}
	if err := l.Err(); err != nil {
		return nil, err
	}
	return out, nil
}

// cutToDisk cuts every regular file under dir back to what the disk holds
// after a power loss: everything from its first page that the page cache
// holds dirty or under writeback (cachestat(2)). What the server synced is
// on disk, and so is what the kernel wrote back on its own; a dirty page is
// neither, so a power loss takes it, and with an append-only file whatever
// follows it. Directory entries are taken as kept. cut, when not nil, is
// told of each file cut.
func cutToDisk(dir string, cut func(path string, from, to int64)) (files int, bytes int64, err error) {
	page := int64(os.Getpagesize())
	err = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		f, err := os.OpenFile(path, os.O_RDWR, 0)
		if err != nil {
			return err
		}
		defer f.Close()
		fi, err := f.Stat()
		if err != nil {
			return err
		}
		to, err := firstUnwritten(int(f.Fd()), fi.Size(), page)
		if err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		if to >= fi.Size() {
			return nil
		}
		if err := f.Truncate(to); err != nil {
			return err
		}
		files++
		bytes += fi.Size() - to
		if cut != nil {
			cut(path, fi.Size(), to)
		}
		return nil
	})
	return files, bytes, err
}

// firstUnwritten is the offset of the first page of the file fd (size
// bytes) that is dirty or under writeback, or size when there is none.
func firstUnwritten(fd int, size, page int64) (int64, error) {
	pages := (size + page - 1) / page
	unwritten := func(n int64) (bool, error) { // among the first n pages
		var st unix.Cachestat_t
		err := unix.Cachestat(uint(fd), &unix.CachestatRange{Off: 0, Len: uint64(n * page)}, &st, 0)
		if errors.Is(err, unix.ENOSYS) {
			return false, errNoCachestat
		}
		return st.Dirty+st.Writeback > 0, err
	}
	if pages == 0 {
		return size, nil
	}
	if u, err := unwritten(pages); err != nil || !u {
		return size, err
	}
	lo, hi := int64(0), pages-1 // the first such page is in [lo, hi]
	for lo < hi {
		mid := (lo + hi) / 2
		u, err := unwritten(mid + 1)
		if err != nil {
			return size, err
		}
		if u {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	return lo * page, nil
}

// checkDiskBacked returns an error when dir is not on a filesystem whose
// page cache writes back to a disk: on tmpfs (memory) a power loss takes
// everything, and the server's syncs keep nothing.
func checkDiskBacked(dir string) error {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return err
	}
	if st.Type == unix.TMPFS_MAGIC || st.Type == unix.RAMFS_MAGIC {
		return fmt.Errorf("the power loss needs the stores on a disk: %s is in memory (tmpfs); pass --work-dir on a disk, or --power-loss-at -1", dir)
	}
	return nil
}

// syncStores puts what the nodes' stores hold at the start of the load on
// disk, as it is on a server that has run for a while: the streams and
// consumers the workers created, written once and not synced by a server
// that persists a stream asynchronously. A power loss during the load then
// takes only what the load wrote.
func (r *chaosRun) syncStores() error {
	for _, n := range r.nodes {
		err := filepath.WalkDir(n.store, func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if !d.IsDir() && !d.Type().IsRegular() {
				return nil
			}
			f, err := os.Open(path)
			if err != nil {
				if os.IsNotExist(err) {
					return nil // removed meanwhile
				}
				return err
			}
			defer f.Close()
			if err := f.Sync(); err != nil && !strings.Contains(err.Error(), "invalid argument") {
				return err
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("sync the store of %s: %w", n.name, err)
		}
	}
	return nil
}
