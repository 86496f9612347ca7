package console

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"embed"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"net/url"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/idemgate/idemgate/internal/auth"

	"go.uber.org/zap"

	"github.com/idemgate/idemgate/pkg/client"
)

// Path is where the console is served.
const Path = "/console/"

// Session limits of the console.
const (
	// consoleCookie names the cookie that holds a console session's id.
	consoleCookie = "idemgate_console"
	// sessionIdle ends a session nobody used for this long (an open live
	// page keeps it in use).
	sessionIdle = 30 * time.Minute
	// sessionMax ends a session this long after its login, in use or not.
	sessionMax = 12 * time.Hour
	// maxSessions bounds the sessions kept; a login beyond it is refused.
	maxSessions = 10000
	// maxTokenSessions bounds one token's sessions; its login beyond it
	// ends its oldest.
	maxTokenSessions = 16
	// maxFlashes and maxFlashBytes bound the messages a session keeps for
	// its next page (the oldest go first); maxFlashText bounds a message's
	// text and maxFlashLink its link, and its detail is clipped to fit.
	maxFlashes    = 8
	maxFlashBytes = 16 << 10
	maxFlashText  = 2 << 10
	maxFlashLink  = 1 << 10
	// consoleWait bounds how long an action waits for the workers' answer
	// (an approval's is the firing it lets happen).
	consoleWait = 30 * time.Second
)

// liveFetchHeader marks a live page's background fetch of itself.
const liveFetchHeader = "Idem-Console-Live"

// contentSecurityPolicy admits only the console's own scripts, styles and
// connections: no inline script or style, no other origin, no framing.
const contentSecurityPolicy = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; " +
	"connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"

//go:embed assets templates
var consoleFiles embed.FS

// Console serves the operator console.
type Console struct {
	cfg      Config
	cl       *client.Client
	log      *zap.Logger
	pages    map[string]*template.Template // by page name; each has the layout
	frags    *template.Template            // fragments the live pages fetch
	assets   http.Handler
	version  string // a digest of the assets, in their URLs
	sessions sessionStore
	logins   *loginLimiter
	hub      *hub
	rates    *rateSampler // nil without worker metrics
	cop      *http.CrossOriginProtection
	stop     chan struct{} // closed when the server shuts down
	stopOnce sync.Once
}

// New checks cfg and returns a console serving it, reading the ledger and
// the audit trail and making the operators' decisions with cl, logging to
// log (nil: no logging).
func New(cl *client.Client, log *zap.Logger, cfg Config) (*Console, error) {
	if cl == nil {
		return nil, errors.New("console: no client: give the pkg/client Client the pages read the ledger with")
	}
	if log == nil {
		log = zap.NewNop()
	}
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	c := &Console{cfg: cfg, cl: cl, log: log, cop: http.NewCrossOriginProtection(),
		stop: make(chan struct{}), pages: map[string]*template.Template{}, logins: newLoginLimiter()}
	c.sessions.byID, c.sessions.byToken = map[string]*consoleSession{}, map[string][]*consoleSession{}
	assets, err := fs.Sub(consoleFiles, "assets")
	if err != nil {
		return nil, err
	}
	sum := sha256.New()
	err = fs.WalkDir(assets, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := fs.ReadFile(assets, p)
		sum.Write([]byte(p))
		sum.Write(data)
		return err
	})
	if err != nil {
		return nil, err
	}
	c.version = hex.EncodeToString(sum.Sum(nil))[:12]
	c.assets = http.StripPrefix(Path+"assets/"+c.version+"/", http.FileServerFS(assets))
	layout := template.Must(template.New("layout").Funcs(consoleFuncs).ParseFS(consoleFiles, "templates/layout.html", "templates/parts.html"))
	names, err := fs.Glob(consoleFiles, "templates/page_*.html")
	if err != nil {
		return nil, err
	}
	for _, n := range names {
		t := template.Must(template.Must(layout.Clone()).ParseFS(consoleFiles, n))
		c.pages[strings.TrimSuffix(strings.TrimPrefix(path.Base(n), "page_"), ".html")] = t
	}
	c.frags = template.Must(template.New("frags").Funcs(consoleFuncs).ParseFS(consoleFiles, "templates/parts.html"))
	c.hub = newHub(c.cl, c.log.Named("console"))
	if len(cfg.WorkerMetrics) > 0 {
		c.rates = newRateSampler(cfg.WorkerMetrics, cfg.WorkerMetricsEvery, c.log.Named("console"))
	}
	return c, nil
}

// Start runs the console's background work (reading the workers' metrics)
// until ctx ends, and ends the live pages when srv shuts down.
func (c *Console) Start(ctx context.Context, srv *http.Server) {
	srv.RegisterOnShutdown(c.shutdown)
	if c.rates != nil {
		go c.rates.run(ctx)
	}
}

// shutdown ends the live pages' event streams and the hub's watch.
func (c *Console) shutdown() {
	c.stopOnce.Do(func() {
		close(c.stop)
		c.hub.close()
	})
}

// consoleHandler is a console route's handler, for a logged-in operator.
type consoleHandler func(w http.ResponseWriter, r *http.Request, sess *consoleSession)

// Mount adds the console's routes to mux: Path and what is under it, and
// Path without its slash (a redirect).
func (c *Console) Mount(mux *http.ServeMux) {
	page := func(pattern string, h consoleHandler) { mux.Handle(pattern, c.guard(h, false)) }
	frag := func(pattern string, h consoleHandler) { mux.Handle(pattern, c.guard(h, true)) }
	mux.Handle("GET /console", http.RedirectHandler(Path, http.StatusMovedPermanently))
	mux.Handle("GET /console/assets/", c.secure(http.HandlerFunc(c.asset)))
	mux.Handle("GET /console/login", c.secure(http.HandlerFunc(c.loginPage)))
	mux.Handle("POST /console/login", c.secure(http.HandlerFunc(c.login)))
	page("POST /console/logout", c.logout)
	page("GET /console/{$}", c.queue)
	frag("GET /console/queue/items", c.queueItems)
	frag("GET /console/queue/item/{key}", c.queueItem)
	page("GET /console/search", c.search)
	page("GET /console/op/{key}", c.record)
	page("POST /console/op/{key}/{action}", c.act)
	page("GET /console/dead-letters", c.deadLetters)
	page("GET /console/dead-letters/{seq}", c.deadLetter)
	page("POST /console/dead-letters/{seq}/replay", c.replay)
	page("GET /console/overview", c.overview)
	frag("GET /console/events", c.events)
	mux.Handle("/console/", c.secure(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c.errorPage(w, r, nil, http.StatusNotFound, "No such page", fmt.Sprintf("%s %s is not a page of the console.", r.Method, r.URL.Path))
	})))
}

// secure sets the console's security headers and refuses cross-origin
// unsafe requests (CSRF by a foreign page: http.CrossOriginProtection reads
// Sec-Fetch-Site and Origin).
func (c *Console) secure(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", contentSecurityPolicy)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("X-Frame-Options", "DENY")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Cross-Origin-Opener-Policy", "same-origin")
		h.Set("Cross-Origin-Resource-Policy", "same-origin")
		if !strings.HasPrefix(r.URL.Path, Path+"assets/") {
			h.Set("Cache-Control", "no-store")
		}
		if err := c.cop.Check(r); err != nil {
			c.errorPage(w, r, nil, http.StatusForbidden, "Cross-origin request refused", "The console takes actions only from its own pages.")
			return
		}
		next.ServeHTTP(w, r)
	})
}

// guard admits a request with a live session: it applies the session
// token's rate limit and in-flight cap as the API does, checks the CSRF
// token of every POST, and calls h. A page request without a session is
// sent to the login page; a fragment's gets 401.
func (c *Console) guard(h consoleHandler, fragment bool) http.Handler {
	return c.secure(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sess := c.session(r)
		if sess == nil {
			if fragment || r.Method != http.MethodGet {
				http.Error(w, "log in to the console again", http.StatusUnauthorized)
				return
			}
			http.Redirect(w, r, Path+"login?next="+url.QueryEscape(r.URL.RequestURI()), http.StatusSeeOther)
			return
		}
		leave, wait, why := c.cfg.Limiter.Admit(sess.tok)
		if leave == nil {
			retryAfter(w, wait)
			c.errorPage(w, r, sess, http.StatusTooManyRequests, "Too many requests", why)
			return
		}
		defer leave()
		if r.Method == http.MethodPost {
			r.Body = http.MaxBytesReader(w, r.Body, int64(c.cfg.MaxBodyBytes))
			if err := r.ParseForm(); err != nil {
				c.errorPage(w, r, sess, http.StatusBadRequest, "Unreadable form", err.Error())
				return
			}
		}
		// The body is read: lift the body deadline, which would otherwise
		// end a live page's event stream.
		_ = http.NewResponseController(w).SetReadDeadline(time.Time{})
		if r.Method == http.MethodPost {
			if subtle.ConstantTimeCompare([]byte(r.PostFormValue("csrf")), []byte(sess.csrf)) != 1 {
				c.errorPage(w, r, sess, http.StatusForbidden, "Stale or forged form", "The form's CSRF token is not this session's: reload the page and try again.")
				return
			}
		}
		h(w, r, sess)
	}))
}

// asset serves an embedded file; its URL names the assets' digest, so it
// never changes and may be cached for good.
func (c *Console) asset(w http.ResponseWriter, r *http.Request) {
	if !strings.HasPrefix(r.URL.Path, Path+"assets/"+c.version+"/") {
		http.NotFound(w, r)
		return
	}
	w.Header().Set("Cache-Control", "public, max-age=31536000, immutable")
	c.assets.ServeHTTP(w, r)
}

// consoleSession is a logged-in operator.
type consoleSession struct {
	id      string
	tok     *auth.Token
	csrf    string
	created time.Time
	used    time.Time
	flashes []flash
}

// flash is a one-time message shown on the next page: the outcome of an
// action.
type flash struct {
	Kind   string // ok, error or info
	Text   string
	Detail string // the workers' answer, as JSON
	Link   string // a page to follow, e.g. the operation's
}

// sessionStore keeps the console's sessions in the front door's memory:
// at most maxTokenSessions per token (a login beyond ends that token's
// oldest), maxSessions in all (a login beyond is refused; no token's login
// ends another's session), each with at most maxFlashes messages of
// maxFlashBytes together.
type sessionStore struct {
	mu      sync.Mutex
	byID    map[string]*consoleSession
	byToken map[string][]*consoleSession // by token hash, oldest first
}

// errConsoleFull: the console holds maxSessions live sessions.
var errConsoleFull = errors.New("the console holds its maximum of sessions")

// newSession starts a session for tok, ending tok's oldest when it holds
// maxTokenSessions; errConsoleFull when the store is full of live sessions.
func (st *sessionStore) newSession(tok *auth.Token) (*consoleSession, error) {
	now := time.Now()
	sess := &consoleSession{id: randomID(), tok: tok, csrf: randomID(), created: now, used: now}
	st.mu.Lock()
	defer st.mu.Unlock()
	h := tok.Hash()
	for _, s := range slices.Clone(st.byToken[h]) { // remove changes the slice
		if s.expired(now) {
			st.remove(s)
		}
	}
	for own := st.byToken[h]; len(own) >= maxTokenSessions; own = st.byToken[h] {
		st.remove(own[0])
	}
	if len(st.byID) >= maxSessions {
		for _, s := range st.byID {
			if s.expired(now) {
				st.remove(s)
			}
		}
		if len(st.byID) >= maxSessions {
			return nil, errConsoleFull
		}
	}
	st.byID[sess.id] = sess
	st.byToken[h] = append(st.byToken[h], sess)
	return sess, nil
}

// remove ends sess; st.mu is held.
func (st *sessionStore) remove(sess *consoleSession) {
	if st.byID[sess.id] != sess {
		return
	}
	delete(st.byID, sess.id)
	h := sess.tok.Hash()
	own := slices.DeleteFunc(st.byToken[h], func(s *consoleSession) bool { return s == sess })
	if len(own) == 0 {
		delete(st.byToken, h)
	} else {
		st.byToken[h] = own
	}
}

func (s *consoleSession) expired(now time.Time) bool {
	return now.Sub(s.used) > sessionIdle || now.Sub(s.created) > sessionMax
}

// get returns the live session id names and marks it used.
func (st *sessionStore) get(id string) *consoleSession {
	st.mu.Lock()
	defer st.mu.Unlock()
	sess := st.byID[id]
	if sess == nil {
		return nil
	}
	now := time.Now()
	if sess.expired(now) {
		st.remove(sess)
		return nil
	}
	sess.used = now
	return sess
}

// live reports whether sess is still a session (not ended by logout or
// expiry), marking it used.
func (st *sessionStore) live(sess *consoleSession) bool { return st.get(sess.id) == sess }

func (st *sessionStore) end(id string) {
	st.mu.Lock()
	if sess := st.byID[id]; sess != nil {
		st.remove(sess)
	}
	st.mu.Unlock()
}

// addFlash queues a message for sess's next page, clipped to fit the
// session's bounds; the oldest queued messages make room for it.
func (st *sessionStore) addFlash(sess *consoleSession, f flash) {
	f.Text = clipText(f.Text, maxFlashText, "…")
	if len(f.Link) > maxFlashLink {
		f.Link = ""
	}
	f.Detail = clipText(f.Detail, maxFlashBytes-maxFlashText-maxFlashLink-len(f.Kind), "\n… (clipped: the operation's page shows it whole)")
	st.mu.Lock()
	defer st.mu.Unlock()
	sess.flashes = append(sess.flashes, f)
	for len(sess.flashes) > maxFlashes || flashSize(sess.flashes) > maxFlashBytes {
		sess.flashes = slices.Delete(sess.flashes, 0, 1)
	}
}

// flashSize is the bytes fs hold.
func flashSize(fs []flash) int {
	n := 0
	for _, f := range fs {
		n += len(f.Kind) + len(f.Text) + len(f.Detail) + len(f.Link)
	}
	return n
}

// clipText is s, or its first bytes and mark when it is longer than n in
// all (cut on a character's boundary).
func clipText(s string, n int, mark string) string {
	if len(s) <= n {
		return s
	}
	cut := max(n-len(mark), 0)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + mark
}

// takeFlashes returns and clears sess's queued messages.
func (st *sessionStore) takeFlashes(sess *consoleSession) []flash {
	st.mu.Lock()
	defer st.mu.Unlock()
	f := sess.flashes
	sess.flashes = nil
	return f
}

// session returns the request's live session, or nil.
func (c *Console) session(r *http.Request) *consoleSession {
	ck, err := r.Cookie(consoleCookie)
	if err != nil || ck.Value == "" {
		return nil
	}
	return c.sessions.get(ck.Value)
}

// randomID is 256 random bits, base64url.
func randomID() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	return base64.RawURLEncoding.EncodeToString(b)
}

// loginPage shows the login form.
func (c *Console) loginPage(w http.ResponseWriter, r *http.Request) {
	if c.session(r) != nil {
		http.Redirect(w, r, safeNext(r.URL.Query().Get("next")), http.StatusSeeOther)
		return
	}
	c.render(w, r, nil, http.StatusOK, "login", loginData{Next: safeNext(r.URL.Query().Get("next"))})
}

type loginData struct {
	Next  string
	Error string
}

// login starts a session for an operator token pasted in the form. Failed
// logins are slowed per source address (loginLimiter).
func (c *Console) login(w http.ResponseWriter, r *http.Request) {
	src := source(r)
	if d := c.logins.wait(src); d > 0 {
		retryAfter(w, d)
		c.render(w, r, nil, http.StatusTooManyRequests, "login", loginData{Next: Path,
			Error: fmt.Sprintf("Too many failed logins from your address: nothing was checked; try again in %s.", d.Truncate(time.Second)+time.Second)})
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, 4<<10)
	if err := r.ParseForm(); err != nil {
		c.render(w, r, nil, http.StatusBadRequest, "login", loginData{Error: "The form did not read: " + err.Error()})
		return
	}
	next := safeNext(r.PostFormValue("next"))
	tok, ok := c.cfg.Tokens.Lookup(strings.TrimSpace(r.PostFormValue("token")))
	switch {
	case !ok:
		c.logins.failed(src)
		c.log.Info("console login refused", zap.String("remote", r.RemoteAddr))
		c.render(w, r, nil, http.StatusUnauthorized, "login", loginData{Next: next, Error: "That is not a token of this front door's tokens file."})
		return
	case tok.Role != auth.RoleOperator:
		c.logins.failed(src)
		c.render(w, r, nil, http.StatusForbidden, "login", loginData{Next: next,
			Error: fmt.Sprintf("%s is an agent's token; the console is for operators (make run writes one to data/operator.token).", tok.Name)})
		return
	}
	sess, err := c.sessions.newSession(tok)
	if err != nil {
		retryAfter(w, time.Minute)
		c.render(w, r, nil, http.StatusServiceUnavailable, "login", loginData{Next: next,
			Error: fmt.Sprintf("Not logged in: %v (%d); try again once some end.", err, maxSessions)})
		return
	}
	if old, err := r.Cookie(consoleCookie); err == nil {
		c.sessions.end(old.Value)
	}
	http.SetCookie(w, &http.Cookie{Name: consoleCookie, Value: sess.id, Path: Path, HttpOnly: true,
		Secure: c.cfg.HTTPS, SameSite: http.SameSiteStrictMode, MaxAge: int(sessionMax / time.Second)})
	c.log.Info("console login", zap.String("operator", tok.Name), zap.String("namespace", tok.Namespace), zap.String("remote", r.RemoteAddr))
	http.Redirect(w, r, next, http.StatusSeeOther)
}

// logout ends the session.
func (c *Console) logout(w http.ResponseWriter, r *http.Request, sess *consoleSession) {
	c.sessions.end(sess.id)
	http.SetCookie(w, &http.Cookie{Name: consoleCookie, Value: "", Path: Path, HttpOnly: true,
		Secure: c.cfg.HTTPS, SameSite: http.SameSiteStrictMode, MaxAge: -1})
	http.Redirect(w, r, Path+"login", http.StatusSeeOther)
}

// safeNext is next when it is a path of the console, else the queue: a
// login never redirects elsewhere.
func safeNext(next string) string {
	if strings.HasPrefix(next, Path) && !strings.ContainsAny(next, "\\\r\n") && !strings.HasPrefix(next, Path+"/") {
		return next
	}
	return Path
}

// pageData is what every page's layout shows.
type pageData struct {
	Title   string
	Nav     string      // the nav entry to mark current
	Op      *auth.Token // nil on the login page
	CSRF    string
	Asset   string // the assets' URL prefix
	Flashes []flash
	Live    string // queue or record: the page follows the ledger
	Since   string // the hub position the page was read at
	Key     string // the record page's key
	Rev     uint64 // the record page's revision
	Data    any
}

// render writes page name with data.
func (c *Console) render(w http.ResponseWriter, r *http.Request, sess *consoleSession, status int, name string, data any) {
	c.renderPage(w, r, sess, status, pageData{Title: titleOf(name), Nav: name, Data: data})
}

func (c *Console) renderPage(w http.ResponseWriter, r *http.Request, sess *consoleSession, status int, p pageData) {
	t := c.pages[p.Nav]
	if t == nil {
		t = c.pages["error"]
	}
	p.Asset = Path + "assets/" + c.version
	if sess != nil {
		p.Op, p.CSRF = sess.tok, sess.csrf
		// A live page redrawing itself in the background leaves the
		// messages for the page the browser shows next.
		if r.Header.Get(liveFetchHeader) == "" {
			p.Flashes = c.sessions.takeFlashes(sess)
		}
	}
	var buf bytes.Buffer
	if err := t.ExecuteTemplate(&buf, "layout", p); err != nil {
		c.log.Error("console page", zap.String("page", p.Nav), zap.Error(err))
		http.Error(w, "the page could not be drawn: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

// fragment writes the fragment template name with data.
func (c *Console) fragment(w http.ResponseWriter, name string, data any) {
	var buf bytes.Buffer
	if err := c.frags.ExecuteTemplate(&buf, name, data); err != nil {
		c.log.Error("console fragment", zap.String("fragment", name), zap.Error(err))
		http.Error(w, "the fragment could not be drawn: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	_, _ = w.Write(buf.Bytes())
}

// errorData is the error page's.
type errorData struct {
	Heading, Text string
}

// errorPage answers with status and an HTML page saying what went wrong.
func (c *Console) errorPage(w http.ResponseWriter, r *http.Request, sess *consoleSession, status int, heading, text string) {
	c.renderPage(w, r, sess, status, pageData{Title: heading, Nav: "error", Data: errorData{Heading: heading, Text: text}})
}

func titleOf(name string) string {
	switch name {
	case "login":
		return "Log in"
	case "queue":
		return "Queue"
	case "search":
		return "Search"
	case "record":
		return "Operation"
	case "deadletters":
		return "Dead letters"
	case "deadletter":
		return "Dead letter"
	case "overview":
		return "Overview"
	}
	return "idemgate"
}

// consoleFuncs are the templates' helpers.
var consoleFuncs = template.FuncMap{
	"ago":         ago,
	"rfc3339":     func(t time.Time) string { return t.UTC().Format(time.RFC3339) },
	"unixMilli":   func(t time.Time) int64 { return t.UnixMilli() },
	"rfc3339nano": func(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) },
	"stamp":       func(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05.000Z") },
	"statusLabel": StatusLabel,
	"short": func(s string, n int) string {
		if len(s) <= n {
			return s
		}
		return s[:n] + "…"
	},
	"path":        url.PathEscape,
	"num":         func(f float64) string { return strconv.FormatFloat(f, 'f', -1, 64) },
	"fixed":       func(f float64) string { return strconv.FormatFloat(f, 'f', 1, 64) },
	"duration":    func(d time.Duration) string { return strings.TrimSuffix(strings.TrimSuffix(d.String(), "0s"), "0m") },
	"future":      func(t time.Time) bool { return t.After(time.Now()) },
	"verdictText": verdictText,
}

// verdictText is a probe's verdict for a person.
func verdictText(v string) string {
	switch v {
	case "done":
		return "done downstream"
	case "not_done":
		return "not done downstream"
	case "unknown":
		return "unknown"
	}
	return v
}

// ago is how long before now t was, coarsely: 45s, 12m, 3h 5m, 2d 4h.
func ago(t time.Time) string {
	if t.IsZero() {
		return "—"
	}
	d := time.Since(t)
	switch {
	case d < 0:
		return "now"
	case d < time.Minute:
		return strconv.Itoa(int(d/time.Second)) + "s"
	case d < time.Hour:
		return strconv.Itoa(int(d/time.Minute)) + "m"
	case d < 24*time.Hour:
		return fmt.Sprintf("%dh %dm", int(d/time.Hour), int(d%time.Hour/time.Minute))
	}
	return fmt.Sprintf("%dd %dh", int(d/(24*time.Hour)), int(d%(24*time.Hour)/time.Hour))
}
