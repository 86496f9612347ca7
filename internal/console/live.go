package console

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemgate/idemgate/internal/auth"

	"go.uber.org/zap"

	"github.com/idemgate/idemgate/pkg/audit"
	"github.com/idemgate/idemgate/pkg/dedup"
	"github.com/idemgate/idemgate/pkg/intent"
)

// Live pages: one watch of the whole ledger per front door (the hub), fanned
// out to every open page as server-sent events, each page getting only the
// records its operator's namespace reaches.
const (
	// hubLinger keeps the watch running this long after the last page
	// closed, so that moving between pages does not restart it.
	hubLinger = 2 * time.Minute
	// ringSize is how many recent changes the hub keeps, so that a page
	// that subscribes just after it was drawn gets the changes in between.
	ringSize = 16384
	// subBuffer is how many changes wait for one page; past it the page is
	// told to read the queue again rather than slow the others.
	subBuffer = 1024
	// countsEvery coalesces count updates: at most one per interval.
	countsEvery = time.Second
	// pingEvery keeps an idle event stream open through proxies, and is when
	// the stream checks that its session is still live.
	pingEvery = 15 * time.Second
	// eventWriteTimeout bounds one write to a page.
	eventWriteTimeout = 30 * time.Second
)

// recordWatcher is what the hub needs of the client.
type recordWatcher interface {
	WatchRecords(ctx context.Context) (<-chan dedup.Change, error)
}

// auditWatcher is what the hub needs of the client to tell a record page
// that its history grew; without it, a page's history is redrawn with its
// record only.
type auditWatcher interface {
	WatchAudit(ctx context.Context) (<-chan audit.Event, error)
}

// hub follows the ledger for the live pages: one watch of every key,
// started when a page needs it and stopped hubLinger after the last page
// closed. It keeps the open records (key, status, session) it has seen, so
// that it can count them per namespace and name the session of a deleted
// one; the queue page's read of the ledger seeds it.
type hub struct {
	cl  recordWatcher
	log *zap.Logger

	mu       sync.Mutex
	closed   bool
	epoch    string // names this run of the watch; "" when not running
	cancel   context.CancelFunc
	seq      uint64     // the changes of this epoch, numbered from 1
	ring     []hubEvent // the latest changes, ring[seq%ringSize]
	subs     map[*subscriber]struct{}
	view     map[string]openRecord // the open records
	complete bool                  // view holds every open record
	dirty    bool                  // view changed since the counts were sent
	lastUse  time.Time
	idle     *time.Timer
}

// hubEvent is one change as the hub keeps it.
type hubEvent struct {
	seq     uint64
	key     string
	rev     uint64
	session string
	known   bool // session is the record's (a deletion of a record the hub did not see open has none)
	history bool // an audit event of key (its compact form), not a ledger change
	data    []byte
}

// openRecord is what the hub keeps of an open record.
type openRecord struct {
	rev     uint64
	status  intent.Status
	session string
}

// liveChange is a change as a page receives it.
type liveChange struct {
	Key     string        `json:"key"`
	Rev     uint64        `json:"rev"`
	Status  intent.Status `json:"status,omitempty"`
	Tool    string        `json:"tool,omitempty"`
	Deleted bool          `json:"deleted,omitempty"`
}

// subscriber is one open page's event stream.
type subscriber struct {
	tok  *auth.Token
	key  string      // only this key's changes, when set
	opID string      // key's compact form, as the history events name it
	mine bool        // key's record was in tok's namespace when the page subscribed
	ch   chan []byte // event-stream messages
	lost atomic.Bool // ch overflowed: the page must read everything again
	done chan struct{}
}

func newHub(cl recordWatcher, log *zap.Logger) *hub {
	return &hub{cl: cl, log: log, subs: map[*subscriber]struct{}{}}
}

// ensure starts the watch unless it runs and returns the hub's position:
// a page drawn from the ledger after this call passes it when it
// subscribes, and gets every change since. "" when the watch cannot start.
func (h *hub) ensure(ctx context.Context) string {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return ""
	}
	h.lastUse = time.Now()
	h.armIdleLocked()
	if h.epoch == "" {
		wctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		ch, err := h.cl.WatchRecords(wctx)
		if err != nil {
			cancel()
			h.log.Warn("console: the ledger watch did not start; pages are not live", zap.Error(err))
			return ""
		}
		var trail <-chan audit.Event
		if aw, ok := h.cl.(auditWatcher); ok {
			if trail, err = aw.WatchAudit(wctx); err != nil {
				h.log.Warn("console: the audit trail watch did not start; record pages redraw their history with their record only", zap.Error(err))
			}
		}
		h.epoch, h.cancel, h.seq = randomID()[:12], cancel, 0
		h.ring = make([]hubEvent, ringSize)
		h.view, h.complete, h.dirty = map[string]openRecord{}, false, false
		go h.run(h.epoch, ch, trail)
	}
	return h.positionLocked()
}

func (h *hub) positionLocked() string { return h.epoch + ":" + strconv.FormatUint(h.seq, 10) }

// parsePosition reads a position ensure returned.
func parsePosition(p string) (epoch string, seq uint64, ok bool) {
	e, s, found := strings.Cut(p, ":")
	n, err := strconv.ParseUint(s, 10, 64)
	return e, n, found && err == nil && e != ""
}

// armIdleLocked stops the watch hubLinger after its last use, when no page
// is open.
func (h *hub) armIdleLocked() {
	if h.idle != nil {
		h.idle.Stop()
	}
	h.idle = time.AfterFunc(hubLinger, func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		if len(h.subs) == 0 && time.Since(h.lastUse) >= hubLinger && h.cancel != nil {
			h.cancel()
		}
	})
}

// close stops the watch for good and ends every page's stream.
func (h *hub) close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.closed = true
	if h.idle != nil {
		h.idle.Stop()
	}
	if h.cancel != nil {
		h.cancel()
	}
}

// run applies the watch's changes and the audit events of trail (nil: no
// audit watch) until either ends, and sends the counts of open records when
// they changed, at most once per countsEvery.
func (h *hub) run(epoch string, ch <-chan dedup.Change, trail <-chan audit.Event) {
	tick := time.NewTicker(countsEvery)
	defer tick.Stop()
	for {
		select {
		case c, ok := <-ch:
			if !ok {
				h.ended(epoch)
				return
			}
			h.apply(epoch, c)
		case ev, ok := <-trail:
			if !ok {
				h.ended(epoch)
				return
			}
			h.applyHistory(epoch, ev)
		case <-tick.C:
			h.sendCounts(epoch)
		}
	}
}

// ended forgets a watch that stopped and ends its pages' streams; they
// reconnect, which starts another.
func (h *hub) ended(epoch string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.epoch != epoch {
		return
	}
	h.epoch, h.cancel, h.ring, h.view = "", nil, nil, nil
	for sub := range h.subs {
		close(sub.done)
	}
	h.subs = map[*subscriber]struct{}{}
}

func isOpen(s intent.Status) bool { return slices.Contains(dedup.OpenStatuses, s) }

// apply records one change and sends it to the pages that may see it.
func (h *hub) apply(epoch string, c dedup.Change) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.epoch != epoch {
		return
	}
	if tool, _, ok := strings.Cut(c.Key, "."); !ok || !intent.ValidTool(tool) {
		return // not an operation's key (the workers' own, such as a scan's marker)
	}
	ev := hubEvent{key: c.Key, rev: c.Revision, session: c.Record.Session, known: !c.Deleted}
	prev, wasOpen := h.view[c.Key]
	if wasOpen && prev.rev >= c.Revision {
		wasOpen = false // a seed newer than the change: keep it
	} else {
		if c.Deleted && wasOpen {
			ev.session, ev.known = prev.session, true
		}
		switch {
		case !c.Deleted && isOpen(c.Record.Status):
			h.view[c.Key] = openRecord{rev: c.Revision, status: c.Record.Status, session: c.Record.Session}
			h.dirty = true
		case wasOpen:
			delete(h.view, c.Key)
			h.dirty = true
		}
	}
	h.seq++
	ev.seq = h.seq
	ev.data = sseMessage("change", liveChange{Key: c.Key, Rev: c.Revision, Status: c.Record.Status, Tool: c.Record.Tool, Deleted: c.Deleted})
	h.ring[ev.seq%ringSize] = ev
	for sub := range h.subs {
		if sub.wants(ev) {
			sub.send(ev.data)
		}
	}
}

// applyHistory tells the pages that follow an operation that its history
// grew by ev.
func (h *hub) applyHistory(epoch string, ev audit.Event) {
	if ev.Key == "" {
		return // a gap: of no one operation
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.epoch != epoch {
		return
	}
	id := opID(ev.Key)
	h.seq++
	hev := hubEvent{seq: h.seq, key: id, session: ev.Session, known: ev.Session != "", history: true,
		data: sseMessage("history", map[string]string{"kind": string(ev.Kind)})}
	h.ring[hev.seq%ringSize] = hev
	for sub := range h.subs {
		if sub.wants(hev) {
			sub.send(hev.data)
		}
	}
}

// opID is the form of key that names its operation in both ledger
// layouts: the compact one.
func opID(key string) string {
	id, err := intent.LedgerKey(key, intent.LayoutCompact)
	if err != nil {
		return key
	}
	return id
}

// wants reports whether the page may see ev: a record of its namespace
// (and its key, when it follows one); a deletion whose session the hub does
// not know goes only to operators of every namespace, and to a page that
// follows that key and was shown its record. A history event goes only to
// the pages that follow its operation, by the same rules; one that names
// no session (a firing) as a deletion does.
func (sub *subscriber) wants(ev hubEvent) bool {
	switch {
	case ev.history && ev.key != sub.opID:
		return false
	case !ev.history && sub.key != "" && ev.key != sub.key:
		return false
	}
	if ev.known {
		return sub.tok.Reaches(ev.session)
	}
	return sub.tok.Namespace == auth.AllNamespaces || sub.mine
}

// send queues a message for the page, or marks it lost when the page is
// too far behind.
func (sub *subscriber) send(data []byte) {
	select {
	case sub.ch <- data:
	default:
		sub.lost.Store(true)
	}
}

// coversLocked reports whether the ring still holds every change after
// seq.
func (h *hub) coversLocked(seq uint64) bool {
	return seq <= h.seq && h.seq-seq < ringSize
}

// seed merges a read of the open records, made after position since, into
// the view; complete says the read reached the end of the ledger. A record
// the watch saw change after since is left as the watch has it.
func (h *hub) seed(since string, recs []dedup.Listed, complete bool) {
	epoch, seq, ok := parsePosition(since)
	h.mu.Lock()
	defer h.mu.Unlock()
	if !ok || epoch != h.epoch || !h.coversLocked(seq) {
		return
	}
	touched := map[string]uint64{}
	for s := seq + 1; s <= h.seq; s++ {
		if ev := h.ring[s%ringSize]; !ev.history {
			touched[ev.key] = max(touched[ev.key], ev.rev)
		}
	}
	for _, r := range recs {
		if !isOpen(r.Status) || touched[r.Key] >= r.Revision {
			continue
		}
		if v, ok := h.view[r.Key]; ok && v.rev >= r.Revision {
			continue
		}
		h.view[r.Key] = openRecord{rev: r.Revision, status: r.Status, session: r.Session}
	}
	if complete {
		h.complete = true
	}
	h.dirty = true
}

// subscribe opens a page's stream. since is the position the page was
// drawn at: the changes after it are sent first; when the hub cannot (the
// watch restarted, or the ring moved on), the page is told to read
// everything again. key, when set, limits the stream to one key's changes;
// mine says its record is in tok's namespace.
func (h *hub) subscribe(tok *auth.Token, key string, mine bool, since string) *subscriber {
	sub := &subscriber{tok: tok, key: key, mine: key != "" && mine, ch: make(chan []byte, subBuffer), done: make(chan struct{})}
	if key != "" {
		sub.opID = opID(key)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.epoch == "" {
		close(sub.done)
		return sub
	}
	epoch, seq, ok := parsePosition(since)
	resync := !ok || epoch != h.epoch || !h.coversLocked(seq)
	sub.send(sseMessage("ready", map[string]any{"resync": resync, "position": h.positionLocked()}))
	if !resync {
		for s := seq + 1; s <= h.seq; s++ {
			if ev := h.ring[s%ringSize]; sub.wants(ev) {
				sub.send(ev.data)
			}
		}
	}
	if h.complete && key == "" {
		sub.send(sseMessage("counts", h.countsLocked(tok)))
	}
	h.subs[sub] = struct{}{}
	return sub
}

// unsubscribe closes a page's stream.
func (h *hub) unsubscribe(sub *subscriber) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.subs, sub)
	h.lastUse = time.Now()
	if !h.closed {
		h.armIdleLocked()
	}
}

// countsLocked counts the open records tok reaches, by status.
func (h *hub) countsLocked(tok *auth.Token) map[intent.Status]int {
	n := map[intent.Status]int{}
	for _, s := range dedup.OpenStatuses {
		n[s] = 0
	}
	for _, r := range h.view {
		if tok.Reaches(r.session) {
			n[r.status]++
		}
	}
	return n
}

// sendCounts sends the counts to the queue pages, when they changed.
func (h *hub) sendCounts(epoch string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.epoch != epoch || !h.dirty || !h.complete {
		return
	}
	h.dirty = false
	byNamespace := map[string][]byte{}
	for sub := range h.subs {
		if sub.key != "" {
			continue
		}
		msg, ok := byNamespace[sub.tok.Namespace]
		if !ok {
			msg = sseMessage("counts", h.countsLocked(sub.tok))
			byNamespace[sub.tok.Namespace] = msg
		}
		sub.send(msg)
	}
}

// sseMessage is an event-stream message of type event carrying v as JSON.
func sseMessage(event string, v any) []byte {
	data, _ := json.Marshal(v)
	return []byte("event: " + event + "\ndata: " + string(data) + "\n\n")
}

// events is a live page's event stream (text/event-stream): the ledger's
// changes its operator may see, pushed as the hub's watch delivers them.
func (c *Console) events(w http.ResponseWriter, r *http.Request, sess *consoleSession) {
	rc := http.NewResponseController(w)
	c.hub.ensure(r.Context())
	key, mine := r.URL.Query().Get("key"), false
	if key != "" {
		rec, err := c.cl.Get(r.Context(), key)
		mine = err == nil && sess.tok.Reaches(rec.Session)
	}
	sub := c.hub.subscribe(sess.tok, key, mine, r.URL.Query().Get("since"))
	defer c.hub.unsubscribe(sub)
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	write := func(b []byte) bool {
		_ = rc.SetWriteDeadline(time.Now().Add(eventWriteTimeout))
		if _, err := w.Write(b); err != nil {
			return false
		}
		return rc.Flush() == nil
	}
	if !write([]byte("retry: 3000\n\n")) {
		return
	}
	ping := time.NewTicker(pingEvery)
	defer ping.Stop()
	for {
		select {
		case b := <-sub.ch:
			if !write(b) {
				return
			}
			if sub.lost.Swap(false) && !write(sseMessage("ready", map[string]any{"resync": true})) {
				return
			}
		case <-ping.C:
			if !c.sessions.live(sess) {
				write(sseMessage("expired", map[string]string{"login": Path + "login"}))
				return
			}
			if !write([]byte(": ping\n\n")) {
				return
			}
		case <-sub.done:
			return
		case <-c.stop:
			return
		case <-r.Context().Done():
			return
		}
	}
}
