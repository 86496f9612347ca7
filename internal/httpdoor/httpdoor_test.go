package httpdoor_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/internal/auth"
	"github.com/idemgate/idemgate/internal/httpdoor"
	"github.com/idemgate/idemgate/internal/httpdoor/httpdoortest"
)

// A door made of the package's parts answers every fault as the table
// says, the table both front doors' tests hold them to.
func TestFaultsAreAnsweredAsTheTableSays(t *testing.T) {
	t.Parallel()
	secret, line, err := auth.NewToken(auth.RoleAgent, "team-a", "agent")
	require.NoError(t, err)
	tokens, err := auth.ParseTokens(strings.NewReader(line))
	require.NoError(t, err)
	for _, metadata := range []bool{false, true} {
		b := httpdoor.Bearer{Tokens: tokens}
		if metadata {
			b.Metadata = func(r *http.Request) string { return "http://" + r.Host + "/.well-known/oauth-protected-resource/x" }
		}
		mux := http.NewServeMux()
		mux.HandleFunc("POST /x", func(w http.ResponseWriter, r *http.Request) {
			if _, ok := b.Authenticate(w, r); !ok {
				return
			}
			if _, ok := httpdoor.ReadBody(w, r, 16, time.Minute); !ok {
				return
			}
			w.WriteHeader(http.StatusNoContent)
		})
		mux.HandleFunc("GET /admin", func(w http.ResponseWriter, r *http.Request) {
			if tok, ok := b.Authenticate(w, r); ok {
				b.Forbid(w, r, "%s is an agent's token", tok.Name)
			}
		})
		httpdoortest.Check(t, httpdoortest.Door{
			Handler: mux, Method: http.MethodPost, Path: "/x", Token: secret, MaxBody: 16, Metadata: metadata,
			Forbidden: func() *http.Request { return httptest.NewRequest(http.MethodGet, "/admin", nil) },
		})
	}
}

func TestChallengeQuotes(t *testing.T) {
	t.Parallel()
	_, line, err := auth.NewToken(auth.RoleAgent, "team-a", "agent")
	require.NoError(t, err)
	tokens, err := auth.ParseTokens(strings.NewReader(line))
	require.NoError(t, err)
	b := httpdoor.Bearer{Tokens: tokens, Metadata: func(*http.Request) string { return `http://h/"x"` }}
	rec := httptest.NewRecorder()
	b.Forbid(rec, httptest.NewRequest(http.MethodGet, "/", nil), `a "quoted" \ detail`)
	require.Equal(t, `Bearer realm="idemgate", resource_metadata="http://h/\"x\"", error="insufficient_scope", error_description="a \"quoted\" \\ detail"`,
		rec.Header().Get("WWW-Authenticate"))
}

// Serve drains a request in progress at shutdown, then returns nil.
func TestServeDrainsARequestInProgress(t *testing.T) {
	t.Parallel()
	started, release := make(chan struct{}), make(chan struct{})
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		close(started)
		<-release
		_, _ = io.WriteString(w, "done")
	})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- httpdoor.Serve(ctx, srv, ln, time.Minute) }()
	answered := make(chan string, 1)
	go func() {
		resp, err := http.Get("http://" + ln.Addr().String())
		if err != nil {
			answered <- err.Error()
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		answered <- string(b)
	}()
	<-started
	cancel()
	// A new connection is refused once shutdown began; poll until it is.
	for {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			break
		}
		_ = c.Close()
		time.Sleep(time.Millisecond)
	}
	close(release)
	require.Equal(t, "done", <-answered)
	require.NoError(t, <-served)
}

// Serve returns the error that ended serving early.
func TestServeReturnsAnEarlyError(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	require.NoError(t, ln.Close())
	err = httpdoor.Serve(context.Background(), &http.Server{}, ln, time.Second)
	require.ErrorIs(t, err, net.ErrClosed)
	require.False(t, errors.Is(err, http.ErrServerClosed))
}
