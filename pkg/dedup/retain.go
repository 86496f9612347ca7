package dedup

import (
	"context"
	"errors"
	"fmt"

	"github.com/idemgate/idemgate/pkg/dedup/internal/jsbackend"
)

// Untimed reports whether r is a final record (completed, failed, denied)
// with no per-message TTL: one written before final records carried their
// retention (when the bucket's age limit expired every record). It would
// never expire; Ledger.Retain gives it its TTL.
func (r Listed) Untimed() bool { return r.Status.Final() && r.ttl == 0 }

// Retain writes the untimed final record r again with the TTL it should have
// had: what is left of its retention (its own, else the ledger's) since the record was last
// written, at least a second. It is a compare-and-set on r's revision: a
// record written since keeps that write, and Retain returns nil. A record
// that is not untimed is left alone. It returns ErrInvalid for a key the
// ledger's layout cannot store.
func (l *Ledger) Retain(ctx context.Context, r Listed) error {
	if !r.Untimed() {
		return nil
	}
	s, err := l.slot(r.Key)
	if err != nil {
		return fmt.Errorf("retain %s: %w", r.Key, err)
	}
	rec := r.Record
	data, err := rec.marshal()
	if err != nil {
		return fmt.Errorf("retain %s: %w", r.Key, err)
	}
	ttl := r.restOf(l.policy.retentionOf(rec), l.clock())
	if _, err := s.bucket.Update(ctx, s.key, data, r.Revision, ttl, jsbackend.Alone); err != nil && !errors.Is(err, jsbackend.ErrRevision) {
		return fmt.Errorf("retain %s: %w", r.Key, err)
	}
	return nil
}
