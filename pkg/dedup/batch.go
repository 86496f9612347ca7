package dedup

import (
	"fmt"
	"time"
)

// Batching defaults and limits.
const (
	// defaultBatchMax is BatchConfig.Max's default.
	defaultBatchMax = 500
	// MaxBatch is the most writes an atomic batch may carry (the server's
	// limit).
	MaxBatch = 1000
	// defaultBatchMin is BatchConfig.Min's default.
	defaultBatchMin = 16
	// DefaultBatchInFlight is BatchConfig.InFlight's default.
	DefaultBatchInFlight = 4
	// defaultBatchAckWait is BatchConfig.AckWait's default.
	defaultBatchAckWait = time.Second
	// MaxBatchInFlight bounds BatchConfig.InFlight; the server allows 50
	// batches in flight per stream, shared by every writer.
	MaxBatchInFlight = 8
)

// BatchConfig makes a Ledger group-commit its writes (see WithBatching). The
// zero value is valid and means every default.
type BatchConfig struct {
	// Max is the most writes one atomic batch carries; writes queued beyond
	// it wait for the next batch. Default: 500. At most 1000 (MaxBatch), the
	// server's limit.
	Max int
	// Min is the fewest queued writes sent as an atomic batch. A batch has a
	// fixed cost (the server stages it and syncs a few times), so fewer
	// writes go out one by one, concurrently, as without batching — which is
	// also what a lightly loaded ledger does. Default: 16 (at most Max); 1
	// sends even a lone write as a batch.
	Min int
	// InFlight is how many batches may await their acknowledgement at once;
	// when all may, the next batch carries whatever was queued meanwhile, so
	// batches grow with the load. A write waits in the queue only while every
	// slot is taken: more slots shorten the time between a caller's write and
	// its reaching the server (for a lease holder's completion, the window in
	// which its crash repeats the effect), fewer make bigger batches. The
	// server allows 50 batches in flight per stream, shared by every writer;
	// a refusal for that is retried after a pause. Default: 4
	// (DefaultBatchInFlight). At most 8 (MaxBatchInFlight).
	InFlight int
	// AckWait is the longest a batch waits for its acknowledgement (less when
	// every writer of the batch stopped waiting first; at most the ledger's
	// JetStream request timeout). A batch's writers wait for it, and so does
	// every write queued behind it, so one whose acknowledgement was lost (a
	// server restarted after the commit went out) must not hold the ledger
	// long: past AckWait its writes' outcomes are unknown, and each caller
	// settles its own by a leader read, as for a single write. A healthy
	// batch is acknowledged in milliseconds. Default: 1s.
	AckWait time.Duration
}

func (c BatchConfig) withDefaults() BatchConfig {
	if c.Max == 0 {
		c.Max = defaultBatchMax
	}
	if c.Min == 0 {
		c.Min = min(defaultBatchMin, c.Max)
	}
	if c.InFlight == 0 {
		c.InFlight = DefaultBatchInFlight
	}
	if c.AckWait == 0 {
		c.AckWait = defaultBatchAckWait
	}
	return c
}

func (c BatchConfig) validate() error {
	switch {
	case c.Max < 1 || c.Max > MaxBatch:
		return fmt.Errorf("%w: batch max %d: set 1 to %d, or 0 for the default %d", ErrInvalid, c.Max, MaxBatch, defaultBatchMax)
	case c.Min < 1 || c.Min > c.Max:
		return fmt.Errorf("%w: batch min %d: set 1 to the batch max (%d), or 0 for the default %d", ErrInvalid, c.Min, c.Max, defaultBatchMin)
	case c.InFlight < 1 || c.InFlight > MaxBatchInFlight:
		return fmt.Errorf("%w: batches in flight %d: set 1 to %d, or 0 for the default %d", ErrInvalid, c.InFlight, MaxBatchInFlight, DefaultBatchInFlight)
	case c.AckWait < 0:
		return fmt.Errorf("%w: batch ack wait %s: set a positive duration, or 0 for the default %s", ErrInvalid, c.AckWait, defaultBatchAckWait)
	}
	return nil
}

// BatchStats counts what a batching ledger's writes did since Open. All
// counts are zero for a ledger without batching.
type BatchStats struct {
	// Batches is the number of atomic batches committed.
	Batches uint64
	// BatchedWrites is the number of writes those batches committed.
	BatchedWrites uint64
	// SingleWrites is the number of writes sent one by one: queues shorter
	// than BatchConfig.Min, fallbacks, and writes after Close.
	SingleWrites uint64
	// Resent is the number of batches sent again after a refusal: the write
	// whose expectation failed was answered on its own, or a key was still
	// being written and the batch was sent again after a pause.
	Resent uint64
	// Fallbacks is the number of batches whose writes were sent one by one
	// because the batch could not be sent or its refusal named no write.
	Fallbacks uint64
}

// Add returns the sum of s and o: the figures of two ledgers together.
func (s BatchStats) Add(o BatchStats) BatchStats {
	return BatchStats{Batches: s.Batches + o.Batches, BatchedWrites: s.BatchedWrites + o.BatchedWrites,
		SingleWrites: s.SingleWrites + o.SingleWrites, Resent: s.Resent + o.Resent, Fallbacks: s.Fallbacks + o.Fallbacks}
}
