package mcpgate

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.uber.org/zap"

	"github.com/idemgate/idemgate/internal/httpdoor"
	"github.com/idemgate/idemgate/pkg/retry"
)

// HTTPPath is where ServeHTTP serves the streamable HTTP transport.
const HTTPPath = "/mcp"

// Load reads the catalogue, trying again until it succeeds or ctx ends: the
// gate may start before the workers. It returns the last error when ctx
// ends first; the gate still serves (Run keeps trying).
func (g *Gate) Load(ctx context.Context) error {
	pauses := retry.Doubling(ctx, 100*time.Millisecond, 2*time.Second)
	for {
		err := g.Refresh(ctx)
		if err == nil {
			return nil
		}
		g.log.Info("waiting for the workers' tool catalogue", zap.Error(err))
		if !retry.Wait(ctx, pauses) {
			return err
		}
	}
}

// ServeStdio serves one client on the process's stdin and stdout until the
// client closes stdin or ctx ends, keeping the tools current meanwhile.
func (g *Gate) ServeStdio(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { _ = g.Run(ctx) }()
	out := &lockedWriter{w: os.Stdout}
	err := g.server.Run(ctx, &mcp.IOTransport{Reader: wellFormed(os.Stdin, out, mcp.DefaultMaxLineLength), Writer: out})
	if ctx.Err() != nil || errors.Is(err, mcp.ErrConnectionClosed) {
		return nil
	}
	return err
}

// ServeHTTP serves HTTPHandler on addr until ctx ends, then shuts down
// (calls in flight get up to drain to finish; their operations go on
// regardless) and closes every session. ready, when not nil, receives the
// address listened on. An address that is not loopback needs Config.Tokens
// (CheckListen).
func (g *Gate) ServeHTTP(ctx context.Context, addr string, drain time.Duration, ready func(net.Addr)) error {
	if err := CheckListen(addr, g.cfg.Tokens); err != nil {
		return err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("mcpgate: listen %s: %w", addr, err)
	}
	srv := &http.Server{Handler: g.HTTPHandler(), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute}
	defer g.door.close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { _ = g.Run(ctx) }()
	if ready != nil {
		ready(ln.Addr())
	}
	if err := httpdoor.Serve(ctx, srv, ln, drain); err != nil {
		return fmt.Errorf("mcpgate: %w", err)
	}
	return nil
}

// wellFormed passes on the lines of in that are JSON-RPC messages (or
// batches of them) and answers every other line on out with a JSON-RPC
// error: the SDK's stdio reader ends the session at the first message it
// cannot decode, and one bad line must not cost a client its session. Lines
// longer than max are answered the same way.
func wellFormed(in io.Reader, out io.Writer, max int) io.ReadCloser {
	pr, pw := io.Pipe()
	go func() {
		r := bufio.NewReaderSize(in, 64<<10)
		for {
			line, tooLong, err := readLine(r, max)
			line = bytes.TrimSpace(line)
			switch {
			case tooLong:
				_, _ = out.Write(rpcError(nil, jsonrpc.CodeParseError, fmt.Sprintf("Parse error: the line is longer than %d bytes", max)))
			case len(line) == 0:
			default:
				if id, code, problem := check(line); problem != "" {
					_, _ = out.Write(rpcError(id, code, problem))
				} else if _, werr := pw.Write(append(line, '\n')); werr != nil {
					return
				}
			}
			if err != nil {
				_ = pw.CloseWithError(err)
				return
			}
		}
	}()
	return pr
}

// readLine reads one line of at most max bytes; a longer one is read to its
// end and reported too long.
func readLine(r *bufio.Reader, max int) (line []byte, tooLong bool, err error) {
	for {
		chunk, err := r.ReadSlice('\n')
		if len(line)+len(chunk) > max {
			tooLong, line = true, nil
		} else if !tooLong {
			line = append(line, chunk...)
		}
		if !errors.Is(err, bufio.ErrBufferFull) {
			return line, tooLong, err
		}
	}
}

// check decodes line as a JSON-RPC message or batch; for a line that is
// not one it returns the error to answer with (and the id to answer, when
// the line has a usable one).
func check(line []byte) (id any, code int64, problem string) {
	if !json.Valid(line) {
		return nil, jsonrpc.CodeParseError, "Parse error: the line is not JSON"
	}
	msgs := []json.RawMessage{line}
	if line[0] == '[' {
		if err := json.Unmarshal(line, &msgs); err != nil || len(msgs) == 0 {
			return nil, jsonrpc.CodeInvalidRequest, "Invalid Request: an empty or malformed batch"
		}
	}
	for _, m := range msgs {
		if _, err := jsonrpc.DecodeMessage(m); err != nil {
			var probe struct {
				ID any `json:"id"`
			}
			_ = json.Unmarshal(m, &probe)
			switch probe.ID.(type) {
			case string, float64:
			default:
				probe.ID = nil
			}
			return probe.ID, jsonrpc.CodeInvalidRequest, "Invalid Request: " + err.Error()
		}
	}
	return nil, 0, ""
}

// rpcError is a JSON-RPC error response line.
func rpcError(id any, code int64, message string) []byte {
	return append(marshal(map[string]any{"jsonrpc": "2.0", "id": id, "error": map[string]any{"code": code, "message": message}}), '\n')
}

// lockedWriter serialises whole writes from the SDK and from wellFormed.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// Close is a no-op: the process's stdout outlives the session.
func (l *lockedWriter) Close() error { return nil }
