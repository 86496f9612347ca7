package worker

import (
	"container/list"
	"sync"
	"time"

	"github.com/idemgate/idemgate/pkg/dedup"
	"github.com/idemgate/idemgate/pkg/intent"
)

// maxCachedRecord is the largest record (result, kept intent and error
// message together) the answer cache keeps; larger ones are read from the
// ledger every time.
const maxCachedRecord = 64 << 10

// answerCache remembers, for a short while, the final records this worker
// wrote or read — completed, failed, denied: a record in one of those states
// never changes — so that a duplicate is answered without a round trip to the
// ledger. It changes no guarantee about effects: a cached answer fires
// nothing. Its one visible difference: a record removed from the ledger (by
// an operator, to let an operation run again, or by the bucket's TTL) is
// still answered from the cache until the entry's age limit. Entries go
// least recently used first once the cache holds maxBytes.
type answerCache struct {
	ttl      time.Duration
	maxBytes int
	now      func() time.Time

	mu    sync.Mutex
	byKey map[string]*list.Element
	// byStored finds a derived key's entry by the key a compact ledger
	// stores it under (intent.LayoutCompact), which operators name too.
	byStored map[string]*list.Element
	lru      *list.List // of *cachedAnswer, most recently used first
	bytes    int
}

type cachedAnswer struct {
	key string
	// stored is the key a compact ledger stores key under, when key is a
	// derived one (the entry of byStored); "" otherwise.
	stored string
	rec    dedup.Record
	until  time.Time
	size   int
}

func newAnswerCache(ttl time.Duration, maxBytes int) *answerCache {
	return &answerCache{ttl: ttl, maxBytes: maxBytes, now: time.Now, byKey: map[string]*list.Element{},
		byStored: map[string]*list.Element{}, lru: list.New()}
}

// cacheable reports whether a record in status s can answer later
// duplicates unchanged.
func cacheable(s intent.Status) bool {
	return s == intent.StatusCompleted || s == intent.StatusFailed || s == intent.StatusDenied
}

// get returns key's record if an entry younger than the age limit has it.
func (c *answerCache) get(key string) (dedup.Record, bool) {
	if c == nil {
		return dedup.Record{}, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	el, ok := c.byKey[key]
	if !ok {
		return dedup.Record{}, false
	}
	a := el.Value.(*cachedAnswer)
	if !c.now().Before(a.until) {
		c.removeLocked(el)
		return dedup.Record{}, false
	}
	c.lru.MoveToFront(el)
	return a.rec, true
}

// put keeps rec as key's answer when it is final and small enough; an entry
// already there keeps its age limit.
func (c *answerCache) put(key string, rec dedup.Record) {
	if c == nil || !cacheable(rec.Status) {
		return
	}
	if rec.Signature != nil {
		rec.Receipt = nil // made again from the signature on a hit (dedup.Record.SignedReceipt)
	}
	size := len(key) + len(rec.Result) + len(rec.Intent) + len(rec.Receipt) + 512 // the record's other fields, the entry, the map
	if s := rec.Signature; s != nil {
		size += len(s.Key) + len(s.Holder) + len(s.Signer) + len(s.Sig) + len(s.Proof)
	}
	if rec.Error != nil {
		size += len(rec.Error.Message)
	}
	if size > maxCachedRecord || size > c.maxBytes {
		return
	}
	stored, _ := compactStored(key) // once per entry: its removal reads it back
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.byKey[key]; ok {
		c.lru.MoveToFront(el)
		return
	}
	until := c.now().Add(c.ttl)
	if rec.RetentionSeconds > 0 {
		// A tool's retention may be shorter than the cache's age limit:
		// the entry never outlives its record.
		until = minTime(until, rec.UpdatedAt.Add(time.Duration(rec.RetentionSeconds)*time.Second))
	}
	el := c.lru.PushFront(&cachedAnswer{key: key, stored: stored, rec: rec, until: until, size: size})
	c.byKey[key] = el
	if stored != "" {
		c.byStored[stored] = el
	}
	c.bytes += size
	for c.bytes > c.maxBytes {
		c.removeLocked(c.lru.Back())
	}
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// forget drops key's entry, if there is one, and the entry of the derived
// key a compact ledger stores as key: an operator may name either.
func (c *answerCache) forget(key string) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.byKey[key]; ok {
		c.removeLocked(el)
	}
	if el, ok := c.byStored[key]; ok {
		c.removeLocked(el)
	}
}

func (c *answerCache) removeLocked(el *list.Element) {
	a := c.lru.Remove(el).(*cachedAnswer)
	delete(c.byKey, a.key)
	if a.stored != "" && c.byStored[a.stored] == el {
		delete(c.byStored, a.stored)
	}
	c.bytes -= a.size
}

// compactStored is the key a compact ledger stores key under, when key is
// a derived one (the only kind it shortens).
func compactStored(key string) (string, bool) {
	stored, err := intent.LedgerKey(key, intent.LayoutCompact) // any other key is stored as it is
	if err != nil || stored == key {
		return "", false
	}
	return stored, true
}

// len is the number of entries, expired ones included until they are met.
func (c *answerCache) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lru.Len()
}
