package client

import (
	"context"
	"fmt"
)

// DeadLetter reads dead letter seq. It returns an error matching
// jetstream.ErrMsgNotFound when there is none (replayed, or never).
func (c *Client) DeadLetter(ctx context.Context, seq uint64) (DeadLetter, error) {
	s, err := c.js.Stream(ctx, c.names.DLQStream)
	if err != nil {
		return DeadLetter{}, fmt.Errorf("client: dead-letter stream %s: %w", c.names.DLQStream, err)
	}
	m, err := s.GetMsg(ctx, seq)
	if err != nil {
		return DeadLetter{}, fmt.Errorf("client: dead letter %d: %w", seq, err)
	}
	return deadLetterOf(m), nil
}
