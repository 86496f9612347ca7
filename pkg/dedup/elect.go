package dedup

import (
	"context"
	"fmt"
	"strings"
	"time"
)

// electionPrefix starts the KV key of every election (Elect): a key with no
// dot, which no record (one dot) or budget count (three) has.
const electionPrefix = "_"

// Elect makes holder the winner of the election name until ttl passes, if
// no one is: it creates the key "_"+name in partition 0, holding holder,
// with ttl as its per-message TTL. It returns won false, and no error, when
// another call created it first and its TTL has not run out. Workers elect
// the one of them that does a round of shared work this way. An election is
// no record: List, Walk and WatchAll skip it.
//
// A name that is not one or more of [a-z0-9_-], or a ttl under a second,
// gives an error matching ErrInvalid.
func (l *Ledger) Elect(ctx context.Context, name, holder string, ttl time.Duration) (won bool, err error) {
	if !validElection(name) {
		return false, fmt.Errorf("%w: elect %q: use one or more of a-z, 0-9, _ and -", ErrInvalid, name)
	}
	if ttl < time.Second {
		return false, fmt.Errorf("%w: elect %s: ttl %s: use at least 1s", ErrInvalid, name, ttl)
	}
	won, err = l.parts[0].Elect(ctx, electionPrefix+name, []byte(holder), ttl)
	if err != nil {
		return false, fmt.Errorf("elect %s: %w", name, err)
	}
	return won, nil
}

// validElection reports whether name is one or more of [a-z0-9_-].
func validElection(name string) bool {
	if name == "" {
		return false
	}
	for _, c := range name {
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '_' && c != '-' {
			return false
		}
	}
	return true
}

// isElectionKey reports whether a KV key of the ledger is an election's.
func isElectionKey(stored string) bool {
	return strings.HasPrefix(stored, electionPrefix) && !strings.Contains(stored, ".")
}

// Ready reports whether the ledger's server answers for it: it asks for the
// status of partition 0's bucket (the one named BucketConfig.Bucket, which
// records the ledger's shape), a round trip, and returns the server's error
// as is, e.g. one matching jetstream.ErrStreamNotFound once the ledger is
// deleted.
func (l *Ledger) Ready(ctx context.Context) error {
	return l.parts[0].Status(ctx)
}
