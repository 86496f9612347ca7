package audit

import (
	"io"
	"runtime"
	"sync"
)

// The second pass reads each line once, on the caller's goroutine, in
// batches: workers prepare the batches (a line's canonical form, its
// members, its digest and its signatures do not depend on other lines),
// and one goroutine applies them in the trail's order to the chains, the
// one thing that does. In flight are at most twice as many batches as
// workers, so memory does not grow with the trail.

// Bounds of a batch of lines: it is full at batchLines lines or
// batchBytes bytes (and one line more).
const (
	batchLines = 256
	batchBytes = 64 << 10
)

// lineBatch is lines of the trail read together, and what preparing them
// found.
type lineBatch struct {
	buf   []byte      // the lines' bytes, one after the other
	lines []batchLine // each line's number and bytes in buf
	res   []lineResult
	done  chan struct{} // sent on when the batch is prepared (or will not be)
}

type batchLine struct{ n, start, end int }

// withWorkers sets how many goroutines prepare lines (Verify's default:
// GOMAXPROCS); 1 verifies on the caller's goroutine alone.
func withWorkers(n int) VerifyOption { return func(o *verifyOptions) { o.workers = n } }

// withSlowPath reads every line the long way: the fast path's reference.
func withSlowPath() VerifyOption { return func(o *verifyOptions) { o.slow = true } }

// verifyLines verifies every line of r but line skip (the checkpoint
// line), until the first break, which it leaves in v.report.Break. It
// returns an error reading r where no line before the error breaks.
func (v *verifier) verifyLines(r io.Reader, skip int) error {
	workers := v.opts.workers
	if workers == 0 {
		workers = runtime.GOMAXPROCS(0)
	}
	if workers <= 1 {
		return eachLine(r, func(n int, line []byte) bool {
			if n == skip {
				return true
			}
			v.report.Break = v.line(n, line)
			return v.report.Break == nil && v.err == nil
		})
	}
	work := make(chan *lineBatch)
	ordered := make(chan *lineBatch, 2*workers)
	free := make(chan *lineBatch, 2*workers+2) // every batch there is: main's, those ordered, the applier's
	stop := make(chan struct{})                // closed at the first break
	var wg sync.WaitGroup
	for range workers {
		w := v.newWorker()
		wg.Go(func() {
			for b := range work {
				select {
				case <-stop:
				default:
					if cap(b.res) < len(b.lines) {
						b.res = make([]lineResult, len(b.lines), batchLines)
					}
					b.res = b.res[:len(b.lines)]
					for i, l := range b.lines {
						w.prepare(l.n, b.buf[l.start:l.end], &b.res[i])
					}
				}
				b.done <- struct{}{}
			}
		})
	}
	applied := make(chan struct{})
	go func() {
		defer close(applied)
		stopped := false
		for b := range ordered {
			<-b.done
			for i := 0; !stopped && i < len(b.lines); i++ {
				v.report.Break = v.apply(&b.res[i])
				if v.report.Break != nil || v.err != nil {
					stopped = true
					close(stop)
				}
			}
			free <- b
		}
	}()
	newBatch := func() *lineBatch {
		select {
		case b := <-free:
			b.buf, b.lines = b.buf[:0], b.lines[:0]
			return b
		default:
			return &lineBatch{buf: make([]byte, 0, batchBytes+4<<10), done: make(chan struct{}, 1)}
		}
	}
	b := newBatch()
	send := func() bool {
		select {
		case ordered <- b:
		case <-stop:
			return false
		}
		select {
		case work <- b:
		case <-stop:
			b.done <- struct{}{} // the applier waits for it, and applies nothing more
			return false
		}
		b = newBatch()
		return true
	}
	going := true
	err := eachLine(r, func(n int, line []byte) bool {
		if n == skip {
			return true
		}
		b.lines = append(b.lines, batchLine{n: n, start: len(b.buf), end: len(b.buf) + len(line)})
		b.buf = append(b.buf, line...)
		if len(b.lines) >= batchLines || len(b.buf) >= batchBytes {
			going = send()
		}
		return going
	})
	if going && len(b.lines) > 0 {
		send() // the lines before an error reading, too
	}
	close(work)
	close(ordered)
	wg.Wait()
	<-applied
	if v.report.Break != nil {
		return nil
	}
	return err
}
