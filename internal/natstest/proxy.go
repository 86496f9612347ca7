package natstest

import (
	"net"
	"sync"
	"testing"
)

// Proxy is a TCP relay between clients and a server that can withhold the
// server's replies, to reproduce what a client sees when an acknowledgement is
// late or lost: Hold stops relaying server-to-client bytes (the server still
// gets everything and acts on it), Release lets the held bytes through, and
// Cut closes every connection, dropping what was held, so clients reconnect.
//
//	p := natstest.NewProxy(t, s.Addr().String())
//	nc := natstest.Connect(t, p.URL())
type Proxy struct {
	ln     net.Listener
	target string

	mu     sync.Mutex
	held   bool
	resume chan struct{} // closed by Release
	conns  map[net.Conn]struct{}
	wg     sync.WaitGroup
}

// NewProxy relays connections on a new loopback port to target (host:port)
// until the test ends.
func NewProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("natstest: proxy listen: %v", err)
	}
	p := &Proxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	p.wg.Go(p.accept)
	t.Cleanup(func() {
		_ = ln.Close()
		p.Cut()
		p.Release()
		p.wg.Wait()
	})
	return p
}

// URL is the client URL of the proxy.
func (p *Proxy) URL() string { return "nats://" + p.ln.Addr().String() }

// Hold withholds the server's bytes from every client until Release or Cut.
func (p *Proxy) Hold() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.held {
		p.held, p.resume = true, make(chan struct{})
	}
}

// Release relays the held bytes and everything after them.
func (p *Proxy) Release() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.held {
		p.held = false
		close(p.resume)
	}
}

// Cut closes every relayed connection (held bytes are lost) and stops
// holding; clients that reconnect get fresh connections.
func (p *Proxy) Cut() {
	p.mu.Lock()
	for c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	p.Release()
}

func (p *Proxy) accept() {
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		server, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = client.Close()
			continue
		}
		p.mu.Lock()
		p.conns[client], p.conns[server] = struct{}{}, struct{}{}
		p.mu.Unlock()
		p.wg.Go(func() { p.relay(server, client, false) })
		p.wg.Go(func() { p.relay(client, server, true) })
	}
}

// relay copies src to dst; a reply relay waits while the proxy holds. Either
// side's end closes both.
func (p *Proxy) relay(dst, src net.Conn, reply bool) {
	defer func() {
		p.mu.Lock()
		delete(p.conns, dst)
		delete(p.conns, src)
		p.mu.Unlock()
		_ = dst.Close()
		_ = src.Close()
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && reply {
			p.mu.Lock()
			held, resume := p.held, p.resume
			p.mu.Unlock()
			if held {
				<-resume
			}
		}
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return // EOF or a closed connection: the other side is closed too
		}
	}
}
