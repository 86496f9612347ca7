package worker

import (
	"sync"
	"time"
)

// handlerPool runs a worker's intent handlers on long-lived goroutines. A
// goroutine whose handler returned takes the next instead of exiting, so its
// stack — grown by the decoding, the key derivation and the ledger's round
// trips — serves the next intent instead of being grown afresh; one idle
// longer than idleFor exits. At most max goroutines run handlers; more
// handlers wait in order. A handler about to wait long (for a capped tool, a
// holder, the ledger, a direct effect) leaves the pool (detach), which
// starts another in its place: waits never starve the intents behind them.
// An effect does not run on a pool goroutine at all (see fire).
type handlerPool struct {
	max     int
	idleFor time.Duration

	mu       sync.Mutex
	attached int              // pool goroutines running a handler or idle
	idle     []*poolWorker    // most recently idle last
	queue    []func(*poolRun) // handlers waiting for a goroutine
	closed   bool
	running  sync.WaitGroup
}

// poolWorker is one goroutine of the pool.
type poolWorker struct {
	next  chan func(*poolRun) // nil: exit
	since time.Time           // idle since
}

// poolRun is what a handler may tell the pool about its goroutine.
type poolRun struct {
	p        *handlerPool
	detached bool
}

// detach takes the handler's goroutine out of the pool: another takes its
// place for the handlers waiting, and this one exits when its handler
// returns. Call it before a wait that may last.
func (r *poolRun) detach() {
	if r == nil || r.detached {
		return
	}
	r.detached = true
	p := r.p
	p.mu.Lock()
	p.attached--
	var task func(*poolRun)
	if len(p.queue) > 0 && !p.closed {
		task = p.popLocked()
		p.attached++
		p.running.Add(1)
	}
	p.mu.Unlock()
	if task != nil {
		go p.work(task)
	}
}

func newHandlerPool(max int, idleFor time.Duration) *handlerPool {
	return &handlerPool{max: max, idleFor: idleFor}
}

// run runs task on an idle goroutine of the pool, or a new one while the
// pool has fewer than max, or else as soon as one is free, after the tasks
// queued before it.
func (p *handlerPool) run(task func(*poolRun)) { p.submit(task, false) }

// runNext is run, ahead of the tasks queued: what finishes an intent goes
// before what starts one.
func (p *handlerPool) runNext(task func(*poolRun)) { p.submit(task, true) }

func (p *handlerPool) submit(task func(*poolRun), first bool) {
	p.mu.Lock()
	switch n := len(p.idle); {
	case n > 0:
		w := p.idle[n-1]
		p.idle[n-1] = nil
		p.idle = p.idle[:n-1]
		p.mu.Unlock()
		w.next <- task
	case p.attached < p.max:
		p.attached++
		p.running.Add(1)
		p.mu.Unlock()
		go p.work(task)
	case first:
		p.queue = append(p.queue, nil)
		copy(p.queue[1:], p.queue)
		p.queue[0] = task
		p.mu.Unlock()
	default:
		p.queue = append(p.queue, task)
		p.mu.Unlock()
	}
}

func (p *handlerPool) popLocked() func(*poolRun) {
	task := p.queue[0]
	p.queue[0] = nil
	p.queue = p.queue[1:]
	if len(p.queue) == 0 {
		p.queue = nil // let the backing array go
	}
	return task
}

// work runs task, then the queued handlers, then waits idle for more.
func (p *handlerPool) work(task func(*poolRun)) {
	defer p.running.Done()
	w := &poolWorker{next: make(chan func(*poolRun), 1)}
	for task != nil {
		r := &poolRun{p: p}
		task(r)
		if r.detached {
			return
		}
		p.mu.Lock()
		switch {
		case len(p.queue) > 0:
			task = p.popLocked()
			p.mu.Unlock()
			continue
		case p.closed:
			p.attached--
			p.mu.Unlock()
			return
		}
		w.since = time.Now()
		p.idle = append(p.idle, w)
		p.mu.Unlock()
		task = <-w.next
	}
}

// reap stops the goroutines idle longer than idleFor at now, oldest first.
func (p *handlerPool) reap(now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for n < len(p.idle) && now.Sub(p.idle[n].since) > p.idleFor {
		p.idle[n].next <- nil
		p.idle[n] = nil
		n++
	}
	p.attached -= n
	p.idle = p.idle[n:]
}

// reapEvery reaps every period until stop is closed.
func (p *handlerPool) reapEvery(period time.Duration, stop <-chan struct{}) {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case now := <-t.C:
			p.reap(now)
		case <-stop:
			return
		}
	}
}

// close stops the idle goroutines and waits for the others to finish their
// handlers (and those queued).
func (p *handlerPool) close() {
	p.mu.Lock()
	p.closed = true
	for _, w := range p.idle {
		w.next <- nil
	}
	p.attached -= len(p.idle)
	p.idle = nil
	p.mu.Unlock()
	p.running.Wait()
}

// size is the number of goroutines in the pool and of handlers queued.
func (p *handlerPool) size() (goroutines, queued int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.attached, len(p.queue)
}
