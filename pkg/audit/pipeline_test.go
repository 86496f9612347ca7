package audit

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/stretchr/testify/require"
)

// verifyWays verifies data the long way on one goroutine, the fast way on
// one, and the fast way with workers, and checks that the three agree
// (report, break or error); it returns the report.
func verifyWays(t *testing.T, data []byte, keys *KeySet, opts ...VerifyOption) *Report {
	t.Helper()
	open := func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil }
	var want *Report
	var wantErr error
	for i, way := range [][]VerifyOption{{withSlowPath(), withWorkers(1)}, {withWorkers(1)}, {withWorkers(3)}} {
		r, err := Verify(open, keys, append(append([]VerifyOption{}, opts...), way...)...)
		if i == 0 {
			want, wantErr = r, err
			continue
		}
		if fmt.Sprint(err) != fmt.Sprint(wantErr) {
			t.Fatalf("way %d: error %v, the long way's %v", i, err, wantErr)
		}
		if r != nil && fmt.Sprint(r.Break) != fmt.Sprint(want.Break) {
			t.Fatalf("way %d: break\n%v\nthe long way's:\n%v", i, r.Break, want.Break)
		}
		require.Equal(t, want, r, "way %d", i)
	}
	return want
}

// tamper is a change to a trail's lines.
type tamper struct {
	name string
	f    func(lines [][]byte, i int) [][]byte
}

var tampers = []tamper{
	{"none", func(l [][]byte, _ int) [][]byte { return l }},
	{"drop", func(l [][]byte, i int) [][]byte { return append(l[:i:i], l[i+1:]...) }},
	{"swap", func(l [][]byte, i int) [][]byte { l[i], l[i+4] = l[i+4], l[i]; return l }},
	{"repeat", func(l [][]byte, i int) [][]byte { return append(l[:i+1:i+1], l[i:]...) }},
	{"garbage", func(l [][]byte, i int) [][]byte { l[i] = []byte(`{"partition":1,"pos":`); return l }},
	{"space", func(l [][]byte, i int) [][]byte { l[i] = append([]byte(" "), l[i]...); return l }},
	{"edit", func(l [][]byte, i int) [][]byte {
		l[i] = bytes.Replace(l[i], []byte(`"noop"`), []byte(`"nooq"`), 1)
		return l
	}},
	{"forge", func(l [][]byte, i int) [][]byte {
		l[i] = bytes.Replace(l[i], []byte(`"status":"completed"`), []byte(`"status":"failed"`), 1)
		return l
	}},
	{"unseal", func(l [][]byte, i int) [][]byte {
		for ; i < len(l) && !bytes.Contains(l[i], []byte(`"seal":`)); i++ {
		}
		if i < len(l) {
			l[i] = append(l[i][:bytes.Index(l[i], []byte(`,"seal":`))], '}')
		}
		return l
	}},
	{"cut", func(l [][]byte, i int) [][]byte { return append(l[:i:i], l[len(l)-1]) }},
	{"uppercase", func(l [][]byte, i int) [][]byte {
		l[i] = bytes.Replace(l[i], []byte(`"holder"`), []byte(`"Holder"`), 1)
		return l
	}},
}

// Verifying with workers, and the fast way, finds what verifying the long
// way on one goroutine finds, line, partition, position and all, wherever
// the trail breaks and however: in the first batch of lines, in the
// middle, in the last.
func TestVerifyWaysAgree(t *testing.T) {
	s := newSigner(t)
	keys := keysOf(t, s)
	trail, cps, before := benchTrail(t, s, 1200, 300)
	lines := bytes.Split(trail, []byte{'\n'})
	for _, tm := range tampers {
		for _, i := range []int{3, 700, len(lines) - 12} {
			t.Run(fmt.Sprint(tm.name, i), func(t *testing.T) {
				l := tm.f(append([][]byte{}, lines...), i)
				data := bytes.Join(l, []byte{'\n'})
				r := verifyWays(t, data, keys)
				require.NotNil(t, r)
				switch tm.name {
				case "none":
					require.Nil(t, r.Break)
					require.Len(t, r.Checkpoints, len(cps))
				case "drop", "swap", "repeat", "garbage", "space", "cut":
					require.NotNil(t, r.Break)
				}
				verifyWays(t, data, keys, From(before))
				verifyWays(t, data, keys, Partial())
			})
		}
	}
}

// failingReader reads r, then fails.
type failingReader struct{ r io.Reader }

var errDisk = errors.New("disk on fire")

func (f failingReader) Read(p []byte) (int, error) {
	n, err := f.r.Read(p)
	if err == io.EOF {
		return n, errDisk
	}
	return n, err
}

// A trail that cannot be read whole is an error, however many workers read
// it; unless a line read before the error breaks.
func TestVerifyReadError(t *testing.T) {
	s := newSigner(t)
	keys := keysOf(t, s)
	trail, _, _ := benchTrail(t, s, 1200, 300)
	for _, workers := range []int{1, 3} {
		for _, cut := range []int{10, len(trail) / 2, len(trail) - 10} {
			opens := 0
			open := func() (io.ReadCloser, error) {
				opens++
				if opens == 1 {
					return io.NopCloser(bytes.NewReader(trail)), nil
				}
				return io.NopCloser(failingReader{bytes.NewReader(trail[:cut])}), nil
			}
			r, err := Verify(open, keys, withWorkers(workers))
			require.ErrorIs(t, err, errDisk, "workers %d, cut at %d", workers, cut)
			require.Nil(t, r)
		}
		broken := bytes.Replace(trail, []byte(`"noop"`), []byte(`"nooq"`), 1)
		open := func() (io.ReadCloser, error) {
			return io.NopCloser(failingReader{bytes.NewReader(broken[:len(broken)/2])}), nil
		}
		_, err := Verify(open, keys, withWorkers(workers))
		require.ErrorIs(t, err, errDisk) // the first pass does not get to the checkpoint
		opens := 0
		open = func() (io.ReadCloser, error) {
			opens++
			if opens == 1 {
				return io.NopCloser(bytes.NewReader(broken)), nil
			}
			return io.NopCloser(failingReader{bytes.NewReader(broken[:len(broken)/2])}), nil
		}
		r, err := Verify(open, keys, withWorkers(workers))
		require.NoError(t, err)
		require.NotNil(t, r.Break)
		require.Equal(t, BreakEdited, r.Break.Kind)
	}
}

// A break stops the workers: Verify returns at once with the break, its
// goroutines gone (TestMain's goleak checks), however much trail follows.
func TestVerifyStopsAtBreak(t *testing.T) {
	s := newSigner(t)
	keys := keysOf(t, s)
	trail, _, _ := benchTrail(t, s, 1200, 300)
	broken := append([]byte("{}\n"), trail...)
	r, err := Verify(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(broken)), nil }, keys, withWorkers(4))
	require.NoError(t, err)
	require.Equal(t, &Break{Line: 1, Partition: -1, Kind: BreakMalformed, Detail: r.Break.Detail}, r.Break)
	require.Zero(t, r.Entries)
}

// The fast path reads every line of a worker's trail (the benchmark's),
// as the long way does.
func TestVerifyFastPathTaken(t *testing.T) {
	s := newSigner(t)
	keys := keysOf(t, s)
	trail, _, _ := benchTrail(t, s, 400, 100)
	fx := scanFixture{keys: keys}
	for _, line := range bytes.Split(trail, []byte{'\n'}) {
		if isCheckpointLine(line) {
			continue
		}
		require.True(t, fx.agree(t, line), "%s", line)
	}
}
