package mcpgate

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats.go"
	"go.uber.org/zap"

	"github.com/idemgate/idemgate/pkg/client"
)

// Version is the gate's MCP server version.
const Version = "0.1.0"

// StatusTool is the name of the gate's own tool that reports an operation's
// state by its reference (its key).
const StatusTool = "idemgate_status"

// Gate is an MCP server whose tools are the workers' tools: each tools/call
// is an intent submitted through the ledger. It is safe for concurrent use.
type Gate struct {
	cfg    Config
	nc     *nats.Conn
	server *mcp.Server
	door   *door

	cl  *client.Client // its catalogue is the one the gate serves
	log *zap.Logger

	mu     sync.Mutex
	served map[string]*served
}

// New checks cfg and returns a gate calling idemgate through cl (on nc,
// whose state HealthPath reports), logging to log (nil: no logging), the
// MCP SDK's lines included. It serves only idemgate_status until Refresh
// has read the workers' catalogue; Run keeps the tools current.
func New(nc *nats.Conn, cl *client.Client, log *zap.Logger, cfg Config) (*Gate, error) {
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if nc == nil || cl == nil {
		return nil, errors.New("mcpgate: no NATS connection or client")
	}
	if log == nil {
		log = zap.NewNop()
	}
	g := &Gate{cfg: cfg, nc: nc, cl: cl, log: log, served: map[string]*served{}}
	g.server = mcp.NewServer(&mcp.Implementation{Name: "idemgate", Title: "idemgate", Version: Version}, &mcp.ServerOptions{
		Instructions: instructions,
		Logger:       sdkLogger(log),
		Capabilities: &mcp.ServerCapabilities{Tools: &mcp.ToolCapabilities{ListChanged: true}},
	})
	g.addStatusTool()
	g.door = newDoor(g)
	return g, nil
}

// instructions are the server's instructions to clients.
const instructions = "Tools here change the world at most once per operation: idemgate derives each call's " +
	"idempotency key from the tool's arguments and the session, so a call repeated after a timeout, a " +
	"reconnect or a lost answer is answered from the ledger instead of running again. Never invent keys or " +
	"request ids. A call may return awaiting_approval or uncertain with an operation reference: check it " +
	"later with " + StatusTool + " instead of calling the tool again."

// Server is the gate's MCP server, to run on any transport (for stdio:
// Server().Run(ctx, &mcp.StdioTransport{})).
func (g *Gate) Server() *mcp.Server { return g.server }

// HTTPHandler serves the MCP streamable HTTP transport at HTTPPath
// (stateless for protocol 2026-07-28 and later; with sessions, as they have
// them, for clients of 2025-11-25 and earlier), behind Config.Tokens and the
// session and call limits; the protected resource metadata at
// MetadataPath; and HealthPath.
func (g *Gate) HTTPHandler() http.Handler { return g.door.handler() }

// lookup returns the tool named name as currently served.
func (g *Gate) lookup(name string) (*served, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	s, ok := g.served[name]
	return s, ok
}

// Tools returns the names of the catalogue's tools the gate serves, sorted
// (idemgate_status not included).
func (g *Gate) Tools() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Sorted(maps.Keys(g.served))
}

// Refresh reads the workers' tool catalogue and serves what it lists: new
// and changed tools are added, tools it no longer lists are withdrawn, and
// connected clients are sent notifications/tools/list_changed.
func (g *Gate) Refresh(ctx context.Context) error {
	cat, err := g.cl.Catalog(ctx, 0) // the client's catalogue, its key specs with it
	if err != nil {
		return fmt.Errorf("mcpgate: %w", err)
	}
	next := map[string]*served{}
	for _, info := range cat.Tools {
		if g.cfg.Upstream != "" && info.Upstream != g.cfg.Upstream {
			continue // proxy mode: another upstream's, or no upstream's
		}
		if info.Name == StatusTool {
			g.log.Warn("a catalogue tool has the status tool's name; not served", zap.String("tool", info.Name))
			continue
		}
		s, err := newServed(info)
		if err != nil {
			g.log.Warn("tool not served", zap.String("tool", info.Name), zap.Error(err))
			continue
		}
		next[info.Name] = s
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	var gone []string
	changed := false
	for name, old := range g.served {
		if n, ok := next[name]; !ok {
			gone = append(gone, name)
		} else if !n.same(old) {
			changed = true
		}
	}
	for name, s := range next {
		old, ok := g.served[name]
		if ok && s.same(old) {
			next[name] = old
			continue
		}
		changed = true
		if err := g.addTool(s); err != nil {
			g.log.Warn("tool not served", zap.String("tool", name), zap.Error(err))
			delete(next, name)
		}
	}
	if len(gone) > 0 {
		g.server.RemoveTools(gone...)
	}
	if changed || len(gone) > 0 {
		g.log.Info("tools from the catalogue", zap.Int("tools", len(next)), zap.Int("withdrawn", len(gone)))
	}
	g.served = next
	if g.cfg.Upstream != "" && len(next) == 0 {
		g.log.Warn("the workers serve no tool of the upstream: list it under mcp_upstreams in their tools file", zap.String("upstream", g.cfg.Upstream))
	}
	return nil
}

// addTool adds s to the MCP server; the SDK panics on a schema it cannot
// serve, which is an error here.
func (g *Gate) addTool(s *served) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%v", r)
		}
	}()
	g.server.AddTool(s.tool, g.handler(s.info.Name))
	return nil
}

// Run reads the catalogue every Config.Refresh until ctx is done. A failed read is
// logged and tried again at the next tick.
func (g *Gate) Run(ctx context.Context) error {
	tick := time.NewTicker(g.cfg.Refresh)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
		if err := g.Refresh(ctx); err != nil && ctx.Err() == nil {
			g.log.Warn("read the tool catalogue", zap.Error(err))
		}
	}
}

// marshal is json.Marshal for values that always encode.
func marshal(v any) json.RawMessage {
	data, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("mcpgate: encode %T: %v", v, err))
	}
	return data
}
