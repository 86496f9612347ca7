// Command sink is a webhook receiver for demos and fault runs: it answers every
// POST, logs each request as a JSON line with its Idempotency-Key and the
// firing's Idem-Holder and Idem-Attempt, and can fail or stall on purpose.
// GET /stats reports what it saw.
//
// GET /probe?key=KEY answers whether it performed the request with that
// Idempotency-Key: 200 with the body it answered then, or 404 — a
// reconciliation probe's downstream (docs/tools.md, probe). A probe is not a
// request: it is neither logged nor counted in requests. For tests, mode=unknown
// answers 503 and mode=hang stalls until the caller goes away.
//
// Faults: --fail-rate answers a fraction of requests 503; --hold stalls every
// request; --hang-rate stalls a fraction of requests for --hang (long enough
// to outlive a worker's lease) before answering them normally. A request whose
// caller went away while it was stalled is logged with status 499 and counts
// as not performed. --fail-first answers the first request of each key with
// the status it names (422: a permanent failure) and later ones normally.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"syscall"
	"time"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "sink:", err)
		os.Exit(1)
	}
}

type entry struct {
	Time    time.Time       `json:"time"`     // when it was answered
	Arrived time.Time       `json:"received"` // when it arrived
	Path    string          `json:"path"`
	Key     string          `json:"key"`
	Tool    string          `json:"tool,omitempty"`
	Holder  string          `json:"holder,omitempty"`  // Idem-Holder: the worker that fired
	Attempt int             `json:"attempt,omitempty"` // Idem-Attempt: the ledger's claim number
	Status  int             `json:"status"`
	Repeat  bool            `json:"repeat"`
	Hung    bool            `json:"hung,omitempty"`
	Payload json.RawMessage `json:"payload,omitempty"`
}

type sink struct {
	failRate float64
	hold     time.Duration
	hangRate float64
	hang     time.Duration
	// failFirst is the status of each key's first request; 0: none.
	failFirst int
	tried     map[string]bool // keys whose first request failFirst answered
	mu        sync.Mutex
	log       *json.Encoder
	seen      map[string]int    // key → successful requests
	answers   map[string][]byte // key → the body of its first successful answer
	requests  int
	probes    int
}

func run() error {
	listen := flag.String("listen", "127.0.0.1:8787", "address to listen on")
	logPath := flag.String("log", "", "append a JSON line per request to this file (default stdout)")
	failRate := flag.Float64("fail-rate", 0, "fraction of requests answered 503 (0-1)")
	hold := flag.Duration("hold", 0, "stall every request this long before answering")
	hangRate := flag.Float64("hang-rate", 0, "fraction of requests stalled for --hang before answering (0-1)")
	hang := flag.Duration("hang", 5*time.Second, "how long a request picked by --hang-rate stalls")
	readyFile := flag.String("ready-file", "", "once listening, write the address to this file (for scripts that wait for the sink)")
	failFirst := flag.Int("fail-first", 0, "answer the first request of each key with this status (e.g. 422, a permanent failure), later ones normally")
	flag.Parse()
	if *failFirst != 0 && (*failFirst < 400 || *failFirst > 599) {
		return errors.New("--fail-first must be an error status, 400-599 (e.g. 422)")
	}
	if *failRate < 0 || *failRate > 1 {
		return errors.New("--fail-rate must be between 0 and 1")
	}
	if *hangRate < 0 || *hangRate > 1 {
		return errors.New("--hang-rate must be between 0 and 1")
	}
	if *hang < 0 {
		return errors.New("--hang must not be negative")
	}
	out := io.Writer(os.Stdout)
	if *logPath != "" {
		f, err := os.OpenFile(*logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
		if err != nil {
			return err
		}
		defer f.Close()
		out = f
	}
	s := &sink{failRate: *failRate, hold: *hold, hangRate: *hangRate, hang: *hang, log: json.NewEncoder(out), seen: map[string]int{}, answers: map[string][]byte{},
		failFirst: *failFirst, tried: map[string]bool{}}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /stats", s.stats)
	mux.HandleFunc("GET /probe", s.probe)
	mux.HandleFunc("/", s.receive)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	// Bind first: "listening" is printed only once it is true, and a taken
	// port is reported at once.
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		if errors.Is(err, syscall.EADDRINUSE) {
			return fmt.Errorf("%w (is another sink running? stop it, or listen elsewhere with --listen, e.g. --listen 127.0.0.1:8788; make run takes SINK_PORT=8788)", err)
		}
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	if *readyFile != "" {
		if err := writeReady(*readyFile, ln.Addr().String()); err != nil {
			_ = ln.Close()
			return err
		}
	}
	fmt.Fprintf(os.Stderr, "sink listening on http://%s\n", ln.Addr())
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// writeReady writes addr to path atomically: a reader sees all of it or no
// file.
func writeReady(path, addr string) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(addr+"\n"), 0o644); err != nil {
		return fmt.Errorf("--ready-file: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("--ready-file: %w", err)
	}
	return nil
}

func (s *sink) receive(w http.ResponseWriter, r *http.Request) {
	arrived := time.Now().UTC()
	body, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	key := r.Header.Get("Idempotency-Key")
	stall := s.hold
	hung := s.hangRate > 0 && rand.Float64() < s.hangRate
	if hung {
		stall += s.hang
	}
	if stall > 0 {
		t := time.NewTimer(stall)
		select {
		case <-t.C:
		case <-r.Context().Done():
			t.Stop()
			// The caller gave up: the request was not performed.
			e := requestEntry(r, arrived, key)
			e.Time, e.Status, e.Hung = time.Now().UTC(), statusClientClosed, hung
			s.record(e, body)
			return
		}
	}
	status := http.StatusOK
	if s.failRate > 0 && rand.Float64() < s.failRate {
		status = http.StatusServiceUnavailable
	}
	s.mu.Lock()
	if s.failFirst != 0 && !s.tried[key] {
		s.tried[key] = true
		status = s.failFirst
	}
	s.requests++
	repeat := s.seen[key] > 0
	if status == http.StatusOK {
		s.seen[key]++
	}
	n := s.seen[key]
	e := requestEntry(r, arrived, key)
	e.Time, e.Status, e.Repeat, e.Hung = time.Now().UTC(), status, repeat, hung
	if json.Valid(body) {
		e.Payload = body
	}
	_ = s.log.Encode(e)
	var answer []byte
	if status == http.StatusOK {
		answer, _ = json.Marshal(map[string]any{"accepted": true, "path": r.URL.Path, "key": key, "deliveries": n})
		if _, ok := s.answers[key]; !ok && s.answers != nil {
			s.answers[key] = answer
		}
	}
	s.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(answer)
}

// probe answers whether the request with the key (the query's key, else
// the Idempotency-Key header) was performed: 200 with its first answer, or
// 404. mode=unknown answers 503, mode=hang never answers.
func (s *sink) probe(w http.ResponseWriter, r *http.Request) {
	key := r.URL.Query().Get("key")
	if key == "" {
		key = r.Header.Get("Idempotency-Key")
	}
	s.mu.Lock()
	s.probes++
	answer, done := s.answers[key]
	s.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	switch r.URL.Query().Get("mode") {
	case "hang":
		<-r.Context().Done()
		return
	case "unknown":
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write([]byte(`{"error":"cannot tell now"}`))
		return
	}
	if !done {
		w.WriteHeader(http.StatusNotFound)
		_ = json.NewEncoder(w).Encode(map[string]any{"found": false, "key": key})
		return
	}
	_, _ = w.Write(answer)
}

// requestEntry is the log entry of r, without its outcome.
func requestEntry(r *http.Request, arrived time.Time, key string) entry {
	attempt, _ := strconv.Atoi(r.Header.Get("Idem-Attempt")) // 0 when absent or not a number
	return entry{Arrived: arrived, Path: r.URL.Path, Key: key, Tool: r.Header.Get("Idem-Tool"),
		Holder: r.Header.Get("Idem-Holder"), Attempt: attempt}
}

// statusClientClosed is logged for a stalled request whose caller went away.
const statusClientClosed = 499

// record logs a request that was not answered.
func (s *sink) record(e entry, body []byte) {
	if json.Valid(body) {
		e.Payload = body
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.requests++
	_ = s.log.Encode(e)
}

func (s *sink) stats(w http.ResponseWriter, _ *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	repeated := 0
	for _, n := range s.seen {
		if n > 1 {
			repeated++
		}
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]int{"requests": s.requests, "keys": len(s.seen), "repeated_keys": repeated, "probes": s.probes})
}
