package dedup

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemgate/idemgate/pkg/intent"
)

// A partitioned ledger is N buckets (N a power of two, fixed when the ledger
// is created): partition 0 is the bucket named by BucketConfig.Bucket, so a
// one-partition ledger is exactly a plain bucket; partition i > 0 is
// PartitionBucket(bucket, i). A key lives in partition
// intent.Partition(key, N), and every operation on it — claim, compare-and-
// set, leader read, wait, batch — goes to that partition's Ledger, which is
// the single-bucket code unchanged. N is recorded in the stream metadata of
// partition 0 (PartitionsMetadata), where every worker and client reads it,
// next to the ledger's key layout (LayoutMetadata, intent.LedgerKey): how
// every partition stores its keys.

// Stream metadata entries of a ledger's buckets.
const (
	// PartitionsMetadata records a ledger's partition count on every
	// partition's stream; partition 0's is the one read at open. A bucket
	// without it is a one-partition ledger.
	PartitionsMetadata = "idemgate.partitions"
	// PartitionMetadata records which partition a bucket is.
	PartitionMetadata = "idemgate.partition"
	// LayoutMetadata records a ledger's key layout (intent.LedgerKey) on
	// every partition's stream; partition 0's is the one read at open. A
	// bucket without it is of layout intent.LayoutFull.
	LayoutMetadata = "idemgate.layout"
)

// ErrPartitions: a ledger was opened with another partition count than the
// one recorded when it was created.
var ErrPartitions = errors.New("dedup: partition count differs from the ledger's")

// ErrLayout: a ledger was opened with another key layout than the one
// recorded when it was created, or records a layout this version does not
// know.
var ErrLayout = errors.New("dedup: key layout differs from the ledger's or is unknown")

// cursorShift places a listing cursor's partition above its stream sequence.
const cursorShift = 56

// PartitionBucket returns the bucket name of partition i of the ledger
// named bucket: bucket itself for partition 0, bucket + "_P" + i otherwise.
func PartitionBucket(bucket string, i int) string {
	if i == 0 {
		return bucket
	}
	return bucket + "_P" + strconv.Itoa(i)
}

// RecordedPartitions returns the partition count recorded on the ledger
// named bucket: 0 when its partition 0 does not exist, 1 when it exists
// without a record (a ledger made before partitioning, or with one).
func RecordedPartitions(ctx context.Context, js jetstream.JetStream, bucket string) (int, error) {
	n, _, err := recorded(ctx, js, bucket)
	return n, err
}

// RecordedLayout returns the key layout recorded on the ledger named bucket
// (intent.LedgerKey): 0 when its partition 0 does not exist,
// intent.LayoutFull when it exists without a record (a ledger made before
// layouts). A layout this version does not know gives an error matching
// ErrLayout, which names it.
func RecordedLayout(ctx context.Context, js jetstream.JetStream, bucket string) (int, error) {
	_, layout, err := recorded(ctx, js, bucket)
	return layout, err
}

// recorded reads the partition count and key layout recorded on partition
// 0's stream of the ledger named bucket; both are 0 when it does not exist.
func recorded(ctx context.Context, js jetstream.JetStream, bucket string) (partitions, layout int, err error) {
	md, exists, err := metadataOf(ctx, js, bucket)
	if err != nil || !exists {
		return 0, 0, err
	}
	if m := md[MigratingMetadata]; m != "" {
		return 0, 0, fmt.Errorf("%w: ledger %s is being migrated to %s partitions/layout (stream metadata %s): let the migration finish, or run it again to finish an interrupted one (docs/operations.md)",
			ErrMigrating, bucket, m, MigratingMetadata)
	}
	s, err := shapeOf(bucket, md)
	return s.partitions, s.layout, err
}

// metadataOf returns the stream metadata of the ledger named bucket's
// partition 0; exists is false when it does not exist.
func metadataOf(ctx context.Context, js jetstream.JetStream, bucket string) (md map[string]string, exists bool, err error) {
	s, err := js.Stream(ctx, "KV_"+bucket)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("ledger %s: stream metadata: %w", bucket, err)
	}
	return s.CachedInfo().Config.Metadata, true, nil
}

// shape is a ledger's partition count and key layout.
type shape struct{ partitions, layout int }

// shapeOf reads the partition count and key layout partition 0's stream
// metadata md records (1 and intent.LayoutFull where it records none).
func shapeOf(bucket string, md map[string]string) (shape, error) {
	s := shape{partitions: 1, layout: intent.LayoutFull}
	if v, ok := md[PartitionsMetadata]; ok {
		n, err := strconv.Atoi(v)
		if err != nil || !intent.ValidPartitions(n) {
			return shape{}, fmt.Errorf("%w: ledger %s: stream metadata %s=%q is not a partition count (a power of two up to %d)",
				ErrInvalid, bucket, PartitionsMetadata, v, intent.MaxPartitions)
		}
		s.partitions = n
	}
	if v, ok := md[LayoutMetadata]; ok {
		n, err := strconv.Atoi(v)
		if err != nil || !intent.ValidLedgerLayout(n) {
			return shape{}, fmt.Errorf("%w: ledger %s records key layout %q (stream metadata %s), which this version does not know (it knows %d and %d): upgrade it",
				ErrLayout, bucket, v, LayoutMetadata, intent.LayoutFull, intent.LayoutCompact)
		}
		s.layout = n
	}
	return s, nil
}

// EnsurePartitions creates the buckets of the ledger cfg describes, or
// updates them (see EnsureBucket), and returns them in partition order with
// the ledger's key layout: what NewPartitioned takes, with WithLayout (Open
// does both). With cfg.Partitions 0 it keeps the count recorded on an
// existing ledger (1 for a new one); a count other than the recorded one
// gives an error matching ErrPartitions, which names both: partitions are
// fixed at creation (growing them is a migration, see docs/operations.md).
// Likewise with cfg.Layout 0 it keeps the recorded layout
// (intent.DefaultLayout for a new ledger), and another one gives an error
// matching ErrLayout.
func EnsurePartitions(ctx context.Context, js jetstream.JetStream, cfg BucketConfig) ([]jetstream.KeyValue, int, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, 0, fmt.Errorf("ensure ledger: %w", err)
	}
	recParts, recLayout, err := recorded(ctx, js, cfg.Bucket)
	if err != nil {
		return nil, 0, err
	}
	n, err := agreePartitions(cfg.Bucket, recParts, cfg.Partitions)
	if err != nil {
		return nil, 0, err
	}
	layout, err := agreeLayout(cfg.Bucket, recLayout, cfg.Layout)
	if err != nil {
		return nil, 0, err
	}
	kvs := make([]jetstream.KeyValue, n)
	for i := range n {
		c := cfg
		c.Bucket = PartitionBucket(cfg.Bucket, i)
		c.metadata = map[string]string{PartitionsMetadata: strconv.Itoa(n), PartitionMetadata: strconv.Itoa(i),
			LayoutMetadata: strconv.Itoa(layout)}
		if kvs[i], err = EnsureBucket(ctx, js, c); err != nil {
			return nil, 0, err
		}
	}
	// Two first starts with different counts (or layouts) race to create
	// partition 0: the loser sees the winner's here.
	if recParts == 0 {
		againParts, againLayout, err := recorded(ctx, js, cfg.Bucket)
		if err != nil {
			return nil, 0, err
		}
		if _, err := agreePartitions(cfg.Bucket, againParts, n); err != nil {
			return nil, 0, err
		}
		if _, err := agreeLayout(cfg.Bucket, againLayout, layout); err != nil {
			return nil, 0, err
		}
	}
	return kvs, layout, nil
}

// agreeLayout is the key layout of a ledger with recorded layout (0: no
// ledger yet) opened asking for want (0: whatever is recorded).
func agreeLayout(bucket string, recorded, want int) (int, error) {
	switch {
	case want == 0 && recorded == 0:
		return intent.DefaultLayout, nil
	case want == 0:
		return recorded, nil
	case recorded == 0, recorded == want:
		return want, nil
	}
	return 0, fmt.Errorf("%w: ledger %s has key layout %d (stream metadata %s; none recorded is %d), this one was started with %d: start it with %d (or 0, to use the recorded layout); converting a ledger is a migration (docs/operations.md)",
		ErrLayout, bucket, recorded, LayoutMetadata, intent.LayoutFull, want, recorded)
}

// agreePartitions is the partition count of a ledger with recorded
// partitions (0: none yet) opened asking for want (0: whatever is recorded).
func agreePartitions(bucket string, recorded, want int) (int, error) {
	switch {
	case want == 0 && recorded == 0:
		return 1, nil
	case want == 0:
		return recorded, nil
	case recorded == 0, recorded == want:
		return want, nil
	}
	return 0, fmt.Errorf("%w: ledger %s has %d partitions (stream metadata %s), this one was started with %d: start it with %d (or 0, to use the recorded count); growing the partitions is a migration (docs/operations.md)",
		ErrPartitions, bucket, recorded, PartitionsMetadata, want, recorded)
}

// BindPartitions returns the buckets of the existing ledger named bucket,
// in partition order, and its key layout, as its partition 0 records them
// (see RecordedLayout). It creates nothing: it is for clients and
// operators. A missing ledger gives an error matching
// jetstream.ErrBucketNotFound; a layout this version does not know, one
// matching ErrLayout.
func BindPartitions(ctx context.Context, js jetstream.JetStream, bucket string) ([]jetstream.KeyValue, int, error) {
	n, layout, err := recorded(ctx, js, bucket)
	if err != nil {
		return nil, 0, err
	}
	if n == 0 {
		return nil, 0, fmt.Errorf("ledger %s: %w", bucket, jetstream.ErrBucketNotFound)
	}
	kvs := make([]jetstream.KeyValue, n)
	for i := range n {
		name := PartitionBucket(bucket, i)
		if kvs[i], err = js.KeyValue(ctx, name); err != nil {
			return nil, 0, fmt.Errorf("ledger %s: partition %d of %d (%s): %w", bucket, i, n, name, err)
		}
	}
	return kvs, layout, nil
}

// NewPartitioned returns a Ledger over kvs, the buckets of a ledger's
// partitions in partition order (EnsurePartitions or BindPartitions returns
// them, with the layout to pass as WithLayout); their count must be a power
// of two. Each partition gets its own Ledger built by New with opts — its
// own group commit with WithBatching — and every operation goes to its
// key's partition. One bucket gives exactly New's Ledger.
func NewPartitioned(js jetstream.JetStream, kvs []jetstream.KeyValue, opts ...Option) (*Ledger, error) {
	if !intent.ValidPartitions(len(kvs)) {
		return nil, fmt.Errorf("%w: new ledger: %d partitions: give a power of two from 1 to %d", ErrInvalid, len(kvs), intent.MaxPartitions)
	}
	first, err := New(js, kvs[0], opts...)
	if err != nil || len(kvs) == 1 {
		return first, err
	}
	parts := make([]*Ledger, len(kvs))
	parts[0] = first
	for i := 1; i < len(kvs); i++ {
		if parts[i], err = New(js, kvs[i], opts...); err != nil {
			for _, p := range parts[:i] {
				p.Close()
			}
			return nil, fmt.Errorf("partition %d: %w", i, err)
		}
	}
	first.parts = parts
	return first, nil
}

// Bind returns a Ledger over the existing ledger named bucket, with all its
// partitions and its key layout (see BindPartitions): for clients and
// operators that write (Forget, decisions) but must not create or change the
// buckets.
func Bind(ctx context.Context, js jetstream.JetStream, bucket string, opts ...Option) (*Ledger, error) {
	kvs, layout, err := BindPartitions(ctx, js, bucket)
	if err != nil {
		return nil, err
	}
	return NewPartitioned(js, kvs, append(append([]Option{}, opts...), WithLayout(layout))...)
}

// OpenReader returns a Reader over the existing ledger named bucket, with
// all its partitions (see BindPartitions).
func OpenReader(ctx context.Context, js jetstream.JetStream, bucket string) (*Reader, error) {
	l, err := Bind(ctx, js, bucket)
	if err != nil {
		return nil, err
	}
	return &Reader{l: l}, nil
}

// at returns the Ledger of key's partition: l itself without partitions.
func (l *Ledger) at(key string) *Ledger {
	if len(l.parts) < 2 {
		return l
	}
	return l.parts[intent.Partition(key, len(l.parts))]
}

// partitions returns the per-partition Ledgers, in partition order.
func (l *Ledger) partitions() []*Ledger {
	if len(l.parts) < 2 {
		return []*Ledger{l}
	}
	return l.parts
}

// Partitions returns the ledger's partition count.
func (l *Ledger) Partitions() int { return len(l.partitions()) }

// Buckets returns the bucket names of the ledger's partitions, in partition
// order.
func (l *Ledger) Buckets() []string {
	ps := l.partitions()
	names := make([]string, len(ps))
	for i, p := range ps {
		names[i] = p.kv.Bucket()
	}
	return names
}

// Leaders returns the server name leading each partition's stream, in
// partition order ("" for a partition whose leader is not known, e.g. on a
// server without clustering).
func (l *Ledger) Leaders(ctx context.Context) ([]string, error) {
	infos, err := l.streamInfos(ctx)
	if err != nil {
		return nil, err
	}
	leaders := make([]string, len(infos))
	for i, si := range infos {
		if si.Cluster != nil {
			leaders[i] = si.Cluster.Leader
		}
	}
	return leaders, nil
}

func (l *Ledger) streamInfos(ctx context.Context) ([]*jetstream.StreamInfo, error) {
	ps := l.partitions()
	infos := make([]*jetstream.StreamInfo, len(ps))
	for i, p := range ps {
		s, err := l.js.Stream(ctx, "KV_"+p.kv.Bucket())
		if err != nil {
			return nil, fmt.Errorf("partition %d: %w", i, err)
		}
		infos[i] = s.CachedInfo()
	}
	return infos, nil
}

// SpreadLeaders asks the cluster to move partition leaders off the servers
// leading more than their share (N partitions over S servers: at most
// ceil(N/S) each), each to the least-loaded current replica of its
// partition, with a leader step-down naming that server as preferred. It
// returns how many step-downs it asked for; the elections finish after it
// returns (see Leaders). On a single server, or with one partition, it does
// nothing. Running it again (after a node came back and leaders gathered
// on the others) is harmless: the worker calls it at start and on every
// ledger scan.
func (l *Ledger) SpreadLeaders(ctx context.Context) (int, error) {
	ps := l.partitions()
	if len(ps) < 2 {
		return 0, nil
	}
	infos, err := l.streamInfos(ctx)
	if err != nil {
		return 0, fmt.Errorf("spread leaders: %w", err)
	}
	load := map[string]int{}
	for _, si := range infos {
		if si.Cluster == nil || si.Cluster.Leader == "" || len(si.Cluster.Replicas) == 0 {
			return 0, nil // not replicated, or no leader now: nothing to spread
		}
		load[si.Cluster.Leader]++
		for _, r := range si.Cluster.Replicas {
			load[r.Name] += 0
		}
	}
	share := (len(ps) + len(load) - 1) / len(load)
	moved := 0
	for i, si := range infos {
		leader := si.Cluster.Leader
		if load[leader] <= share {
			continue
		}
		var to string
		for _, r := range si.Cluster.Replicas {
			if r.Current && !r.Offline && load[r.Name] < share && (to == "" || load[r.Name] < load[to]) {
				to = r.Name
			}
		}
		if to == "" {
			continue
		}
		if err := l.stepDown(ctx, ps[i].kv.Bucket(), to); err != nil {
			return moved, fmt.Errorf("spread leaders: partition %d (%s) to %s: %w", i, ps[i].kv.Bucket(), to, err)
		}
		load[leader]--
		load[to]++
		moved++
	}
	return moved, nil
}

// stepDown asks the leader of bucket's stream to hand over to server.
func (l *Ledger) stepDown(ctx context.Context, bucket, server string) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, l.timeout)
		defer cancel()
	}
	prefix := strings.TrimSuffix(l.getSubj, "STREAM.MSG.GET.KV_"+l.kv.Bucket())
	req, err := json.Marshal(map[string]any{"placement": map[string]string{"preferred": server}})
	if err != nil {
		return err
	}
	msg, err := l.nc.RequestWithContext(ctx, prefix+"STREAM.LEADER.STEPDOWN.KV_"+bucket, req)
	if err != nil {
		return err
	}
	var resp struct {
		Error   *jetstream.APIError `json:"error,omitempty"`
		Success bool                `json:"success"`
	}
	if err := json.Unmarshal(msg.Data, &resp); err != nil {
		return fmt.Errorf("decode step-down response: %w", err)
	}
	if resp.Error != nil {
		return resp.Error
	}
	if !resp.Success {
		return fmt.Errorf("step-down not done: %s", msg.Data)
	}
	return nil
}

// listPartitions is List over a partitioned ledger: the partitions one after
// the other, each in stream order. A cursor is the partition in its top
// byte and the stream sequence within it below (so a one-partition cursor is
// the plain sequence).
func (l *Ledger) listPartitions(ctx context.Context, q Query) (Page, error) {
	if err := q.check(); err != nil {
		return Page{}, err
	}
	p, seq := int(q.After>>cursorShift), q.After&(1<<cursorShift-1)
	if p >= len(l.parts) {
		return Page{}, fmt.Errorf("%w: list: cursor %d names partition %d of a ledger of %d: pass a Page's Next",
			ErrInvalid, q.After, p, len(l.parts))
	}
	page := Page{Records: []Listed{}, Next: q.After}
	scanned := 0
	for ; p < len(l.parts); p, seq = p+1, 0 {
		sub := q
		sub.After = seq
		sub.Limit = q.Limit - len(page.Records)
		if q.MaxScan > 0 {
			sub.MaxScan = q.MaxScan - scanned
		}
		got, n, err := l.parts[p].listOne(ctx, sub)
		if err != nil {
			return Page{}, fmt.Errorf("partition %d: %w", p, err)
		}
		scanned += n
		page.Records = append(page.Records, got.Records...)
		page.Next = uint64(p)<<cursorShift | got.Next
		if got.More {
			page.More = true
			return page, nil
		}
		full := len(page.Records) >= q.Limit || (q.MaxScan > 0 && scanned >= q.MaxScan)
		if full && p+1 < len(l.parts) {
			page.Next, page.More = uint64(p+1)<<cursorShift, true
			return page, nil
		}
	}
	return page, nil
}

// sumStats adds the group-commit figures of every partition.
func sumStats(ps []*Ledger) BatchStats {
	var s BatchStats
	for _, p := range ps {
		if p.batch == nil {
			continue
		}
		s = s.Add(p.batch.statsNow())
	}
	return s
}

// validPartitionsConfig checks BucketConfig.Partitions.
func validPartitionsConfig(n int) error {
	if n != 0 && !intent.ValidPartitions(n) {
		return fmt.Errorf("%w: partitions %d: use a power of two from 1 to %d, or 0 for the count recorded on the ledger (1 for a new one)",
			ErrInvalid, n, intent.MaxPartitions)
	}
	return nil
}
