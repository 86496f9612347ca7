package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/idemgate/idemgate/internal/worker"
)

// The workers' durability flags: what a run changes of how much a crash or a
// power loss may take.
const (
	flagAsyncIntents  = "async-intents"
	flagLedgerBatch   = "ledger-batch"
	flagBatchInFlight = "ledger-batch-inflight"
)

// workerDurabilityArgs are the durability flags the run passes the workers:
// none unless the run was asked for them.
func (c config) workerDurabilityArgs() []string {
	var a []string
	if c.synced {
		a = append(a, "--"+flagAsyncIntents+"=false")
	}
	if c.ledgerBatch >= 0 {
		a = append(a, fmt.Sprintf("--%s=%d", flagLedgerBatch, c.ledgerBatch))
	}
	if c.batchInFlight > 0 {
		a = append(a, fmt.Sprintf("--%s=%d", flagBatchInFlight, c.batchInFlight))
	}
	return a
}

func (c config) replicas() int {
	if c.cluster {
		return 3
	}
	return 1
}

// declaredDurability is what the run says it changes of the shipped
// durability: the server's sync_interval when it is not always, and each
// durability flag it passes the workers with another value than theirs.
func (c config) declaredDurability() []string {
	var out []string
	if c.sync != "always" {
		out = append(out, "sync_interval="+c.sync)
	}
	out = append(out, nonDefaultFlags([][]string{c.workerDurabilityArgs()}, c.replicas())...)
	slices.Sort(out)
	return out
}

// durabilityFacts is the evidence of how durably a run actually ran: the
// nats-server configuration files, the workers' command lines, and the
// work stream's persistence each worker logged when it began consuming.
type durabilityFacts struct {
	serverConfs []string   // the text of each node's configuration
	workerArgs  [][]string // each worker start's arguments
	persist     []string   // each worker start's logged intents_persist
	replicas    int
}

// observed is what the evidence shows the run changed of the shipped
// durability, in declaredDurability's terms, plus the work stream's logged
// persistence when it is not what the workers' flags make it.
func (f durabilityFacts) observed() []string {
	seen := map[string]bool{}
	syncRe := regexp.MustCompile(`(?m)^\s*sync_interval:\s*"?([^"\s]+)"?`)
	for _, conf := range f.serverConfs {
		m := syncRe.FindStringSubmatch(conf)
		switch {
		case m == nil:
			seen["sync_interval=(server default)"] = true
		case m[1] != "always":
			seen["sync_interval="+m[1]] = true
		}
	}
	for _, s := range nonDefaultFlags(f.workerArgs, f.replicas) {
		seen[s] = true
	}
	want := "Async" // the workers' default at one replica
	if f.replicas > 1 || seen["--"+flagAsyncIntents+"=false"] {
		want = "Default"
	}
	for _, p := range f.persist {
		if p != want {
			seen["intents_persist="+p] = true
		}
	}
	return slices.Sorted(func(yield func(string) bool) {
		for s := range seen {
			if !yield(s) {
				return
			}
		}
	})
}

// nonDefaultFlags are the durability flags on the command lines args whose
// value is not the workers' default, as --name=value.
func nonDefaultFlags(args [][]string, replicas int) []string {
	defaults := map[string]string{
		flagAsyncIntents:  "true",
		flagLedgerBatch:   strconv.Itoa(worker.DefaultLedgerBatch),
		flagBatchInFlight: strconv.Itoa(worker.LedgerBatchInFlightFor(replicas)),
	}
	seen := map[string]bool{}
	for _, a := range args {
		for i := 0; i < len(a); i++ {
			name, value, hasValue := strings.Cut(strings.TrimLeft(a[i], "-"), "=")
			def, ok := defaults[name]
			if !ok || !strings.HasPrefix(a[i], "-") {
				continue
			}
			if !hasValue {
				if name == flagAsyncIntents {
					value = "true"
				} else if i+1 < len(a) {
					i++
					value = a[i]
				}
			}
			if value != def {
				seen["--"+name+"="+value] = true
			}
		}
	}
	out := make([]string, 0, len(seen))
	for s := range seen {
		out = append(out, s)
	}
	slices.Sort(out)
	return out
}

// loggedPersist is the intents_persist of the first "worker consuming" line
// of a worker's log ("" when there is none).
func loggedPersist(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<22)
	for sc.Scan() {
		if !strings.Contains(sc.Text(), "worker consuming") {
			continue
		}
		var line struct {
			Persist string `json:"intents_persist"`
		}
		if json.Unmarshal(sc.Bytes(), &line) == nil {
			return line.Persist
		}
	}
	return ""
}

// durabilityLabel is how a verdict names a run's durability settings.
func durabilityLabel(s []string) string {
	if len(s) == 0 {
		return "the shipped defaults"
	}
	return strings.Join(s, " ")
}
