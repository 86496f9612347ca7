package audit

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemgate/idemgate/pkg/intent"
)

// DefaultCheckpointEvery is how often a worker signs and stores the
// checkpoints of every partition.
const DefaultCheckpointEvery = time.Minute

// Checkpoint is a worker's signed statement of one partition's chain: the
// installation, the partition (of how many), how many entries the chain
// holds and the digest of its last (its head: "" when it holds none), and
// the first position the stream still holds (older appends expire), at a
// time. A trail that holds the checkpoint's head at position Size is the
// chain the installation's worker saw; a later checkpoint of the same
// chain holds it as a prefix.
//
// Its signature is the signer's Ed25519 signature of its canonical JSON
// (RFC 8785) without "sig", base64url without padding.
type Checkpoint struct {
	V            int       `json:"v"`
	Installation string    `json:"installation"`
	Partition    int       `json:"partition"`
	Partitions   int       `json:"partitions"`
	Size         uint64    `json:"size"`
	First        uint64    `json:"first"`
	Head         string    `json:"head"`
	At           time.Time `json:"at"`
	Signer       string    `json:"signer"`
	Sig          string    `json:"sig"`
}

// CheckpointFile is the JSON a set of checkpoints is kept and exchanged
// in: submit audit checkpoint prints it, an export ends with it (on one
// line), GET /v1/audit/checkpoint serves it.
type CheckpointFile struct {
	Checkpoints []Checkpoint `json:"checkpoints"`
}

// canonical is c's canonical JSON, with its sig or without.
func (c Checkpoint) canonical(withSig bool) []byte {
	b := make([]byte, 0, 320)
	b = append(b, `{"at":"`...)
	b = c.At.UTC().AppendFormat(b, time.RFC3339Nano)
	b = append(b, `","first":`...)
	b = strconv.AppendUint(b, c.First, 10)
	b = append(b, `,"head":`...)
	b = intent.AppendCanonicalString(b, c.Head)
	b = append(b, `,"installation":`...)
	b = intent.AppendCanonicalString(b, c.Installation)
	b = append(b, `,"partition":`...)
	b = strconv.AppendInt(b, int64(c.Partition), 10)
	b = append(b, `,"partitions":`...)
	b = strconv.AppendInt(b, int64(c.Partitions), 10)
	if withSig {
		b = append(b, `,"sig":`...)
		b = intent.AppendCanonicalString(b, c.Sig)
	}
	b = append(b, `,"signer":`...)
	b = intent.AppendCanonicalString(b, c.Signer)
	b = append(b, `,"size":`...)
	b = strconv.AppendUint(b, c.Size, 10)
	b = append(b, `,"v":`...)
	b = strconv.AppendInt(b, int64(c.V), 10)
	return append(b, '}')
}

// MarshalJSON writes c canonical.
func (c Checkpoint) MarshalJSON() ([]byte, error) { return c.canonical(true), nil }

// SignCheckpoint returns c signed by s.
func (s *Signer) SignCheckpoint(c Checkpoint) Checkpoint {
	c.V, c.Signer, c.Sig = Version, s.id, ""
	c.Sig = s.sign(c.canonical(false))
	return c
}

var (
	hexDigest       = regexp.MustCompile(`^[0-9a-f]{64}$`)
	installationPat = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)
)

// check reports what is wrong with c's members (not its signature).
func (c Checkpoint) check() error {
	switch {
	case c.V != Version:
		return fmt.Errorf("%w: checkpoint: v %d, want %d", ErrInvalid, c.V, Version)
	case !installationPat.MatchString(c.Installation):
		return fmt.Errorf("%w: checkpoint: installation %q: want 1-64 letters, digits, '_' or '-'", ErrInvalid, c.Installation)
	case !intent.ValidPartitions(c.Partitions) || c.Partition < 0 || c.Partition >= c.Partitions:
		return fmt.Errorf("%w: checkpoint: partition %d of %d", ErrInvalid, c.Partition, c.Partitions)
	case c.Size == 0 && c.Head != "", c.Size > 0 && !hexDigest.MatchString(c.Head):
		return fmt.Errorf("%w: checkpoint of partition %d: size %d with head %q", ErrInvalid, c.Partition, c.Size, c.Head)
	case (c.Size == 0) != (c.First == 0) || c.First > c.Size:
		return fmt.Errorf("%w: checkpoint of partition %d: first %d of size %d", ErrInvalid, c.Partition, c.First, c.Size)
	case c.At.IsZero():
		return fmt.Errorf("%w: checkpoint of partition %d: no at", ErrInvalid, c.Partition)
	case c.Signer == "" || c.Sig == "":
		return fmt.Errorf("%w: checkpoint of partition %d: not signed", ErrBadSignature, c.Partition)
	}
	return nil
}

// Verify checks c's members and its signature with keys (the signer's key
// valid at c.At). It returns an error matching ErrInvalid,
// ErrBadSignature, ErrUnknownSigner or ErrKeyNotValid.
func (c Checkpoint) Verify(keys *KeySet) error {
	if err := c.check(); err != nil {
		return err
	}
	if err := verify(keys, c.Signer, c.At, c.canonical(false), c.Sig); err != nil {
		return fmt.Errorf("checkpoint of partition %d: %w", c.Partition, err)
	}
	return nil
}

// ParseCheckpoints reads a CheckpointFile: checkpoints of one installation
// and partition count, at most one a partition, sorted by partition. It
// checks their members, not their signatures (Checkpoint.Verify).
func ParseCheckpoints(data []byte) ([]Checkpoint, error) {
	var f CheckpointFile
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("%w: checkpoints: %w", ErrInvalid, err)
	}
	if dec.More() {
		return nil, fmt.Errorf("%w: checkpoints: data after the object", ErrInvalid)
	}
	if len(f.Checkpoints) == 0 {
		return nil, fmt.Errorf("%w: checkpoints: none", ErrInvalid)
	}
	cps := f.Checkpoints
	slices.SortFunc(cps, func(a, b Checkpoint) int { return a.Partition - b.Partition })
	for i, c := range cps {
		if err := c.check(); err != nil && !errors.Is(err, ErrBadSignature) {
			return nil, err
		}
		switch {
		case c.Installation != cps[0].Installation:
			return nil, fmt.Errorf("%w: checkpoints of two installations, %s and %s", ErrInvalid, cps[0].Installation, c.Installation)
		case c.Partitions != cps[0].Partitions:
			return nil, fmt.Errorf("%w: checkpoints of %d and of %d partitions", ErrInvalid, cps[0].Partitions, c.Partitions)
		case i > 0 && c.Partition == cps[i-1].Partition:
			return nil, fmt.Errorf("%w: two checkpoints of partition %d", ErrInvalid, c.Partition)
		}
	}
	return cps, nil
}

// LoadCheckpoints reads a CheckpointFile from path (ParseCheckpoints).
func LoadCheckpoints(path string) ([]Checkpoint, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("checkpoints: %w", err)
	}
	cps, err := ParseCheckpoints(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return cps, nil
}

// isCheckpointLine reports whether a trail line is a CheckpointFile (an
// export's last line) rather than an entry.
func isCheckpointLine(line []byte) bool {
	return bytes.HasPrefix(line, []byte(`{"checkpoints":`))
}

// GenesisDigest is the prev of the first entry of partition's chain in
// installation: hex(sha256(JCS({"installation":…,"partition":…}))). It
// binds the chain to its installation.
func GenesisDigest(installation string, partition int) string {
	b := append([]byte(`{"installation":`), intent.AppendCanonicalString(nil, installation)...)
	b = append(b, `,"partition":`...)
	b = strconv.AppendInt(b, int64(partition), 10)
	return digestOf(append(b, '}'))
}

// installationKey is the key of the installation's id in the keys bucket;
// checkpointKey(p) that of partition p's latest checkpoint. Neither is a
// key id (16 hex digits).
const installationKey = "installation"

func checkpointKey(p int) string { return "checkpoint." + strconv.Itoa(p) }

// isKeyID reports whether a key of the keys bucket is a public key's.
func isKeyID(k string) bool { return k != installationKey && !strings.HasPrefix(k, "checkpoint.") }

// ReadInstallation returns the installation's id as stored in the keys
// bucket, "" when none is stored yet; it never makes one.
func ReadInstallation(ctx context.Context, js jetstream.JetStream, names intent.Names) (string, error) {
	kv, err := js.KeyValue(ctx, names.AuditKeys)
	if err != nil {
		return "", fmt.Errorf("audit keys bucket %s: %w", names.AuditKeys, err)
	}
	return storedInstallation(ctx, kv, names)
}

// Installation returns the installation's id: made (128 random bits, hex)
// and stored in the keys bucket (Names.AuditKeys) by the first worker that
// asks — a Trail asks when it starts its first chain, a worker when it
// signs its first checkpoints — and never changed after.
func Installation(ctx context.Context, js jetstream.JetStream, names intent.Names) (string, error) {
	kv, err := js.KeyValue(ctx, names.AuditKeys)
	if err != nil {
		return "", fmt.Errorf("audit keys bucket %s: %w", names.AuditKeys, err)
	}
	if id, err := storedInstallation(ctx, kv, names); id != "" || err != nil {
		return id, err
	}
	var raw [16]byte
	_, _ = rand.Read(raw[:])
	id := hex.EncodeToString(raw[:])
	_, err = kv.Create(ctx, installationKey, []byte(id))
	switch {
	case err == nil:
		return id, nil
	case errors.Is(err, jetstream.ErrKeyExists): // another worker's came first
		if id, err = storedInstallation(ctx, kv, names); id != "" || err != nil {
			return id, err
		}
		err = jetstream.ErrKeyNotFound // stored by another, then not found
	}
	return "", fmt.Errorf("the installation id in %s: %w", names.AuditKeys, err)
}

// storedInstallation reads the installation's id from the keys bucket kv,
// "" when none is stored, and checks its form.
func storedInstallation(ctx context.Context, kv jetstream.KeyValue, names intent.Names) (string, error) {
	e, err := kv.Get(ctx, installationKey)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return "", nil
	case err != nil:
		return "", fmt.Errorf("the installation id in %s: %w", names.AuditKeys, err)
	}
	id := string(e.Value())
	if !installationPat.MatchString(id) {
		return "", fmt.Errorf("%w: the installation id in %s is %q", ErrInvalid, names.AuditKeys, id)
	}
	return id, nil
}

// MakeCheckpoints reads the head of each of the partitions chains of the
// audit stream and returns their checkpoints, signed by s.
func MakeCheckpoints(ctx context.Context, js jetstream.JetStream, names intent.Names, installation string, partitions int, s *Signer) ([]Checkpoint, error) {
	stream, err := js.Stream(ctx, names.AuditStream)
	if err != nil {
		return nil, fmt.Errorf("audit stream %s: %w", names.AuditStream, err)
	}
	cps := make([]Checkpoint, 0, partitions)
	for p := range partitions {
		subject := names.AuditSubject(p)
		h, _, err := lastEntry(ctx, stream, subject)
		if err != nil {
			return nil, err
		}
		var first uint64
		if h.pos > 0 {
			if first, err = firstPosition(ctx, stream, subject); err != nil {
				return nil, err
			}
		}
		cps = append(cps, s.SignCheckpoint(Checkpoint{Installation: installation, Partition: p, Partitions: partitions,
			Size: h.pos, First: min(first, h.pos), Head: h.digest, At: time.Now()}))
	}
	return cps, nil
}

// firstPosition reads the position of the first entry of a chain's oldest
// append the stream holds.
func firstPosition(ctx context.Context, s jetstream.Stream, subject string) (uint64, error) {
	m, err := s.GetMsg(ctx, 1, jetstream.WithGetMsgSubject(subject))
	if err != nil {
		return 0, fmt.Errorf("read the first append of %s: %w", subject, err)
	}
	data, err := appendLines(m.Header, m.Data)
	if err != nil {
		return 0, fmt.Errorf("the first append of %s (sequence %d): %w", subject, m.Sequence, err)
	}
	data = bytes.TrimSpace(data)
	if i := bytes.IndexByte(data, '\n'); i >= 0 {
		data = data[:i]
	}
	pe, err := parseEntry(data)
	if err != nil {
		return 0, fmt.Errorf("the first append of %s (sequence %d): %w", subject, m.Sequence, err)
	}
	return pe.Pos, nil
}

// lastEntry reads the last entry of a chain: its head (zero when the chain
// has none) and the stream sequence of its message.
func lastEntry(ctx context.Context, s jetstream.Stream, subject string) (head, uint64, error) {
	m, err := s.GetLastMsgForSubject(ctx, subject)
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return head{}, 0, nil
	case err != nil:
		return head{}, 0, fmt.Errorf("read the head of %s: %w", subject, err)
	}
	data, err := appendLines(m.Header, m.Data)
	if err != nil {
		return head{}, 0, fmt.Errorf("the head of %s (sequence %d): %w", subject, m.Sequence, err)
	}
	data = bytes.TrimSpace(data)
	pe, err := parseEntry(data[bytes.LastIndexByte(data, '\n')+1:])
	if err != nil {
		return head{}, 0, fmt.Errorf("the head of %s (sequence %d): %w", subject, m.Sequence, err)
	}
	return head{pos: pe.Pos, digest: pe.digest}, m.Sequence, nil
}

// StoreCheckpoints keeps cps as the latest checkpoints in the keys bucket,
// each unless a checkpoint of a longer chain is there already.
func StoreCheckpoints(ctx context.Context, js jetstream.JetStream, names intent.Names, cps []Checkpoint) error {
	kv, err := js.KeyValue(ctx, names.AuditKeys)
	if err != nil {
		return fmt.Errorf("audit keys bucket %s: %w", names.AuditKeys, err)
	}
	for _, c := range cps {
		if err := storeCheckpoint(ctx, kv, c); err != nil {
			return err
		}
	}
	return nil
}

func storeCheckpoint(ctx context.Context, kv jetstream.KeyValue, c Checkpoint) error {
	key := checkpointKey(c.Partition)
	for range 5 {
		e, err := kv.Get(ctx, key)
		var rev uint64
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
		case err != nil:
			return fmt.Errorf("checkpoint of partition %d: %w", c.Partition, err)
		default:
			var old Checkpoint
			if json.Unmarshal(e.Value(), &old) == nil && (old.Size > c.Size || (old.Size == c.Size && !old.At.Before(c.At))) {
				return nil // a later one is there
			}
			rev = e.Revision()
		}
		if rev == 0 {
			_, err = kv.Create(ctx, key, c.canonical(true))
		} else {
			_, err = kv.Update(ctx, key, c.canonical(true), rev)
		}
		if err == nil {
			return nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) && !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			// ErrKeyRevisionMismatch (and on R1 ErrKeyExists) means another
			// worker stored one first: read it again.
			var apiErr *jetstream.APIError
			if !errors.As(err, &apiErr) || apiErr.ErrorCode != jetstream.JSErrCodeStreamWrongLastSequence {
				return fmt.Errorf("store the checkpoint of partition %d: %w", c.Partition, err)
			}
		}
	}
	return nil
}

// LatestCheckpoints returns the latest checkpoints the workers stored
// (StoreCheckpoints), sorted by partition; none when there are none.
func LatestCheckpoints(ctx context.Context, js jetstream.JetStream, names intent.Names) ([]Checkpoint, error) {
	kv, err := js.KeyValue(ctx, names.AuditKeys)
	if err != nil {
		return nil, fmt.Errorf("audit keys bucket %s: %w", names.AuditKeys, err)
	}
	var cps []Checkpoint
	for p := 0; p < intent.MaxPartitions; p++ {
		e, err := kv.Get(ctx, checkpointKey(p))
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("checkpoint of partition %d: %w", p, err)
		}
		var c Checkpoint
		if err := json.Unmarshal(e.Value(), &c); err != nil {
			return nil, fmt.Errorf("%w: stored checkpoint of partition %d: %w", ErrInvalid, p, err)
		}
		cps = append(cps, c)
		if p+1 >= c.Partitions {
			break
		}
	}
	return cps, nil
}

// CheckpointSubject is the subject a worker answers with fresh
// checkpoints (a CheckpointFile) on request: "idem.checkpoint".
func CheckpointSubject(names intent.Names) string {
	return strings.ToLower(names.Prefix) + ".checkpoint"
}

// RequestCheckpoints asks the workers for fresh checkpoints of every
// partition (one worker answers, and stores them). It returns an error
// matching nats.ErrNoResponders when no worker listens.
func RequestCheckpoints(ctx context.Context, nc *nats.Conn, names intent.Names) ([]Checkpoint, error) {
	m, err := nc.RequestWithContext(ctx, CheckpointSubject(names), nil)
	if err != nil {
		return nil, fmt.Errorf("request checkpoints on %s: %w", CheckpointSubject(names), err)
	}
	if e := m.Header.Get("Idem-Error"); e != "" {
		return nil, fmt.Errorf("request checkpoints: the worker answered: %s", e)
	}
	return ParseCheckpoints(m.Data)
}

// MarshalCheckpoints is cps as a CheckpointFile on one line.
func MarshalCheckpoints(cps []Checkpoint) []byte {
	b := []byte(`{"checkpoints":[`)
	for i, c := range cps {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, c.canonical(true)...)
	}
	return append(b, ']', '}')
}
