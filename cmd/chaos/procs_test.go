package main

import (
	"context"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Every start of a supervised worker is a holder of its own name and log,
// and a kill names the holder it killed.
func TestSupervisorNamesEachStart(t *testing.T) {
	t.Parallel()
	sleep, err := exec.LookPath("sleep")
	require.NoError(t, err)
	dir := t.TempDir()
	s := &supervisor{name: "w2", delay: 10 * time.Millisecond, spawn: func(holder string) *proc {
		return &proc{name: holder, path: sleep, args: []string{"60"}, log: filepath.Join(dir, holder+".log")}
	}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.run(ctx) }()
	t.Cleanup(func() {
		cancel()
		s.stop(5 * time.Second)
		require.NoError(t, <-done)
	})

	running := func(holder string) func() bool {
		return func() bool { p := s.current(); return p != nil && p.name == holder && p.running() }
	}
	require.Eventually(t, running("w2.1"), 10*time.Second, 10*time.Millisecond)
	holder, ok := s.kill()
	require.True(t, ok)
	require.Equal(t, "w2.1", holder)
	require.Eventually(t, running("w2.2"), 10*time.Second, 10*time.Millisecond, "started again as a new holder")
	holder, ok = s.kill()
	require.True(t, ok)
	require.Equal(t, "w2.2", holder)
	require.Eventually(t, running("w2.3"), 10*time.Second, 10*time.Millisecond)

	logs := s.logs()
	require.Len(t, logs, 3)
	for i, want := range []string{"w2.1", "w2.2", "w2.3"} {
		require.Equal(t, workerLog{holder: want, path: filepath.Join(dir, want+".log")}, logs[i])
	}
	require.Zero(t, s.unexpectedExits(), "both exits were kills")
}
