package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// proc is one child process: started, SIGKILLed and restarted with the same
// command line, its output appended to one log file across restarts.
type proc struct {
	name string
	path string
	args []string
	log  string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

// start runs the process; it is an error to start a running one.
func (p *proc) start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil {
		select {
		case <-p.done:
		default:
			return fmt.Errorf("%s is already running", p.name)
		}
	}
	f, err := os.OpenFile(p.log, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(p.path, p.args...)
	cmd.Stdout, cmd.Stderr = f, f
	// Its own process group: a signal to the driver does not reach it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		f.Close()
		return fmt.Errorf("start %s: %w", p.name, err)
	}
	done := make(chan struct{})
	p.cmd, p.done = cmd, done
	go func() {
		err := cmd.Wait()
		f.Close()
		p.mu.Lock()
		p.err = err
		p.mu.Unlock()
		close(done)
	}()
	return nil
}

// running reports whether the process was started and has not exited.
func (p *proc) running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return false
	}
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// exited returns a channel closed when the current run of the process ends.
func (p *proc) exited() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.done
}

// signal sends sig to the running process and waits up to d for it to exit.
func (p *proc) signal(sig syscall.Signal, d time.Duration) error {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.mu.Unlock()
	if cmd == nil {
		return nil
	}
	select {
	case <-done:
		return nil
	default:
	}
	_ = cmd.Process.Signal(sig)
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
		return nil
	case <-t.C:
		_ = cmd.Process.Kill()
		<-done
		return fmt.Errorf("%s did not exit within %s of %s", p.name, d, sig)
	}
}

// kill ends the process with SIGKILL and waits for it.
func (p *proc) kill() { _ = p.signal(syscall.SIGKILL, 10*time.Second) }

// stop asks the process to exit with SIGTERM, and kills it after d.
func (p *proc) stop(d time.Duration) { _ = p.signal(syscall.SIGTERM, d) }

// freePorts returns n distinct free loopback TCP ports.
func freePorts(n int) ([]int, error) {
	ports := make([]int, 0, n)
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// natsNode is one nats-server process with JetStream.
type natsNode struct {
	*proc
	clientPort, httpPort int
	conf, store          string // its configuration file and store directory
}

func (n *natsNode) url() string { return fmt.Sprintf("nats://127.0.0.1:%d", n.clientPort) }

// ready waits until the node reports JetStream healthy (in a cluster: with a
// meta leader), or ctx or the deadline ends.
func (n *natsNode) ready(ctx context.Context, d time.Duration) error {
	return waitHTTP(ctx, fmt.Sprintf("http://127.0.0.1:%d/healthz", n.httpPort), n.proc, d)
}

// startJetStream writes the config files of one node (cluster false) or three
// clustered nodes and starts them.
func startJetStream(ctx context.Context, cfg config, dir string) ([]*natsNode, error) {
	n := 1
	if cfg.cluster {
		n = 3
	}
	ports, err := freePorts(3 * n)
	if err != nil {
		return nil, err
	}
	var routes []string
	for i := range n {
		routes = append(routes, fmt.Sprintf("nats-route://127.0.0.1:%d", ports[3*i+2]))
	}
	nodes := make([]*natsNode, n)
	for i := range nodes {
		name := fmt.Sprintf("n%d", i+1)
		store := filepath.Join(dir, name, "store")
		if err := os.MkdirAll(store, 0o755); err != nil {
			return nil, err
		}
		var b strings.Builder
		fmt.Fprintf(&b, "server_name: %s\nlisten: \"127.0.0.1:%d\"\nhttp: \"127.0.0.1:%d\"\n", name, ports[3*i], ports[3*i+1])
		fmt.Fprintf(&b, "jetstream {\n  store_dir: %q\n  sync_interval: %s\n}\n", store, cfg.sync)
		if cfg.cluster {
			fmt.Fprintf(&b, "cluster {\n  name: chaos\n  listen: \"127.0.0.1:%d\"\n  routes: [%s]\n}\n",
				ports[3*i+2], strings.Join(routes, ", "))
		}
		conf := filepath.Join(dir, name, "nats.conf")
		if err := os.WriteFile(conf, []byte(b.String()), 0o644); err != nil {
			return nil, err
		}
		nodes[i] = &natsNode{
			proc:       &proc{name: name, path: cfg.natsServer, args: []string{"-c", conf}, log: filepath.Join(dir, name+".log")},
			clientPort: ports[3*i], httpPort: ports[3*i+1], conf: conf, store: store,
		}
		if err := nodes[i].start(); err != nil {
			return nil, err
		}
	}
	for _, node := range nodes {
		if err := node.ready(ctx, 60*time.Second); err != nil {
			return nodes, err
		}
	}
	return nodes, nil
}

// buildNATSServer builds the nats-server binary of the module's pinned
// version into dir.
func buildNATSServer(ctx context.Context, dir string) (string, error) {
	out := filepath.Join(dir, "nats-server")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", out, "github.com/nats-io/nats-server/v2")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("build nats-server (run from the module directory, or pass --nats-server): %w", err)
	}
	return out, nil
}

// supervisor keeps one worker running until ctx ends: whenever it exits it
// is started again after delay, as a new holder. Each start is its own
// process with its own holder name and log: w2.3 is the third start of
// worker w2, logging to w2.3.log. A run that ends without kill having been
// called for it is counted in crashes.
type supervisor struct {
	name  string                    // the worker, e.g. w2
	delay time.Duration             // before a restart
	spawn func(holder string) *proc // the process of one start, named holder
	// hold, when set, is read-locked around each restart: a power loss
	// holds it while the machine is down.
	hold *sync.RWMutex

	mu      sync.Mutex
	runs    []*proc // every start, the current one last
	killing bool
	crashes int
}

// holderName is the holder name of start n (1-based) of worker name.
func holderName(name string, n int) string { return fmt.Sprintf("%s.%d", name, n) }

func (s *supervisor) run(ctx context.Context) error {
	for ctx.Err() == nil {
		s.mu.Lock()
		p := s.spawn(holderName(s.name, len(s.runs)+1))
		s.runs = append(s.runs, p)
		s.killing = false
		s.mu.Unlock()
		if err := p.start(); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-p.exited():
		}
		s.mu.Lock()
		if !s.killing {
			s.crashes++
		}
		s.mu.Unlock()
		t := time.NewTimer(s.delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
		if s.hold != nil {
			s.hold.RLock()
			//lint:ignore SA2001 the lock is only waited for: until the machine is up
			s.hold.RUnlock()
		}
	}
	return nil
}

// current is the latest start, or nil before the first.
func (s *supervisor) current() *proc {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.runs) == 0 {
		return nil
	}
	return s.runs[len(s.runs)-1]
}

// kill SIGKILLs the running worker (the supervisor starts it again as a new
// holder) and returns the holder it killed; ok is false when none was
// running.
func (s *supervisor) kill() (holder string, ok bool) {
	s.mu.Lock()
	var p *proc
	if len(s.runs) > 0 {
		p = s.runs[len(s.runs)-1]
	}
	if p == nil || !p.running() {
		s.mu.Unlock()
		return "", false
	}
	s.killing = true
	s.mu.Unlock()
	p.kill()
	return p.name, true
}

// stop stops the running worker, if any, with SIGTERM.
func (s *supervisor) stop(d time.Duration) {
	if p := s.current(); p != nil {
		p.stop(d)
	}
}

// logs returns the log of every start, with its holder name.
func (s *supervisor) logs() []workerLog {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]workerLog, len(s.runs))
	for i, p := range s.runs {
		out[i] = workerLog{holder: p.name, path: p.log}
	}
	return out
}

// args returns the command line arguments of every start.
func (s *supervisor) args() [][]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([][]string, len(s.runs))
	for i, p := range s.runs {
		out[i] = p.args
	}
	return out
}

// unexpectedExits is how often the worker exited without being killed.
func (s *supervisor) unexpectedExits() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.crashes
}
