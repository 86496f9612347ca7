package jsbackend

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
)

// Leaders returns the server name leading each bucket's stream, in order
// ("" for a bucket whose leader is not known, e.g. on a server without
// clustering).
func Leaders(ctx context.Context, bs []*Bucket) ([]string, error) {
	infos, err := streamInfos(ctx, bs)
	if err != nil {
		return nil, err
	}
	leaders := make([]string, len(infos))
	for i, si := range infos {
		if si.Cluster != nil {
			leaders[i] = si.Cluster.Leader
		}
	}
	return leaders, nil
}

func streamInfos(ctx context.Context, bs []*Bucket) ([]*jetstream.StreamInfo, error) {
	infos := make([]*jetstream.StreamInfo, len(bs))
	for i, b := range bs {
		s, err := b.js.Stream(ctx, streamName(b.Name()))
		if err != nil {
			return nil, fmt.Errorf("partition %d: %w", i, err)
		}
		infos[i] = s.CachedInfo()
	}
	return infos, nil
}

// SpreadLeaders asks the cluster to move the leaders of bs's streams off
// the servers leading more than their share (N buckets over S servers: at
// most ceil(N/S) each), each to the least-loaded current replica of its
// stream, with a leader step-down naming that server as preferred. It
// returns how many step-downs it asked for; the elections finish after it
// returns. Not replicated, or with a stream without a leader now, it does
// nothing.
func SpreadLeaders(ctx context.Context, bs []*Bucket) (int, error) {
	infos, err := streamInfos(ctx, bs)
	if err != nil {
		return 0, err
	}
	load := map[string]int{}
	for _, si := range infos {
		if si.Cluster == nil || si.Cluster.Leader == "" || len(si.Cluster.Replicas) == 0 {
			return 0, nil // not replicated, or no leader now: nothing to spread
		}
		load[si.Cluster.Leader]++
		for _, r := range si.Cluster.Replicas {
			load[r.Name] += 0
		}
	}
	share := (len(bs) + len(load) - 1) / len(load)
	moved := 0
	for i, si := range infos {
		leader := si.Cluster.Leader
		if load[leader] <= share {
			continue
		}
		var to string
		for _, r := range si.Cluster.Replicas {
			if r.Current && !r.Offline && load[r.Name] < share && (to == "" || load[r.Name] < load[to]) {
				to = r.Name
			}
		}
		if to == "" {
			continue
		}
		if err := bs[i].StepDown(ctx, to); err != nil {
			return moved, fmt.Errorf("partition %d (%s) to %s: %w", i, bs[i].Name(), to, err)
		}
		load[leader]--
		load[to]++
		moved++
	}
	return moved, nil
}

// StepDown asks the leader of the bucket's stream to hand over to server.
func (b *Bucket) StepDown(ctx context.Context, server string) error {
	ctx, cancel := b.withTimeout(ctx)
	defer cancel()
	req, err := json.Marshal(map[string]any{"placement": map[string]string{"preferred": server}})
	if err != nil {
		return err
	}
	msg, err := b.nc.RequestWithContext(ctx, b.api+"STREAM.LEADER.STEPDOWN."+streamName(b.Name()), req)
	if err != nil {
		return err
	}
	var resp struct {
		Error   *jetstream.APIError `json:"error,omitempty"`
		Success bool                `json:"success"`
	}
	if err := json.Unmarshal(msg.Data, &resp); err != nil {
		return fmt.Errorf("decode step-down response: %w", err)
	}
	if resp.Error != nil {
		return resp.Error
	}
	if !resp.Success {
		return fmt.Errorf("step-down not done: %s", msg.Data)
	}
	return nil
}
