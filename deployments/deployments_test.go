package deployments_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/conf"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/idemgate/idemgate/internal/auth"
	"github.com/idemgate/idemgate/internal/envflag"
	"github.com/idemgate/idemgate/internal/logging"
	"github.com/idemgate/idemgate/internal/mcpgate"
	"github.com/idemgate/idemgate/internal/natsconn"
	"github.com/idemgate/idemgate/pkg/effects/toolsfile"
)

const (
	// maxIntentBytes is the worker's default --max-intent-bytes.
	maxIntentBytes = 256 << 10
	// defaultDrain is the worker's default --drain-timeout.
	defaultDrain = 30 * time.Second
	// flushAfterDrain is how long the worker flushes its last answers after
	// the drain (cmd/worker: nc.FlushTimeout).
	flushAfterDrain = 5 * time.Second
	// clusterSize is the number of node-N.conf files.
	clusterSize = 3
)

// clusterVars are the environment variables the cluster files need; they are
// documented in deployments/README.md and set in systemd/nats.env.
var clusterVars = []string{
	"IDEMGATE_NATS_PORT",
	"IDEMGATE_NATS_CLUSTER_PORT",
	"IDEMGATE_NATS_MONITOR_PORT",
	"IDEMGATE_NATS_STORE_DIR",
	"IDEMGATE_NATS_ROUTE_1",
	"IDEMGATE_NATS_ROUTE_2",
	"IDEMGATE_NATS_ROUTE_3",
}

// ---------------------------------------------------------------- nats-server

// clusterEnv is one node's environment for the cluster files: random client
// and monitoring ports, the given route port, a fresh store directory and
// routes to all three nodes on loopback.
func clusterEnv(t *testing.T, routePorts []int, node int) {
	t.Helper()
	t.Setenv("IDEMGATE_NATS_PORT", "-1")
	t.Setenv("IDEMGATE_NATS_MONITOR_PORT", "-1")
	t.Setenv("IDEMGATE_NATS_CLUSTER_PORT", strconv.Itoa(routePorts[node]))
	t.Setenv("IDEMGATE_NATS_STORE_DIR", t.TempDir())
	for i, p := range routePorts {
		t.Setenv(fmt.Sprintf("IDEMGATE_NATS_ROUTE_%d", i+1), fmt.Sprintf("nats://127.0.0.1:%d", p))
	}
}

// freePorts returns n TCP ports that were free a moment ago.
func freePorts(t *testing.T, n int) []int {
	t.Helper()
	ports := make([]int, n)
	for i := range ports {
		l, err := net.Listen("tcp", ":0")
		require.NoError(t, err)
		ports[i] = l.Addr().(*net.TCPAddr).Port
		defer func() { _ = l.Close() }()
	}
	return ports
}

func confFiles(t *testing.T) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir("nats", func(path string, d os.DirEntry, err error) error {
		if err == nil && d.IsDir() && path == filepath.Join("nats", "secure") {
			// Authenticated configs with secrets from the environment;
			// integration/security_test.go starts servers from them.
			return filepath.SkipDir
		}
		if err == nil && !d.IsDir() && strings.HasSuffix(path, ".conf") {
			files = append(files, path)
		}
		return err
	})
	require.NoError(t, err)
	require.NotEmpty(t, files)
	return files
}

func nodeFile(i int) string {
	return filepath.Join("nats", "cluster", fmt.Sprintf("node-%d.conf", i+1))
}

func TestNATSConfigsLoad(t *testing.T) {
	clusterEnv(t, freePorts(t, clusterSize), 0)
	for _, path := range confFiles(t) {
		t.Run(path, func(t *testing.T) {
			o, err := server.ProcessConfigFile(path)
			require.NoError(t, err)
			require.True(t, o.JetStream, "JetStream enabled")
			require.True(t, o.SyncAlways, "sync_interval: always (fsync before ack)")
			require.NotEmpty(t, o.StoreDir, "an explicit store_dir")
			require.NotZero(t, o.HTTPPort, "a monitoring port")
			require.GreaterOrEqual(t, int(o.MaxPayload), 2*maxIntentBytes,
				"max_payload leaves room for a 256 KiB intent or result plus headroom")
			require.Positive(t, o.LameDuckDuration)
			require.Positive(t, o.JetStreamMaxStore, "max_file_store bounds the disk")
		})
	}
}

func TestClusterNodeFiles(t *testing.T) {
	ports := freePorts(t, clusterSize)
	var routes []string
	names := map[string]bool{}
	for i := range clusterSize {
		clusterEnv(t, ports, i)
		o, err := server.ProcessConfigFile(nodeFile(i))
		require.NoError(t, err)
		require.Equal(t, fmt.Sprintf("idemgate-%d", i+1), o.ServerName)
		require.False(t, names[o.ServerName], "server names are unique")
		names[o.ServerName] = true
		require.Equal(t, "idemgate", o.Cluster.Name)
		require.Equal(t, ports[i], o.Cluster.Port)
		var got []string
		for _, u := range o.Routes {
			got = append(got, u.String())
		}
		require.Len(t, got, clusterSize, "routes to all three nodes, this one included")
		if routes == nil {
			routes = got
		}
		require.Equal(t, routes, got, "every node has the same route list")
	}
}

// TestClusterVariablesAreDocumented checks that the variables the cluster
// files reference are exactly clusterVars, that each is required (the server
// refuses to start without it), and that the README and nats.env name them.
func TestClusterVariablesAreDocumented(t *testing.T) {
	ref := regexp.MustCompile(`\$([A-Z][A-Z0-9_]*)`)
	found := map[string]bool{}
	for _, path := range confFiles(t) {
		for _, line := range readLines(t, path) {
			if i := strings.IndexByte(line, '#'); i >= 0 {
				line = line[:i]
			}
			for _, m := range ref.FindAllStringSubmatch(line, -1) {
				found[m[1]] = true
			}
		}
	}
	var got []string
	for v := range found {
		got = append(got, v)
	}
	slices.Sort(got)
	want := slices.Clone(clusterVars)
	slices.Sort(want)
	require.Equal(t, want, got, "variables referenced by deployments/nats/*.conf")

	readme := readFile(t, "README.md")
	env := parseEnvFile(t, filepath.Join("systemd", "nats.env"))
	for _, v := range clusterVars {
		require.Contains(t, readme, v, "README.md documents %s", v)
		require.NotEmpty(t, env[v], "systemd/nats.env sets %s", v)
	}

	ports := freePorts(t, clusterSize)
	for _, v := range clusterVars {
		t.Run(v, func(t *testing.T) {
			clusterEnv(t, ports, 0)
			require.NoError(t, os.Unsetenv(v)) // t.Setenv restores it
			_, err := server.ProcessConfigFile(nodeFile(0))
			require.Error(t, err)
			require.Contains(t, err.Error(), v)
		})
	}
}

// TestClusterFormsFromConfigFiles starts the three nodes from the real files
// in this process and checks that they form a JetStream cluster that keeps an
// R3 stream with every replica current.
func TestClusterFormsFromConfigFiles(t *testing.T) {
	ports := freePorts(t, clusterSize)
	servers := make([]*server.Server, clusterSize)
	for i := range clusterSize {
		clusterEnv(t, ports, i)
		o, err := server.ProcessConfigFile(nodeFile(i))
		require.NoError(t, err)
		o.NoSigs, o.NoLog = true, true
		s, err := server.NewServer(o)
		require.NoError(t, err)
		s.Start()
		t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
		require.True(t, s.ReadyForConnections(10*time.Second), "node %d accepts clients", i+1)
		servers[i] = s
	}

	urls := make([]string, len(servers))
	for i, s := range servers {
		urls[i] = s.ClientURL()
	}
	nc, err := nats.Connect(strings.Join(urls, ","))
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)

	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	cfg := jetstream.StreamConfig{
		Name:      "IDEM_INTENTS",
		Subjects:  []string{"idem.intents.>"},
		Retention: jetstream.WorkQueuePolicy,
		Storage:   jetstream.FileStorage,
		Replicas:  clusterSize,
	}
	// The meta leader is elected once the routes are up; until then the
	// create fails and is tried again.
	var stream jetstream.Stream
	poll(ctx, t, "an R3 stream is created", func() error {
		callCtx, callCancel := context.WithTimeout(ctx, time.Second)
		defer callCancel()
		stream, err = js.CreateStream(callCtx, cfg)
		return err
	})

	ack, err := js.Publish(ctx, "idem.intents.echo", []byte(`{"tool":"echo","args":{}}`))
	require.NoError(t, err)
	require.Equal(t, uint64(1), ack.Sequence)

	poll(ctx, t, "all three replicas are current", func() error {
		info, err := stream.Info(ctx)
		if err != nil {
			return err
		}
		if err := replicasCurrent(info, clusterSize); err != nil {
			return err
		}
		if info.State.Msgs != 1 {
			return fmt.Errorf("%d messages, want 1", info.State.Msgs)
		}
		return nil
	})
}

// poll calls f every 50ms until it returns nil, and fails the test with f's
// last error if ctx ends first.
func poll(ctx context.Context, t *testing.T, what string, f func() error) {
	t.Helper()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		err := f()
		if err == nil {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("waiting until %s: %v (last error: %v)", what, ctx.Err(), err)
		case <-tick.C:
		}
	}
}

func replicasCurrent(info *jetstream.StreamInfo, n int) error {
	c := info.Cluster
	if c == nil || c.Leader == "" {
		return errors.New("no stream leader")
	}
	if len(c.Replicas) != n-1 {
		return fmt.Errorf("leader %s and %d followers, want %d", c.Leader, len(c.Replicas), n-1)
	}
	for _, r := range c.Replicas {
		if !r.Current || r.Offline {
			return fmt.Errorf("replica %s: current %v, offline %v", r.Name, r.Current, r.Offline)
		}
	}
	return nil
}

// ---------------------------------------------------------------- systemd

type unit map[string]map[string][]string // section -> key -> values

func (u unit) get(section, key string) string {
	v := u[section][key]
	if len(v) == 0 {
		return ""
	}
	return v[len(v)-1]
}

func parseUnit(t *testing.T, path string) unit {
	t.Helper()
	u := unit{}
	section := ""
	for n, line := range readLines(t, path) {
		line = strings.TrimSpace(line)
		switch {
		case line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";"):
		case strings.HasPrefix(line, "[") && strings.HasSuffix(line, "]"):
			section = line[1 : len(line)-1]
			u[section] = map[string][]string{}
		default:
			k, v, ok := strings.Cut(line, "=")
			require.True(t, ok, "%s:%d: not key=value: %q", path, n+1, line)
			require.NotEmpty(t, section, "%s:%d: key outside a section", path, n+1)
			u[section][strings.TrimSpace(k)] = append(u[section][strings.TrimSpace(k)], strings.TrimSpace(v))
		}
	}
	return u
}

// parseTimespan reads a systemd time span in the forms used here: "45s",
// "1min 30s", or a bare number of seconds.
func parseTimespan(t *testing.T, s string) time.Duration {
	t.Helper()
	if n, err := strconv.Atoi(s); err == nil {
		return time.Duration(n) * time.Second
	}
	d, err := time.ParseDuration(strings.ReplaceAll(strings.ReplaceAll(s, "min", "m"), " ", ""))
	require.NoError(t, err, "time span %q", s)
	return d
}

func parseEnvFile(t *testing.T, path string) map[string]string {
	t.Helper()
	env := map[string]string{}
	for n, line := range readLines(t, path) {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		require.True(t, ok, "%s:%d: not KEY=value: %q", path, n+1, line)
		env[k] = v
	}
	return env
}

func TestSystemdWorkerUnit(t *testing.T) {
	u := parseUnit(t, filepath.Join("systemd", "idemgate-worker.service"))
	exec := u.get("Service", "ExecStart")
	require.NotEmpty(t, exec, "ExecStart")
	require.Contains(t, exec, "--tools /etc/idemgate/tools.yaml")
	require.Equal(t, "SIGTERM", u.get("Service", "KillSignal"), "SIGTERM drains the worker")
	require.Equal(t, "on-failure", u.get("Service", "Restart"))
	require.Equal(t, "/etc/idemgate/worker.env", u.get("Service", "EnvironmentFile"))
	require.NotEmpty(t, u.get("Service", "User"))
	for k, v := range map[string]string{"NoNewPrivileges": "yes", "ProtectSystem": "strict", "PrivateTmp": "yes", "ProtectHome": "yes"} {
		require.Equal(t, v, u.get("Service", k), k)
	}
	require.NotEmpty(t, u.get("Install", "WantedBy"))
	for _, k := range []string{"StartLimitIntervalSec", "StartLimitBurst"} {
		require.Empty(t, u.get("Service", k), "%s belongs in [Unit]", k)
	}

	env := parseEnvFile(t, filepath.Join("systemd", "worker.env"))
	drain := defaultDrain
	if v, ok := env["IDEMGATE_DRAIN_TIMEOUT"]; ok {
		var err error
		drain, err = time.ParseDuration(v)
		require.NoError(t, err)
	}
	stop := parseTimespan(t, u.get("Service", "TimeoutStopSec"))
	require.Greater(t, stop, drain+flushAfterDrain,
		"TimeoutStopSec %s must exceed the drain (%s) plus the final flush (%s)", stop, drain, flushAfterDrain)
	checkWorkerEnv(t, "systemd/worker.env", env)
}

func TestSystemdNATSUnit(t *testing.T) {
	u := parseUnit(t, filepath.Join("systemd", "nats-server@.service"))
	exec := u.get("Service", "ExecStart")
	require.Contains(t, exec, "/etc/nats/%i.conf")
	require.Equal(t, "SIGUSR2", u.get("Service", "KillSignal"), "stop in lame duck mode")

	clusterEnv(t, freePorts(t, clusterSize), 0)
	for _, path := range confFiles(t) {
		o, err := server.ProcessConfigFile(path)
		require.NoError(t, err)
		stop := parseTimespan(t, u.get("Service", "TimeoutStopSec"))
		require.Greater(t, stop, o.LameDuckGracePeriod+o.LameDuckDuration,
			"TimeoutStopSec must exceed %s's lame duck grace period plus duration", path)
	}
}

// workerFlags are the flag names cmd/worker defines, read from its source so
// a misspelt IDEMGATE_<FLAG> (which the worker would silently ignore) fails
// here.
func workerFlags(t *testing.T) map[string]bool {
	t.Helper()
	flags := flagsOf(t, "worker")
	require.True(t, flags["drain-timeout"] && flags["tools"] && flags["replicas"], "flags found: %v", flags)
	return flags
}

// flagsOf are the flag names cmd/<command> defines, read from its source,
// with the shared connection and log flags when it registers them (their
// deprecated names left out: a shipped file uses the current ones).
func flagsOf(t *testing.T, command string) map[string]bool {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("..", "cmd", command, "*.go"))
	require.NoError(t, err)
	re := regexp.MustCompile(`fs\.\w+\(\s*(?:&[\w.]+,\s*)?"([a-z][a-z0-9-]*)"`)
	flags := map[string]bool{}
	shared := flag.NewFlagSet(command, flag.ContinueOnError)
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		src := readFile(t, f)
		for _, m := range re.FindAllStringSubmatch(src, -1) {
			flags[m[1]] = true
		}
		if strings.Contains(src, "natsconn.Register(") && shared.Lookup("nats-url") == nil {
			natsconn.Register(shared, natsconn.Defaults{})
		}
		if strings.Contains(src, "logging.Register(") && shared.Lookup("log-level") == nil {
			logging.Register(shared, logging.Flags{})
		}
	}
	shared.VisitAll(func(f *flag.Flag) {
		if _, old := envflag.Deprecated(f); !old {
			flags[f.Name] = true
		}
	})
	require.GreaterOrEqual(t, len(flags), 10, "flags found in cmd/%s: %v", command, flags)
	return flags
}

func envName(flag string) string {
	return "IDEMGATE_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

func checkWorkerEnv(t *testing.T, where string, env map[string]string) {
	t.Helper()
	known := map[string]bool{"NATS_URL": true, "NATS_CREDS": true, natsconn.PasswordEnv: true}
	for f := range workerFlags(t) {
		known[envName(f)] = true
	}
	for k := range env {
		require.True(t, known[k], "%s: %s is not a worker setting", where, k)
	}
}

// ---------------------------------------------------------------- Kubernetes

type object struct {
	APIVersion string `yaml:"apiVersion"`
	Kind       string `yaml:"kind"`
	Metadata   struct {
		Name   string            `yaml:"name"`
		Labels map[string]string `yaml:"labels"`
	} `yaml:"metadata"`
	node *yaml.Node
	file string
}

type selector struct {
	MatchLabels map[string]string `yaml:"matchLabels"`
}

type envVar struct {
	Name      string `yaml:"name"`
	Value     string `yaml:"value"`
	ValueFrom *struct {
		SecretKeyRef *struct {
			Name string `yaml:"name"`
			Key  string `yaml:"key"`
		} `yaml:"secretKeyRef"`
		FieldRef any `yaml:"fieldRef"`
	} `yaml:"valueFrom"`
}

type deployment struct {
	Spec struct {
		Replicas *int     `yaml:"replicas"`
		Selector selector `yaml:"selector"`
		Template struct {
			Metadata struct {
				Labels map[string]string `yaml:"labels"`
			} `yaml:"metadata"`
			Spec struct {
				TerminationGracePeriodSeconds *int `yaml:"terminationGracePeriodSeconds"`
				SecurityContext               struct {
					RunAsNonRoot *bool `yaml:"runAsNonRoot"`
					RunAsUser    *int  `yaml:"runAsUser"`
				} `yaml:"securityContext"`
				Containers []struct {
					Name  string   `yaml:"name"`
					Image string   `yaml:"image"`
					Args  []string `yaml:"args"`
					Env   []envVar `yaml:"env"`
					Ports []struct {
						Name          string `yaml:"name"`
						ContainerPort int    `yaml:"containerPort"`
					} `yaml:"ports"`
					LivenessProbe  *probe `yaml:"livenessProbe"`
					ReadinessProbe *probe `yaml:"readinessProbe"`
					Resources      struct {
						Requests map[string]string `yaml:"requests"`
						Limits   map[string]string `yaml:"limits"`
					} `yaml:"resources"`
					SecurityContext struct {
						AllowPrivilegeEscalation *bool `yaml:"allowPrivilegeEscalation"`
						ReadOnlyRootFilesystem   *bool `yaml:"readOnlyRootFilesystem"`
					} `yaml:"securityContext"`
					VolumeMounts []struct {
						Name      string `yaml:"name"`
						MountPath string `yaml:"mountPath"`
						SubPath   string `yaml:"subPath"`
					} `yaml:"volumeMounts"`
				} `yaml:"containers"`
				Volumes []struct {
					Name      string `yaml:"name"`
					ConfigMap *struct {
						Name  string `yaml:"name"`
						Items []struct {
							Key  string `yaml:"key"`
							Path string `yaml:"path"`
						} `yaml:"items"`
					} `yaml:"configMap"`
					Secret *struct {
						SecretName string `yaml:"secretName"`
					} `yaml:"secret"`
				} `yaml:"volumes"`
			} `yaml:"spec"`
		} `yaml:"template"`
	} `yaml:"spec"`
}

type probe struct {
	HTTPGet *struct {
		Path string `yaml:"path"`
		Port any    `yaml:"port"`
	} `yaml:"httpGet"`
	TCPSocket *struct {
		Port any `yaml:"port"`
	} `yaml:"tcpSocket"`
}

type service struct {
	Spec struct {
		Selector        map[string]string `yaml:"selector"`
		SessionAffinity string            `yaml:"sessionAffinity"`
		Ports           []struct {
			Name       string `yaml:"name"`
			Port       int    `yaml:"port"`
			TargetPort any    `yaml:"targetPort"`
		} `yaml:"ports"`
	} `yaml:"spec"`
}

type scaledObject struct {
	Spec struct {
		ScaleTargetRef struct {
			APIVersion string `yaml:"apiVersion"`
			Kind       string `yaml:"kind"`
			Name       string `yaml:"name"`
		} `yaml:"scaleTargetRef"`
		MinReplicaCount *int `yaml:"minReplicaCount"`
		MaxReplicaCount *int `yaml:"maxReplicaCount"`
		Triggers        []struct {
			Type     string            `yaml:"type"`
			Metadata map[string]string `yaml:"metadata"`
		} `yaml:"triggers"`
	} `yaml:"spec"`
}

type pdb struct {
	Spec struct {
		MinAvailable   any      `yaml:"minAvailable"`
		MaxUnavailable any      `yaml:"maxUnavailable"`
		Selector       selector `yaml:"selector"`
	} `yaml:"spec"`
}

type configMap struct {
	Data map[string]string `yaml:"data"`
}

type kustomization struct {
	Resources []string `yaml:"resources"`
	Images    []image  `yaml:"images"`
}

type image struct {
	Name   string `yaml:"name"`
	NewTag string `yaml:"newTag"`
}

// loadManifests reads every YAML document under deployments/kubernetes.
func loadManifests(t *testing.T) []object {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("kubernetes", "*.yaml"))
	require.NoError(t, err)
	require.NotEmpty(t, files)
	var objs []object
	for _, f := range files {
		dec := yaml.NewDecoder(bytes.NewReader([]byte(readFile(t, f))))
		for {
			var n yaml.Node
			err := dec.Decode(&n)
			if errors.Is(err, io.EOF) {
				break
			}
			require.NoError(t, err, f)
			if len(n.Content) == 0 {
				continue // an empty document
			}
			var o object
			require.NoError(t, n.Decode(&o), f)
			o.node, o.file = &n, f
			objs = append(objs, o)
		}
	}
	return objs
}

func decodeAs[T any](t *testing.T, o object) T {
	t.Helper()
	var v T
	require.NoError(t, o.node.Decode(&v), "%s %s", o.Kind, o.Metadata.Name)
	return v
}

// named returns the object of kind named name.
func named(t *testing.T, objs []object, kind, name string) object {
	t.Helper()
	for _, o := range objs {
		if o.Kind == kind && o.Metadata.Name == name {
			return o
		}
	}
	t.Fatalf("no %s %s among the manifests", kind, name)
	return object{}
}

// one returns the single object of kind.
func one(t *testing.T, objs []object, kind string) object {
	t.Helper()
	var found []object
	for _, o := range objs {
		if o.Kind == kind {
			found = append(found, o)
		}
	}
	require.Len(t, found, 1, "one %s", kind)
	return found[0]
}

func TestKubernetesManifestsAreWellFormed(t *testing.T) {
	objs := loadManifests(t)
	for _, o := range objs {
		require.NotEmpty(t, o.APIVersion, "%s: apiVersion", o.file)
		require.NotEmpty(t, o.Kind, "%s: kind", o.file)
		if o.Kind != "Kustomization" {
			require.NotEmpty(t, o.Metadata.Name, "%s: metadata.name", o.file)
		}
		require.NotEqual(t, "Secret", o.Kind, "%s: secrets are referenced, never committed", o.file)
	}

	k := decodeAs[kustomization](t, one(t, objs, "Kustomization"))
	files, err := filepath.Glob(filepath.Join("kubernetes", "*.yaml"))
	require.NoError(t, err)
	var want []string
	for _, f := range files {
		if b := filepath.Base(f); b != "kustomization.yaml" {
			want = append(want, b)
		}
	}
	got := slices.Clone(k.Resources)
	slices.Sort(got)
	require.Equal(t, want, got, "kustomization.yaml lists every manifest")
}

func TestKubernetesWorkerDeployment(t *testing.T) {
	objs := loadManifests(t)
	dobj := named(t, objs, "Deployment", "idemgate-worker")
	d := decodeAs[deployment](t, dobj)
	require.Equal(t, "apps/v1", dobj.APIVersion)
	require.Nil(t, d.Spec.Replicas, "the ScaledObject owns the replica count")
	pod := d.Spec.Template.Spec
	require.Len(t, pod.Containers, 1)
	c := pod.Containers[0]

	// Flags: --name=value or --name value.
	args := map[string]string{}
	for i := 0; i < len(c.Args); i++ {
		name, val, ok := strings.Cut(strings.TrimLeft(c.Args[i], "-"), "=")
		if !ok && i+1 < len(c.Args) && !strings.HasPrefix(c.Args[i+1], "-") {
			val = c.Args[i+1]
			i++
		}
		args[name] = val
	}
	flags := workerFlags(t)
	for name := range args {
		require.True(t, flags[name], "--%s is not a worker flag", name)
	}
	require.Equal(t, "3", args["replicas"], "--replicas 3 on the R3 cluster")

	env := map[string]string{}
	for _, e := range c.Env {
		require.True(t, e.Value != "" || e.ValueFrom != nil, "env %s has a value", e.Name)
		env[e.Name] = e.Value
	}
	checkWorkerEnv(t, dobj.file, env)
	checkNATSClient(t, d, args, "worker")

	// The tools file: --tools names a file mounted from the tools ConfigMap.
	tools := args["tools"]
	require.Equal(t, "/etc/idemgate/tools.yaml", tools)
	cms := map[string]configMap{}
	for _, o := range objs {
		if o.Kind == "ConfigMap" {
			cms[o.Metadata.Name] = decodeAs[configMap](t, o)
		}
	}
	mounted := false
	for _, m := range c.VolumeMounts {
		for _, v := range pod.Volumes {
			if v.Name != m.Name || v.ConfigMap == nil {
				continue
			}
			cm, ok := cms[v.ConfigMap.Name]
			require.True(t, ok, "ConfigMap %s is among the manifests", v.ConfigMap.Name)
			key := m.SubPath
			for _, it := range v.ConfigMap.Items {
				if it.Path == m.SubPath {
					key = it.Key
				}
			}
			if m.MountPath == tools {
				require.Contains(t, cm.Data, key, "ConfigMap %s has the key %s", v.ConfigMap.Name, key)
				mounted = true
			}
		}
	}
	require.True(t, mounted, "--tools %s is mounted from a ConfigMap key", tools)

	// The audit key too: a read-only root file system leaves the worker no
	// place to make one.
	auditKey := args["audit-key"]
	require.NotEmpty(t, auditKey, "--audit-key names the signing key")
	fromSecret := false
	for _, m := range c.VolumeMounts {
		for _, v := range pod.Volumes {
			if v.Name == m.Name && v.Secret != nil && strings.HasPrefix(auditKey, strings.TrimSuffix(m.MountPath, "/")+"/") {
				fromSecret = true
			}
		}
	}
	require.True(t, fromSecret, "--audit-key %s lies in a mounted Secret", auditKey)

	drain := defaultDrain
	if v, ok := env["IDEMGATE_DRAIN_TIMEOUT"]; ok {
		var err error
		drain, err = time.ParseDuration(v)
		require.NoError(t, err)
	}
	require.NotNil(t, pod.TerminationGracePeriodSeconds)
	grace := time.Duration(*pod.TerminationGracePeriodSeconds) * time.Second
	require.Greater(t, grace, drain+flushAfterDrain, "terminationGracePeriodSeconds exceeds drain + flush")

	require.NotNil(t, pod.SecurityContext.RunAsNonRoot)
	require.True(t, *pod.SecurityContext.RunAsNonRoot)
	require.NotNil(t, pod.SecurityContext.RunAsUser)
	require.NotZero(t, *pod.SecurityContext.RunAsUser)
	require.NotNil(t, c.SecurityContext.AllowPrivilegeEscalation)
	require.False(t, *c.SecurityContext.AllowPrivilegeEscalation)
	require.NotEmpty(t, c.Resources.Requests["memory"])
	require.NotEmpty(t, c.Resources.Limits["memory"])

	sel := d.Spec.Selector.MatchLabels
	require.NotEmpty(t, sel)
	for k, v := range sel {
		require.Equal(t, v, d.Spec.Template.Metadata.Labels[k], "the pod template carries the selector's labels")
	}
}

// checkNATSClient checks how d's container connects to NATS: over TLS
// (tls:// URL, the CA from a mounted Secret) as user, one of the users of
// nats/helm-values.yaml, with the password from the Secret key the server
// reads it from, never inline, and the user's own inbox prefix.
func checkNATSClient(t *testing.T, d deployment, args map[string]string, user string) {
	t.Helper()
	pod := d.Spec.Template.Spec
	c := pod.Containers[0]
	var url string
	var password *envVar
	for i, e := range c.Env {
		switch e.Name {
		case "NATS_URL":
			url = e.Value
		case natsconn.PasswordEnv:
			password = &c.Env[i]
		case "NATS_CREDS":
			t.Fatalf("NATS_CREDS: the NATS users are those of nats/helm-values.yaml, with passwords")
		}
	}
	for _, u := range strings.Split(url, ",") {
		require.True(t, strings.HasPrefix(u, "tls://"), "NATS_URL %q: every connection is TLS", url)
	}
	require.Equal(t, user, args["nats-user"], "--nats-user")
	require.Equal(t, "_INBOX."+user, args["nats-inbox-prefix"], "--nats-inbox-prefix: the user receives replies on its own inbox only")

	ca := args["nats-tls-ca"]
	require.NotEmpty(t, ca, "--nats-tls-ca: the server's certificate is checked")
	inSecret := false
	for _, m := range c.VolumeMounts {
		for _, v := range pod.Volumes {
			if v.Name == m.Name && v.Secret != nil && v.Secret.SecretName != "" && strings.HasPrefix(ca, strings.TrimSuffix(m.MountPath, "/")+"/") {
				inSecret = true
			}
		}
	}
	require.True(t, inSecret, "--nats-tls-ca %s lies in a mounted Secret", ca)

	require.NotNil(t, password, "%s holds the password of user %s", natsconn.PasswordEnv, user)
	require.Empty(t, password.Value, "the password is never inline")
	require.True(t, password.ValueFrom != nil && password.ValueFrom.SecretKeyRef != nil, "%s comes from a Secret", natsconn.PasswordEnv)
	var v helmValues
	require.NoError(t, yaml.Unmarshal([]byte(readFile(t, filepath.Join("nats", "helm-values.yaml"))), &v))
	authz, _ := v.Config.Merge["authorization"].(map[string]any)
	users, _ := authz["users"].([]any)
	found := false
	for _, u := range users {
		m, _ := u.(map[string]any)
		if m["user"] != user {
			continue
		}
		found = true
		pw, _ := m["password"].(string)
		ref := envToken.FindStringSubmatch(pw)
		require.NotNil(t, ref, "user %s's password in the Helm values", user)
		server := v.Container.Env[ref[1]].ValueFrom
		require.NotNil(t, server, "the server reads %s from a Secret", ref[1])
		require.Equal(t, server.SecretKeyRef.Name, password.ValueFrom.SecretKeyRef.Name, "the client's password comes from the Secret the server's does")
		require.Equal(t, server.SecretKeyRef.Key, password.ValueFrom.SecretKeyRef.Key, "the client's password is the server's key for user %s", user)
	}
	require.True(t, found, "user %s is a user of nats/helm-values.yaml", user)
}

// TestKubernetesFrontDoors checks the HTTP front door and the MCP server:
// flags and settings each binary has, the tokens file and NATS credentials
// from mounted Secrets, an address other pods reach only behind tokens, a
// readiness probe on the health endpoint each serves and a liveness probe,
// a Service in front, room to drain, and the hardening the worker has.
func TestKubernetesFrontDoors(t *testing.T) {
	objs := loadManifests(t)
	tokens, err := auth.ParseTokens(strings.NewReader(strings.Repeat("a", 64) + " agent a"))
	require.NoError(t, err)
	k := decodeAs[kustomization](t, one(t, objs, "Kustomization"))
	for _, door := range []struct {
		name, command, envPrefix string
		natsUser                 string        // its user in nats/helm-values.yaml
		drain                    time.Duration // the binary's drain on SIGTERM
		healthRoute              string        // how its source routes the health endpoint
		listen                   func(args map[string]string) error
	}{
		{"idemgate-gateway", "gateway", "IDEMGATE", "gateway", 30 * time.Second, `"GET /healthz"`, func(args map[string]string) error {
			host, _, err := net.SplitHostPort(args["listen"])
			if err != nil {
				return err
			}
			if ip := net.ParseIP(host); (ip == nil || !ip.IsLoopback()) && args["tls-cert"] == "" {
				if _, insecure := args["insecure-listen"]; !insecure {
					return fmt.Errorf("--listen %s is not loopback: the gateway refuses it without TLS or --insecure-listen", args["listen"])
				}
			}
			return nil
		}},
		{"idemgate-mcp", "mcp", "IDEMGATE", "mcp", 10 * time.Second, "HealthPath", func(args map[string]string) error {
			require.Error(t, mcpgate.CheckListen(args["http"], nil), "--http %s is reachable from other pods", args["http"])
			return mcpgate.CheckListen(args["http"], tokens)
		}},
	} {
		t.Run(door.command, func(t *testing.T) {
			dobj := named(t, objs, "Deployment", door.name)
			require.Equal(t, "apps/v1", dobj.APIVersion)
			d := decodeAs[deployment](t, dobj)
			pod := d.Spec.Template.Spec
			require.Len(t, pod.Containers, 1)
			c := pod.Containers[0]
			name, _, _ := strings.Cut(c.Image, ":")
			require.True(t, slices.ContainsFunc(k.Images, func(i image) bool { return i.Name == name }), "kustomization.yaml pins %s", name)

			args := map[string]string{}
			flags := flagsOf(t, door.command)
			for _, a := range c.Args {
				name, val, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
				require.True(t, flags[name], "--%s is not a flag of cmd/%s", name, door.command)
				args[name] = val
			}
			require.NoError(t, door.listen(args))

			env := map[string]string{}
			known := map[string]bool{"NATS_URL": true, natsconn.PasswordEnv: true}
			for f := range flags {
				known[envflag.Name(door.envPrefix, f)] = true
			}
			for _, e := range c.Env {
				require.True(t, known[e.Name], "%s is not a setting of cmd/%s", e.Name, door.command)
				require.True(t, e.Value != "" || e.ValueFrom != nil, "env %s has a value", e.Name)
				env[e.Name] = e.Value
			}
			checkNATSClient(t, d, args, door.natsUser)

			// The tokens file and the NATS credentials lie in mounted Secrets;
			// both front doors read the same tokens.
			secretOf := func(path string) string {
				for _, m := range c.VolumeMounts {
					for _, v := range pod.Volumes {
						if v.Name == m.Name && v.Secret != nil && strings.HasPrefix(path, strings.TrimSuffix(m.MountPath, "/")+"/") {
							return v.Secret.SecretName
						}
					}
				}
				return ""
			}
			require.NotEmpty(t, args["tokens"], "--tokens")
			require.Equal(t, "idemgate-tokens", secretOf(args["tokens"]), "--tokens %s lies in the Secret idemgate-tokens", args["tokens"])

			// Probes on a named container port: readiness on the health
			// endpoint the binary serves, liveness on the port.
			ports := map[string]bool{}
			for _, p := range c.Ports {
				ports[p.Name] = true
			}
			require.NotNil(t, c.ReadinessProbe)
			require.NotNil(t, c.ReadinessProbe.HTTPGet, "readiness asks the health endpoint")
			require.Equal(t, "/healthz", c.ReadinessProbe.HTTPGet.Path)
			require.True(t, ports[fmt.Sprint(c.ReadinessProbe.HTTPGet.Port)], "readiness port %v is a named container port", c.ReadinessProbe.HTTPGet.Port)
			require.NotNil(t, c.LivenessProbe, "a liveness probe")
			if door.command == "mcp" {
				require.Equal(t, mcpgate.HealthPath, c.ReadinessProbe.HTTPGet.Path)
			} else {
				require.Contains(t, readFile(t, filepath.Join("..", "internal", "httpapi", "server.go")), door.healthRoute)
			}

			// A Service selects the pods and targets the port.
			svc := decodeAs[service](t, named(t, objs, "Service", door.name))
			require.NotEmpty(t, svc.Spec.Selector)
			for k, v := range svc.Spec.Selector {
				require.Equal(t, v, d.Spec.Template.Metadata.Labels[k], "the Service selects the pods (%s)", k)
			}
			require.NotEmpty(t, svc.Spec.Ports)
			for _, p := range svc.Spec.Ports {
				require.True(t, ports[fmt.Sprint(p.TargetPort)], "Service port %d targets a named container port, not %v", p.Port, p.TargetPort)
			}
			if door.command == "mcp" {
				require.Equal(t, "ClientIP", svc.Spec.SessionAffinity, "an MCP session lives in one pod")
			}

			require.NotNil(t, pod.TerminationGracePeriodSeconds)
			require.Greater(t, time.Duration(*pod.TerminationGracePeriodSeconds)*time.Second, door.drain, "terminationGracePeriodSeconds exceeds the drain")
			require.NotNil(t, pod.SecurityContext.RunAsNonRoot)
			require.True(t, *pod.SecurityContext.RunAsNonRoot)
			require.NotNil(t, c.SecurityContext.AllowPrivilegeEscalation)
			require.False(t, *c.SecurityContext.AllowPrivilegeEscalation)
			require.NotNil(t, c.SecurityContext.ReadOnlyRootFilesystem)
			require.True(t, *c.SecurityContext.ReadOnlyRootFilesystem)
			require.NotEmpty(t, c.Resources.Limits["memory"])
			for k, v := range d.Spec.Selector.MatchLabels {
				require.Equal(t, v, d.Spec.Template.Metadata.Labels[k], "the pod template carries the selector's labels")
			}
		})
	}
}

func TestKubernetesScaledObject(t *testing.T) {
	objs := loadManifests(t)
	dobj := named(t, objs, "Deployment", "idemgate-worker")
	sobj := one(t, objs, "ScaledObject")
	require.Equal(t, "keda.sh/v1alpha1", sobj.APIVersion)
	so := decodeAs[scaledObject](t, sobj)
	ref := so.Spec.ScaleTargetRef
	require.Equal(t, dobj.Metadata.Name, ref.Name)
	require.Contains(t, []string{"", "Deployment"}, ref.Kind)
	require.NotNil(t, so.Spec.MinReplicaCount)
	require.GreaterOrEqual(t, *so.Spec.MinReplicaCount, 1, "never to zero: someone must take over abandoned keys")
	require.NotNil(t, so.Spec.MaxReplicaCount)
	require.GreaterOrEqual(t, *so.Spec.MaxReplicaCount, *so.Spec.MinReplicaCount)

	require.Len(t, so.Spec.Triggers, 1)
	tr := so.Spec.Triggers[0]
	require.Equal(t, "nats-jetstream", tr.Type)
	require.Equal(t, "IDEM_INTENTS", tr.Metadata["stream"])
	require.Equal(t, "IDEM_WORKERS", tr.Metadata["consumer"])
	require.NotEmpty(t, tr.Metadata["natsServerMonitoringEndpoint"])
	require.NotEmpty(t, tr.Metadata["account"])
	lag, err := strconv.Atoi(tr.Metadata["lagThreshold"])
	require.NoError(t, err, "lagThreshold is a number")
	require.Positive(t, lag)
}

func TestKubernetesPodDisruptionBudget(t *testing.T) {
	objs := loadManifests(t)
	d := decodeAs[deployment](t, named(t, objs, "Deployment", "idemgate-worker"))
	pobj := one(t, objs, "PodDisruptionBudget")
	require.Equal(t, "policy/v1", pobj.APIVersion)
	p := decodeAs[pdb](t, pobj)
	require.True(t, (p.Spec.MinAvailable == nil) != (p.Spec.MaxUnavailable == nil), "exactly one of minAvailable and maxUnavailable")
	require.NotEmpty(t, p.Spec.Selector.MatchLabels)
	for k, v := range p.Spec.Selector.MatchLabels {
		require.Equal(t, v, d.Spec.Template.Metadata.Labels[k], "the PDB selects the worker pods (%s)", k)
		require.Equal(t, v, d.Spec.Selector.MatchLabels[k], "the PDB selects what the Deployment selects (%s)", k)
	}
}

// TestToolsFilesParse checks that the tools files shipped here load with the
// worker's own registry.
func TestToolsFilesParse(t *testing.T) {
	objs := loadManifests(t)
	cm := decodeAs[configMap](t, one(t, objs, "ConfigMap"))
	data, ok := cm.Data["tools.yaml"]
	require.True(t, ok, "the ConfigMap has a tools.yaml key")
	reg, err := toolsfile.Parse([]byte(data), toolsfile.WithFilename("kubernetes/tools-configmap.yaml#tools.yaml"))
	require.NoError(t, err)
	require.NotEmpty(t, reg.Names())
	require.NoError(t, reg.Close())

	reg, err = toolsfile.LoadFile(filepath.Join("demo", "tools.yaml"))
	require.NoError(t, err)
	require.NotEmpty(t, reg.Names())
	require.NoError(t, reg.Close())
}

// helmValues is what the tests read of nats/helm-values.yaml.
type helmValues struct {
	Config struct {
		Cluster struct {
			Enabled  bool `yaml:"enabled"`
			Replicas int  `yaml:"replicas"`
		} `yaml:"cluster"`
		NATS struct {
			Port int `yaml:"port"`
			TLS  struct {
				Enabled    bool   `yaml:"enabled"`
				SecretName string `yaml:"secretName"`
				Dir        string `yaml:"dir"`
				Cert       string `yaml:"cert"`
				Key        string `yaml:"key"`
			} `yaml:"tls"`
		} `yaml:"nats"`
		JetStream struct {
			Enabled bool              `yaml:"enabled"`
			Merge   map[string]string `yaml:"merge"`
		} `yaml:"jetstream"`
		Merge map[string]any `yaml:"merge"`
	} `yaml:"config"`
	Container struct {
		Env map[string]struct {
			Value     string `yaml:"value"`
			ValueFrom *struct {
				SecretKeyRef *struct {
					Name string `yaml:"name"`
					Key  string `yaml:"key"`
				} `yaml:"secretKeyRef"`
			} `yaml:"valueFrom"`
		} `yaml:"env"`
	} `yaml:"container"`
}

// helmUsers are the NATS users the Helm values must define, with the role
// (a block of nats/secure/permissions.conf) each has.
var helmUsers = map[string]string{
	"worker":  "IDEMGATE_WORKER",
	"gateway": "IDEMGATE_GATEWAY",
	"mcp":     "IDEMGATE_MCP",
}

// envToken is how the chart writes a bare NATS config token, such as a
// variable the server reads from its environment.
var envToken = regexp.MustCompile(`^<< \$([A-Z][A-Z0-9_]*) >>$`)

// TestHelmValues checks the values for the nats chart: the cluster and its
// durability, and that the server is not open: every client connection is
// TLS (the certificate from a Secret), every client is a user with a
// password from a Secret (never in the file) and the permissions of its
// role exactly as deployments/nats/secure/permissions.conf has them, and
// no user is assumed for clients that give none. The chart's config is
// rendered as the chart merges it and loaded by nats-server's own parser.
func TestHelmValues(t *testing.T) {
	var v helmValues
	require.NoError(t, yaml.Unmarshal([]byte(readFile(t, filepath.Join("nats", "helm-values.yaml"))), &v))
	require.True(t, v.Config.Cluster.Enabled)
	require.Equal(t, clusterSize, v.Config.Cluster.Replicas)
	require.True(t, v.Config.JetStream.Enabled)
	require.Equal(t, "always", v.Config.JetStream.Merge["sync_interval"])
	maxPayload, _ := v.Config.Merge["max_payload"].(int)
	require.GreaterOrEqual(t, maxPayload, 2*maxIntentBytes, "config.merge.max_payload")
	checkHelmSecured(t, v)
	checkMCPRole(t, shippedRoles(t))
}

// checkMCPRole fails t unless the MCP server's role is an agent's (its
// publish list) plus exactly the decisions of the person at the client on
// the user's decision subjects: approve and deny, never an operator's
// decision, resolve or probe.
func checkMCPRole(t *testing.T, roles map[string]any) {
	t.Helper()
	mcpRole, _ := roles["IDEMGATE_MCP"].(map[string]any)
	pub, _ := mcpRole["publish"].(map[string]any)
	got, _ := pub["allow"].([]any)
	agent, _ := roles["IDEMGATE_AGENT_PUBLISH"].(map[string]any)
	want, _ := agent["allow"].([]any)
	require.NotEmpty(t, want, "permissions.conf IDEMGATE_AGENT_PUBLISH")
	var extra []any
	for _, s := range got {
		if !slices.Contains(want, s) {
			extra = append(extra, s)
		}
	}
	for _, s := range want {
		require.Contains(t, got, s, "the MCP server publishes all an agent does")
	}
	require.ElementsMatch(t, []any{"idem.control.user.approve", "idem.control.user.deny"}, extra,
		"the MCP server publishes an agent's subjects and the two decisions of a user approval on the user's subjects, no other")
	require.Equal(t, map[string]any{"allow": []any{"_INBOX.mcp.>", "$KV.IDEM_LEDGER.>"}}, mcpRole["subscribe"],
		"the MCP server subscribes to its own inbox and the ledger keys' subjects only")
}

// checkHelmSecured fails t unless v serves TLS and the shipped roles only.
func checkHelmSecured(t *testing.T, v helmValues) {
	t.Helper()
	tls := v.Config.NATS.TLS
	require.True(t, tls.Enabled, "config.nats.tls.enabled: every client connection is TLS")
	require.NotEmpty(t, tls.SecretName, "config.nats.tls.secretName: the server's certificate comes from a Secret")
	require.NotContains(t, v.Config.Merge, "no_auth_user", "no user is assumed for a client that names none")
	require.NotContains(t, v.Config.Merge, "accounts", "one installation: the users of authorization")
	authz, ok := v.Config.Merge["authorization"].(map[string]any)
	require.True(t, ok, "config.merge.authorization: the server admits only its users (without it any client may do anything)")
	require.NotContains(t, authz, "token", "no shared token")
	list, ok := authz["users"].([]any)
	require.True(t, ok, "config.merge.authorization.users")

	roles := shippedRoles(t)
	env := map[string]string{} // the variables the rendered config reads, with test values
	seen := map[string]bool{}
	for _, u := range list {
		user, ok := u.(map[string]any)
		require.True(t, ok, "a user is a map: %v", u)
		name, _ := user["user"].(string)
		role, known := helmUsers[name]
		require.True(t, known, "user %q is none of %v", name, helmUsers)
		require.False(t, seen[name], "user %q twice", name)
		seen[name] = true

		pw, _ := user["password"].(string)
		m := envToken.FindStringSubmatch(pw)
		require.NotNil(t, m, "user %s: the password is a variable (<< $NAME >>) from the environment, never in the file: %q", name, pw)
		e, ok := v.Container.Env[m[1]]
		require.True(t, ok, "container.env sets %s", m[1])
		require.True(t, e.Value == "" && e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil && e.ValueFrom.SecretKeyRef.Name != "",
			"container.env %s comes from a Secret (valueFrom.secretKeyRef)", m[1])
		env[m[1]] = "pw-" + name

		perms, ok := user["permissions"].(map[string]any)
		require.True(t, ok, "user %s has permissions", name)
		require.Equal(t, roles[role], any(perms), "user %s has the role %s of permissions.conf", name, role)
	}
	require.Len(t, seen, len(helmUsers), "users %v", helmUsers)

	// The config as the chart renders it: the merge block, the client TLS
	// block from the Secret's files, and the variables as bare tokens.
	dir := t.TempDir()
	cert, key := selfSigned(t, dir)
	cfg := map[string]any{}
	for k, val := range v.Config.Merge {
		cfg[k] = val
	}
	cfg["tls"] = map[string]any{"cert_file": cert, "key_file": key}
	var text bytes.Buffer
	enc := json.NewEncoder(&text)
	enc.SetEscapeHTML(false) // nats-server's parser knows no \u escapes
	require.NoError(t, enc.Encode(cfg))
	conf := envRefToken.ReplaceAllString(text.String(), "$$$1")
	var defs strings.Builder
	for k, val := range env {
		fmt.Fprintf(&defs, "%s: %q\n", k, val)
	}
	path := filepath.Join(dir, "nats.conf")
	require.NoError(t, os.WriteFile(path, []byte(defs.String()+conf), 0o600))
	o, err := server.ProcessConfigFile(path)
	require.NoError(t, err, "the rendered config loads:\n%s", conf)
	require.NotNil(t, o.TLSConfig, "the rendered config serves TLS")
	require.Len(t, o.Users, len(helmUsers))
	for _, u := range o.Users {
		require.Equal(t, "pw-"+u.Username, u.Password, "user %s's password is read from the environment", u.Username)
		require.NotNil(t, u.Permissions, "user %s has permissions", u.Username)
	}
	require.Empty(t, o.NoAuthUser)
}

// envRefToken is a quoted << $NAME >> in the JSON of the chart's merge.
var envRefToken = regexp.MustCompile(`"<< \$([A-Z][A-Z0-9_]*) >>"`)

// shippedRoles are the role blocks of nats/secure/permissions.conf, as
// nats-server's parser reads them.
func shippedRoles(t *testing.T) map[string]any {
	t.Helper()
	m, err := conf.ParseFile(filepath.Join("nats", "secure", "permissions.conf"))
	require.NoError(t, err)
	for _, role := range helmUsers {
		require.Contains(t, m, role)
	}
	// Through JSON, as the YAML values are compared: lists as []any.
	b, err := json.Marshal(m)
	require.NoError(t, err)
	var out map[string]any
	require.NoError(t, json.Unmarshal(b, &out))
	return out
}

// selfSigned writes a certificate and key for the rendered config to load.
func selfSigned(t *testing.T, dir string) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "nats"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), DNSNames: []string{"nats"}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	kder, err := x509.MarshalECPrivateKey(key)
	require.NoError(t, err)
	certFile, keyFile = filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	require.NoError(t, os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600))
	require.NoError(t, os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600))
	return certFile, keyFile
}

// ---------------------------------------------------------------- files

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	return string(b)
}

func readLines(t *testing.T, path string) []string {
	t.Helper()
	var lines []string
	sc := bufio.NewScanner(strings.NewReader(readFile(t, path)))
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	require.NoError(t, sc.Err())
	return lines
}

// ---------------------------------------------------------------- network policies

type networkPolicy struct {
	Metadata struct {
		Name      string `yaml:"name"`
		Namespace string `yaml:"namespace"`
	} `yaml:"metadata"`
	Spec struct {
		PodSelector labelSelector `yaml:"podSelector"`
		PolicyTypes []string      `yaml:"policyTypes"`
		Ingress     []struct {
			From []struct {
				PodSelector       *labelSelector `yaml:"podSelector"`
				NamespaceSelector *labelSelector `yaml:"namespaceSelector"`
				IPBlock           any            `yaml:"ipBlock"`
			} `yaml:"from"`
			Ports []struct {
				Port any `yaml:"port"`
			} `yaml:"ports"`
		} `yaml:"ingress"`
	} `yaml:"spec"`
}

type labelSelector struct {
	MatchLabels      map[string]string `yaml:"matchLabels"`
	MatchExpressions any               `yaml:"matchExpressions"`
}

// matches reports whether the selector selects labels (matchLabels only:
// the shipped policies use no expressions).
func (s labelSelector) matches(t *testing.T, labels map[string]string) bool {
	t.Helper()
	require.Nil(t, s.MatchExpressions, "the shipped policies select by matchLabels only")
	for k, v := range s.MatchLabels {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// pod is a pod as network policies see it: its namespace, labels and named
// ports.
type pod struct {
	namespace string
	labels    map[string]string
	ports     map[string]int // named container ports
}

// admits reports whether the policies let from reach port of to, as
// Kubernetes decides: a pod no policy of its namespace selects for ingress
// takes everything; a selected pod takes what one of those policies'
// rules allows.
func admits(t *testing.T, policies []networkPolicy, from, to pod, port int) bool {
	t.Helper()
	nsLabels := func(p pod) map[string]string { return map[string]string{"kubernetes.io/metadata.name": p.namespace} }
	selected := false
	for _, np := range policies {
		if np.Metadata.Namespace != to.namespace || !np.Spec.PodSelector.matches(t, to.labels) {
			continue
		}
		if !slices.Contains(np.Spec.PolicyTypes, "Ingress") && len(np.Spec.Ingress) == 0 {
			continue
		}
		selected = true
		for _, rule := range np.Spec.Ingress {
			portOK := len(rule.Ports) == 0
			for _, p := range rule.Ports {
				switch v := p.Port.(type) {
				case int:
					portOK = portOK || v == port
				case string:
					portOK = portOK || to.ports[v] == port
				}
			}
			peerOK := len(rule.From) == 0
			for _, peer := range rule.From {
				require.Nil(t, peer.IPBlock, "%s: no ipBlock: pods are chosen by labels", np.Metadata.Name)
				nsOK := from.namespace == np.Metadata.Namespace
				if peer.NamespaceSelector != nil {
					nsOK = peer.NamespaceSelector.matches(t, nsLabels(from))
				}
				podOK := peer.PodSelector == nil || peer.PodSelector.matches(t, from.labels)
				peerOK = peerOK || (nsOK && podOK)
			}
			if portOK && peerOK {
				return true
			}
		}
	}
	return !selected
}

// loadPolicies reads the NetworkPolicies of deployments/kubernetes (in the
// namespace kustomization.yaml gives them) and deployments/nats.
func loadPolicies(t *testing.T) []networkPolicy {
	t.Helper()
	objs := loadManifests(t)
	k := one(t, objs, "Kustomization")
	var ns struct {
		Namespace string `yaml:"namespace"`
	}
	require.NoError(t, k.node.Decode(&ns))
	var out []networkPolicy
	for _, o := range objs {
		if o.Kind == "NetworkPolicy" {
			np := decodeAs[networkPolicy](t, o)
			np.Metadata.Namespace = ns.Namespace
			out = append(out, np)
		}
	}
	dec := yaml.NewDecoder(strings.NewReader(readFile(t, filepath.Join("nats", "networkpolicy.yaml"))))
	for {
		var np networkPolicy
		err := dec.Decode(&np)
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err)
		require.Equal(t, "nats", np.Metadata.Namespace, "nats/networkpolicy.yaml: the Helm release's namespace")
		out = append(out, np)
	}
	return out
}

// TestKubernetesNetworkPolicies checks who may reach what: NATS only from
// the workers and the front doors (its routes from its own servers, its
// monitoring from KEDA and Prometheus), the front doors from agents, the
// workers' admin port from Prometheus only, and nothing else from any other
// pod of any namespace.
func TestKubernetesNetworkPolicies(t *testing.T) {
	policies := loadPolicies(t)
	objs := loadManifests(t)
	podOf := func(name string) pod {
		d := decodeAs[deployment](t, named(t, objs, "Deployment", name))
		p := pod{namespace: "idemgate", labels: d.Spec.Template.Metadata.Labels, ports: map[string]int{}}
		for _, c := range d.Spec.Template.Spec.Containers {
			for _, port := range c.Ports {
				p.ports[port.Name] = port.ContainerPort
			}
		}
		return p
	}
	worker, gateway, mcp := podOf("idemgate-worker"), podOf("idemgate-gateway"), podOf("idemgate-mcp")
	natsLabels := map[string]string{"app.kubernetes.io/name": "nats", "app.kubernetes.io/instance": "nats", "app.kubernetes.io/component": "nats"}
	nats := pod{namespace: "nats", labels: natsLabels}
	other := pod{namespace: "idemgate", labels: map[string]string{"app": "debug"}}
	stranger := pod{namespace: "default", labels: map[string]string{"app": "web"}}
	natsBox := pod{namespace: "nats", labels: map[string]string{"app.kubernetes.io/name": "nats", "app.kubernetes.io/component": "nats-box"}}
	agent := pod{namespace: "agents", labels: map[string]string{"idemgate.io/agent": "true"}}
	ingress := pod{namespace: "ingress-nginx", labels: map[string]string{"app": "controller"}}
	prometheus := pod{namespace: "monitoring", labels: map[string]string{"app": "prometheus"}}
	keda := pod{namespace: "keda", labels: map[string]string{"app": "keda-operator"}}

	for _, tc := range []struct {
		what     string
		from, to pod
		port     int
		want     bool
	}{
		{"a worker reaches NATS", worker, nats, 4222, true},
		{"the HTTP front door reaches NATS", gateway, nats, 4222, true},
		{"the MCP server reaches NATS", mcp, nats, 4222, true},
		{"another pod of the namespace does not reach NATS", other, nats, 4222, false},
		{"a pod of another namespace does not reach NATS", stranger, nats, 4222, false},
		{"an agent pod does not reach NATS", agent, nats, 4222, false},
		{"nats-box does not reach NATS", natsBox, nats, 4222, false},
		{"a NATS server routes to another", nats, nats, 6222, true},
		{"a worker does not reach the route port", worker, nats, 6222, false},
		{"KEDA reads NATS monitoring", keda, nats, 8222, true},
		{"Prometheus reads NATS monitoring", prometheus, nats, 8222, true},
		{"a worker does not read NATS monitoring", worker, nats, 8222, false},
		{"a pod of another namespace does not read NATS monitoring", stranger, nats, 8222, false},
		{"an agent reaches the HTTP front door", agent, gateway, gateway.ports["http"], true},
		{"the Ingress controller reaches the HTTP front door", ingress, gateway, gateway.ports["http"], true},
		{"an agent reaches the MCP server", agent, mcp, mcp.ports["http"], true},
		{"the Ingress controller reaches the MCP server", ingress, mcp, mcp.ports["http"], true},
		{"a pod that is no agent does not reach the HTTP front door", stranger, gateway, gateway.ports["http"], false},
		{"a pod that is no agent does not reach the MCP server", stranger, mcp, mcp.ports["http"], false},
		{"an agent reaches no other port of the front door", agent, gateway, 9999, false},
		{"Prometheus scrapes a worker", prometheus, worker, worker.ports["admin"], true},
		{"an agent does not reach a worker's admin port", agent, worker, worker.ports["admin"], false},
		{"the front door does not reach a worker's admin port", gateway, worker, worker.ports["admin"], false},
		{"a pod of another namespace does not reach a worker's admin port", stranger, worker, worker.ports["admin"], false},
		{"Prometheus reaches no other port of a worker", prometheus, worker, 8080, false},
		{"another pod of the namespace reaches no pod of idemgate", other, worker, worker.ports["admin"], false},
	} {
		require.NotZero(t, tc.port, tc.what)
		require.Equal(t, tc.want, admits(t, policies, tc.from, tc.to, tc.port), tc.what)
	}
}
