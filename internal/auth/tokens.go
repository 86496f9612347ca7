package auth

import (
	"bufio"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"strings"
)

// Roles a token may have.
const (
	// RoleAgent calls tools, reads the catalogue and reads its own
	// operations.
	RoleAgent = "agent"
	// RoleOperator may also list, decide, forget and replay.
	RoleOperator = "operator"
)

// AllNamespaces is the namespace of an operator token that reaches every
// session.
const AllNamespaces = "*"

// ErrTokens is matched by errors.Is for every problem in a tokens file.
var ErrTokens = errors.New("auth: tokens")

var (
	hashPattern      = regexp.MustCompile(`^[0-9a-f]{64}$`)
	namespacePattern = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,64}$`)
	namePattern      = regexp.MustCompile(`^[A-Za-z0-9_.@-]{1,64}$`)
)

// Token is one caller the front doors know.
type Token struct {
	// Name identifies the caller in logs and in the decisions it records.
	Name string
	// Role is RoleAgent or RoleOperator.
	Role string
	// Namespace scopes the caller's sessions: its calls run in sessions
	// "<namespace>" or "<namespace>/<session>", and it reaches only records
	// of those sessions. AllNamespaces (operators only) reaches every
	// session, and its calls use the session as given.
	Namespace string
	hash      string
}

// Tokens is the set of tokens, looked up by the SHA-256 of the token.
type Tokens struct {
	byHash map[string]*Token
}

// Len is the number of tokens (0 for nil).
func (ts *Tokens) Len() int {
	if ts == nil {
		return 0
	}
	return len(ts.byHash)
}

// Lookup returns the token whose SHA-256 is that of secret.
func (ts *Tokens) Lookup(secret string) (*Token, bool) {
	sum := sha256.Sum256([]byte(secret))
	t, ok := ts.byHash[hex.EncodeToString(sum[:])]
	return t, ok
}

// LoadTokens reads a tokens file (see ParseTokens).
func LoadTokens(path string) (*Tokens, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrTokens, err)
	}
	defer f.Close()
	ts, err := ParseTokens(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return ts, nil
}

// ParseTokens reads tokens, one per line:
//
//	<sha256 of the token, 64 lowercase hex digits> <agent|operator> <namespace> [name]
//
// Blank lines and lines starting with # are ignored. The namespace is 1-64
// letters, digits, '_', '.' or '-', or * for an operator that reaches every
// session. The name defaults to "token-" and the hash's first 8 digits;
// names and hashes are unique. The file holds no secret: only hashes.
func ParseTokens(r io.Reader) (*Tokens, error) {
	ts := &Tokens{byHash: map[string]*Token{}}
	names := map[string]int{}
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		if len(f) < 3 || len(f) > 4 {
			return nil, fmt.Errorf("%w: line %d: want <sha256-hex> <agent|operator> <namespace> [name], got %d fields", ErrTokens, n, len(f))
		}
		t := &Token{hash: f[0], Role: f[1], Namespace: f[2], Name: "token-" + f[0][:min(8, len(f[0]))]}
		if len(f) == 4 {
			t.Name = f[3]
		}
		switch {
		case !hashPattern.MatchString(t.hash):
			return nil, fmt.Errorf("%w: line %d: %q is not a SHA-256 in lowercase hex (gateway token prints one)", ErrTokens, n, clip(t.hash))
		case t.Role != RoleAgent && t.Role != RoleOperator:
			return nil, fmt.Errorf("%w: line %d: role %q: use agent or operator", ErrTokens, n, clip(t.Role))
		case t.Namespace == AllNamespaces && t.Role != RoleOperator:
			return nil, fmt.Errorf("%w: line %d: namespace * is for operators: give the agent its own namespace", ErrTokens, n)
		case t.Namespace != AllNamespaces && !namespacePattern.MatchString(t.Namespace):
			return nil, fmt.Errorf("%w: line %d: namespace %q: use 1-64 letters, digits, '_', '.' or '-' (or * for an operator)", ErrTokens, n, clip(t.Namespace))
		case !namePattern.MatchString(t.Name):
			return nil, fmt.Errorf("%w: line %d: name %q: use 1-64 letters, digits, '_', '.', '@' or '-'", ErrTokens, n, clip(t.Name))
		case ts.byHash[t.hash] != nil:
			return nil, fmt.Errorf("%w: line %d: the same token as line %d", ErrTokens, n, names[ts.byHash[t.hash].Name])
		case names[t.Name] != 0:
			return nil, fmt.Errorf("%w: line %d: name %q is already used on line %d", ErrTokens, n, t.Name, names[t.Name])
		}
		ts.byHash[t.hash] = t
		names[t.Name] = n
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrTokens, err)
	}
	if len(ts.byHash) == 0 {
		return nil, fmt.Errorf("%w: no tokens: add a line per caller (gateway token prints one)", ErrTokens)
	}
	return ts, nil
}

// NewToken returns a fresh random token (256 bits, prefixed "idg_" so that
// secret scanners can spot it) and the line of a tokens file that admits
// it.
func NewToken(role, namespace, name string) (secret, line string, err error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", "", err
	}
	secret = "idg_" + base64.RawURLEncoding.EncodeToString(b)
	sum := sha256.Sum256([]byte(secret))
	line = hex.EncodeToString(sum[:]) + " " + role + " " + namespace
	if name != "" {
		line += " " + name
	}
	if _, err := ParseTokens(strings.NewReader(line)); err != nil {
		return "", "", err
	}
	return secret, line, nil
}

// clip shortens s for an error message.
func clip(s string) string {
	if len(s) > 40 {
		return s[:40] + "…"
	}
	return s
}

// Hash is the SHA-256 of t's secret in hex: it tells tokens apart without
// the secret.
func (t *Token) Hash() string { return t.hash }

// Scope is the session a call of t runs in, for the session it asked for:
// "<namespace>" for none, "<namespace>/<session>" otherwise; an operator of
// every namespace runs in the session as given.
func (t *Token) Scope(session string) string {
	switch {
	case t.Namespace == AllNamespaces:
		return session
	case session == "":
		return t.Namespace
	}
	return t.Namespace + "/" + session
}

// Reaches reports whether t may see and act on records of session.
func (t *Token) Reaches(session string) bool {
	return t.Namespace == AllNamespaces || session == t.Namespace || strings.HasPrefix(session, t.Namespace+"/")
}
