package audit

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// b64 is the encoding of keys and signatures: base64url without padding.
var b64 = base64.RawURLEncoding

// KeyID is the id of an Ed25519 public key: the first 16 hex digits of
// its SHA-256. Events and seals name their signer by it.
func KeyID(pub ed25519.PublicKey) string {
	sum := sha256.Sum256(pub)
	return hex.EncodeToString(sum[:8])
}

// PublicKey is a public signing key as a keys file lists it, with the time
// it is valid for: an event signed by it must have happened in
// [NotBefore, NotAfter) — either bound zero means open.
type PublicKey struct {
	// ID is KeyID of Key.
	ID string `json:"id"`
	// Key is the raw 32-byte Ed25519 public key, base64url without padding.
	Key string `json:"public_key"`
	// Holder names the worker that made or uses the key (informational).
	Holder    string    `json:"holder,omitempty"`
	NotBefore time.Time `json:"not_before,omitzero"`
	NotAfter  time.Time `json:"not_after,omitzero"`
}

// decode checks k and returns its key.
func (k PublicKey) decode() (ed25519.PublicKey, error) {
	raw, err := b64.DecodeString(k.Key)
	if err != nil || len(raw) != ed25519.PublicKeySize {
		return nil, fmt.Errorf("%w: key %s: public_key is not 32 bytes of base64url", ErrInvalid, k.ID)
	}
	pub := ed25519.PublicKey(raw)
	if id := KeyID(pub); id != k.ID {
		return nil, fmt.Errorf("%w: key %s: its public_key has id %s: correct the id", ErrInvalid, k.ID, id)
	}
	if !k.NotAfter.IsZero() && !k.NotAfter.After(k.NotBefore) {
		return nil, fmt.Errorf("%w: key %s: not_after %s is not after not_before", ErrInvalid, k.ID, k.NotAfter.Format(time.RFC3339))
	}
	return pub, nil
}

// KeySet is the public keys a verifier trusts. The zero value trusts none.
type KeySet struct {
	keys map[string]keyEntry
}

type keyEntry struct {
	info PublicKey
	pub  ed25519.PublicKey
}

// keysFile is the JSON of a keys file.
type keysFile struct {
	Keys []PublicKey `json:"keys"`
}

// NewKeySet returns the set of keys. A key listed twice (by id) keeps its
// last listing.
func NewKeySet(keys ...PublicKey) (*KeySet, error) {
	ks := &KeySet{keys: make(map[string]keyEntry, len(keys))}
	for _, k := range keys {
		if err := ks.Add(k); err != nil {
			return nil, err
		}
	}
	return ks, nil
}

// Add adds k to the set, or replaces the key of its id.
func (ks *KeySet) Add(k PublicKey) error {
	pub, err := k.decode()
	if err != nil {
		return err
	}
	if ks.keys == nil {
		ks.keys = map[string]keyEntry{}
	}
	ks.keys[k.ID] = keyEntry{info: k, pub: pub}
	return nil
}

// ParseKeys reads a keys file: {"keys": [{"id", "public_key", "holder",
// "not_before", "not_after"}, ...]}.
func ParseKeys(data []byte) (*KeySet, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var f keysFile
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("%w: keys file: %w: write {\"keys\": [{\"id\": ..., \"public_key\": ...}]}", ErrInvalid, err)
	}
	return NewKeySet(f.Keys...)
}

// LoadKeys reads the keys file at path (see ParseKeys).
func LoadKeys(path string) (*KeySet, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("audit: keys file: %w", err)
	}
	ks, err := ParseKeys(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return ks, nil
}

// Keys returns the set's keys, by id.
func (ks *KeySet) Keys() []PublicKey {
	var out []PublicKey
	for _, e := range ks.keys {
		out = append(out, e.info)
	}
	slices.SortFunc(out, func(a, b PublicKey) int { return strings.Compare(a.ID, b.ID) })
	return out
}

// Len is the number of keys in the set.
func (ks *KeySet) Len() int {
	if ks == nil {
		return 0
	}
	return len(ks.keys)
}

// MarshalJSON writes the set as a keys file.
func (ks *KeySet) MarshalJSON() ([]byte, error) {
	f := keysFile{Keys: ks.Keys()}
	if f.Keys == nil {
		f.Keys = []PublicKey{}
	}
	return json.Marshal(f)
}

// lookup returns the key id names, valid at at. It returns an error
// matching ErrUnknownSigner or ErrKeyNotValid.
func (ks *KeySet) lookup(id string, at time.Time) (ed25519.PublicKey, error) {
	if ks == nil {
		return nil, fmt.Errorf("%w: %q (no keys given)", ErrUnknownSigner, id)
	}
	e, ok := ks.keys[id]
	if !ok {
		return nil, fmt.Errorf("%w: %q is not among the %d keys given", ErrUnknownSigner, id, len(ks.keys))
	}
	if (!e.info.NotBefore.IsZero() && at.Before(e.info.NotBefore)) || (!e.info.NotAfter.IsZero() && !at.Before(e.info.NotAfter)) {
		return nil, fmt.Errorf("%w: key %s is valid %s, the event is of %s", ErrKeyNotValid, id, validity(e.info), at.UTC().Format(time.RFC3339Nano))
	}
	return e.pub, nil
}

// validity describes k's validity: "[not_before, not_after)", either end
// open when zero.
func validity(k PublicKey) string {
	from, to := "-∞", "∞"
	if !k.NotBefore.IsZero() {
		from = k.NotBefore.UTC().Format(time.RFC3339)
	}
	if !k.NotAfter.IsZero() {
		to = k.NotAfter.UTC().Format(time.RFC3339)
	}
	return "[" + from + ", " + to + ")"
}

// Signer signs events and seals with one Ed25519 private key. It is safe
// for concurrent use.
type Signer struct {
	priv ed25519.PrivateKey
	id   string
}

// NewSigner returns a signer with priv.
func NewSigner(priv ed25519.PrivateKey) (*Signer, error) {
	if len(priv) != ed25519.PrivateKeySize {
		return nil, fmt.Errorf("%w: an Ed25519 private key is %d bytes, not %d", ErrInvalid, ed25519.PrivateKeySize, len(priv))
	}
	return &Signer{priv: priv, id: KeyID(priv.Public().(ed25519.PublicKey))}, nil
}

// GenerateSigner returns a signer with a new random key, kept nowhere.
func GenerateSigner() (*Signer, error) {
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("audit: generate key: %w", err)
	}
	return NewSigner(priv)
}

// ID is the signer's key id (KeyID).
func (s *Signer) ID() string { return s.id }

// Public returns the signer's public key, valid from notBefore (zero:
// always), for a keys file.
func (s *Signer) Public(holder string, notBefore time.Time) PublicKey {
	return PublicKey{ID: s.id, Key: b64.EncodeToString(s.priv.Public().(ed25519.PublicKey)), Holder: holder, NotBefore: notBefore.UTC()}
}

func (s *Signer) sign(msg []byte) string { return b64.EncodeToString(ed25519.Sign(s.priv, msg)) }

// pemType is the PEM block of a key file: PKCS #8, as openssl genpkey
// -algorithm ed25519 writes it.
const pemType = "PRIVATE KEY"

// LoadOrCreateSigner reads the Ed25519 private key at path (PKCS #8 PEM,
// what openssl genpkey -algorithm ed25519 writes) or, when there is no
// file there, makes a new key and writes it there (mode 0600, its
// directory created 0700); created reports that. Two processes creating
// the same path at once agree on one key.
func LoadOrCreateSigner(path string) (s *Signer, created bool, err error) {
	s, err = loadSigner(path)
	if !errors.Is(err, fs.ErrNotExist) {
		return s, false, err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, false, fmt.Errorf("audit: key %s: %w", path, err)
	}
	s, err = GenerateSigner()
	if err != nil {
		return nil, false, err
	}
	der, err := x509.MarshalPKCS8PrivateKey(s.priv)
	if err != nil {
		return nil, false, fmt.Errorf("audit: key %s: %w", path, err)
	}
	// Written aside and linked into place: a reader never sees half a key,
	// and of two processes creating it at once one links first and the
	// other reads its key.
	tmp, err := os.CreateTemp(filepath.Dir(path), ".audit-key-*")
	if err != nil {
		return nil, false, fmt.Errorf("audit: key %s: %w", path, err)
	}
	defer func() { _ = os.Remove(tmp.Name()) }()
	if err := tmp.Chmod(0o600); err != nil {
		_ = tmp.Close()
		return nil, false, fmt.Errorf("audit: key %s: %w", path, err)
	}
	_, werr := tmp.Write(pem.EncodeToMemory(&pem.Block{Type: pemType, Bytes: der}))
	if err := errors.Join(werr, tmp.Sync(), tmp.Close()); err != nil {
		return nil, false, fmt.Errorf("audit: key %s: %w", path, err)
	}
	if err := os.Link(tmp.Name(), path); err != nil {
		if errors.Is(err, fs.ErrExist) {
			s, err = loadSigner(path)
			return s, false, err
		}
		return nil, false, fmt.Errorf("audit: key %s: %w", path, err)
	}
	return s, true, nil
}

func loadSigner(path string) (*Signer, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("audit: key %s: %w", path, err)
	}
	block, _ := pem.Decode(data)
	if block == nil || block.Type != pemType {
		return nil, fmt.Errorf("%w: key %s: not a PEM %q block: give an Ed25519 key in PKCS #8 (openssl genpkey -algorithm ed25519)", ErrInvalid, path, pemType)
	}
	key, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%w: key %s: %w", ErrInvalid, path, err)
	}
	priv, ok := key.(ed25519.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("%w: key %s: a %T, not an Ed25519 key (openssl genpkey -algorithm ed25519)", ErrInvalid, path, key)
	}
	return NewSigner(priv)
}
