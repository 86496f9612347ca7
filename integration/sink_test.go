package integration

import (
	"bufio"
	"bytes"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// realSink is cmd/sink, the demo webhook receiver, logging every request it
// performs with its Idempotency-Key.
type realSink struct {
	url string
	log string
}

// startRealSink runs cmd/sink on a free port (with extra flags) and waits
// for its ready file.
func startRealSink(t *testing.T, extra ...string) *realSink {
	t.Helper()
	dir := t.TempDir()
	s := &realSink{log: filepath.Join(dir, "sink.jsonl")}
	ready := filepath.Join(dir, "ready")
	p := launchProc(t, "sink", "sink", append([]string{"--listen", "127.0.0.1:0", "--log", s.log, "--ready-file", ready}, extra...), nil)
	var addr []byte
	require.Eventually(t, func() bool {
		select {
		case <-p.done:
			t.Fatalf("sink exited: %v\n%s", p.err, p.log.String())
		default:
		}
		addr, _ = os.ReadFile(ready)
		return len(addr) > 0
	}, 20*time.Second, 10*time.Millisecond, "the sink writes its ready file")
	s.url = "http://" + strings.TrimSpace(string(addr))
	return s
}

// firings counts the requests of key the sink performed (answered 200).
func (s *realSink) firings(t *testing.T, key string) int {
	t.Helper()
	data, err := os.ReadFile(s.log)
	require.NoError(t, err)
	n := 0
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var e struct {
			Key    string `json:"key"`
			Status int    `json:"status"`
		}
		require.NoError(t, json.Unmarshal(sc.Bytes(), &e), sc.Text())
		if e.Key == key && e.Status == http.StatusOK {
			n++
		}
	}
	return n
}

// requests is how many requests reached the sink.
func (s *realSink) requests(t *testing.T) int {
	t.Helper()
	resp, err := http.Get(s.url + "/stats")
	require.NoError(t, err)
	defer resp.Body.Close()
	var st map[string]int
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&st))
	return st["requests"]
}
