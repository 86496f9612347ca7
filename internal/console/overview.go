package console

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"go.uber.org/zap"

	"github.com/idemgate/idemgate/internal/auth"
	"github.com/idemgate/idemgate/pkg/dedup"
	"github.com/idemgate/idemgate/pkg/intent"
)

// The overview's rates come from the workers' Prometheus metrics: the
// ledger records neither replays nor conflicts (a duplicate costs no write,
// by design), so only the workers' counters have all five. The front door
// reads every worker's /metrics (Config.WorkerMetrics) once per
// Config.WorkerMetricsEvery and keeps the last rateBuckets intervals of
// per-tool increases in memory. The counters carry no session, so the
// rates are shown to operators of every namespace only.

// rateBuckets is how many intervals the overview charts: an hour at the
// default interval of a minute.
const rateBuckets = 60

// scrapeTimeout bounds one read of a worker's metrics.
const scrapeTimeout = 5 * time.Second

// rateNames are the charted counters, in chart order, and their metric
// names (a counter with several series per tool, such as failures by kind,
// is summed).
var rateNames = []struct{ Label, Metric string }{
	{"fired", "idemgate_effects_fired_total"},
	{"replayed", "idemgate_replays_total"},
	{"conflicts", "idemgate_conflicts_total"},
	{"failures", "idemgate_effect_failures_total"},
	{"takeovers", "idemgate_lease_takeovers_total"},
}

// rateSampler reads the workers' counters and keeps their recent
// increases.
type rateSampler struct {
	urls  []string
	every time.Duration
	hc    *http.Client
	log   *zap.Logger

	mu      sync.Mutex
	last    map[string]map[rateSeries]float64 // per URL: the previous read
	buckets []rateBucket                      // oldest first
	errs    map[string]string                 // per URL: the last read's error
}

type rateSeries struct {
	tool   string
	metric int
}

// rateBucket is one interval's increases, per tool and counter.
type rateBucket struct {
	at  time.Time
	inc map[string][]float64
}

func newRateSampler(urls []string, every time.Duration, log *zap.Logger) *rateSampler {
	return &rateSampler{urls: urls, every: every, log: log, hc: &http.Client{Timeout: scrapeTimeout},
		last: map[string]map[rateSeries]float64{}, errs: map[string]string{}}
}

// run reads the counters now and every interval until ctx ends.
func (rs *rateSampler) run(ctx context.Context) {
	rs.sample(ctx)
	t := time.NewTicker(rs.every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			rs.sample(ctx)
		}
	}
}

// sample reads every worker and records the increases since its previous
// read (a counter that went down belongs to a restarted worker: its value
// is the increase).
func (rs *rateSampler) sample(ctx context.Context) {
	b := rateBucket{at: time.Now(), inc: map[string][]float64{}}
	for _, u := range rs.urls {
		cur, err := rs.read(ctx, u)
		rs.mu.Lock()
		if err != nil {
			rs.errs[u] = err.Error()
			rs.mu.Unlock()
			rs.log.Debug("console: worker metrics", zap.String("url", u), zap.Error(err))
			continue
		}
		delete(rs.errs, u)
		prev, seen := rs.last[u]
		rs.last[u] = cur
		rs.mu.Unlock()
		if !seen {
			continue // the first read is the baseline
		}
		for s, v := range cur {
			inc := v - prev[s]
			if inc < 0 {
				inc = v
			}
			if b.inc[s.tool] == nil {
				b.inc[s.tool] = make([]float64, len(rateNames))
			}
			b.inc[s.tool][s.metric] += inc
		}
	}
	rs.mu.Lock()
	rs.buckets = append(rs.buckets, b)
	if len(rs.buckets) > rateBuckets {
		rs.buckets = rs.buckets[len(rs.buckets)-rateBuckets:]
	}
	rs.mu.Unlock()
}

// read fetches one worker's charted counters, per tool.
func (rs *rateSampler) read(ctx context.Context, u string) (map[rateSeries]float64, error) {
	ctx, cancel := context.WithTimeout(ctx, scrapeTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "text/plain")
	resp, err := rs.hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s answered %s", u, resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	families, err := p.TextToMetricFamilies(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return nil, fmt.Errorf("%s: not Prometheus text: %w", u, err)
	}
	out := map[rateSeries]float64{}
	for i, rn := range rateNames {
		f := families[rn.Metric]
		if f == nil {
			continue
		}
		for _, m := range f.GetMetric() {
			tool := ""
			for _, l := range m.GetLabel() {
				if l.GetName() == "tool" {
					tool = l.GetValue()
				}
			}
			if tool != "" && m.GetCounter() != nil {
				out[rateSeries{tool, i}] += m.GetCounter().GetValue()
			}
		}
	}
	return out, nil
}

// rateChart is one counter of one tool, drawn as bars.
type rateChart struct {
	Label string
	Total float64
	Peak  float64
	Bars  []rateBar
}

// rateBar is one interval's bar, in the chart's coordinates (120 × 32).
type rateBar struct {
	X, Y, W, H float64
	N          float64
	At         string
}

// rateTool is one tool's charts.
type rateTool struct {
	Tool   string
	Charts []rateChart
}

// rateView is what the overview shows of the rates.
type rateView struct {
	Tools   []rateTool
	Every   time.Duration
	Span    time.Duration // what the charts cover
	Samples int
	Errors  []string
}

// view draws the charts of the intervals kept.
func (rs *rateSampler) view() rateView {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	v := rateView{Every: rs.every, Span: rs.every * rateBuckets, Samples: len(rs.buckets)}
	for u, e := range rs.errs {
		v.Errors = append(v.Errors, u+": "+e)
	}
	slices.Sort(v.Errors)
	tools := map[string]bool{}
	for _, b := range rs.buckets {
		for t := range b.inc {
			tools[t] = true
		}
	}
	names := make([]string, 0, len(tools))
	for t := range tools {
		names = append(names, t)
	}
	slices.Sort(names)
	const width, height = 120.0, 32.0
	barW := width / rateBuckets
	offset := rateBuckets - len(rs.buckets) // the charts fill from the right
	for _, t := range names {
		rt := rateTool{Tool: t}
		for i, rn := range rateNames {
			ch := rateChart{Label: rn.Label}
			for _, b := range rs.buckets {
				if inc := b.inc[t]; inc != nil {
					ch.Total += inc[i]
					ch.Peak = max(ch.Peak, inc[i])
				}
			}
			for j, b := range rs.buckets {
				n := 0.0
				if inc := b.inc[t]; inc != nil {
					n = inc[i]
				}
				if n == 0 || ch.Peak == 0 {
					continue
				}
				h := max(height*n/ch.Peak, 1)
				ch.Bars = append(ch.Bars, rateBar{X: float64(offset+j) * barW, Y: height - h, W: barW * 0.8, H: h, N: n,
					At: b.at.UTC().Format("15:04:05")})
			}
			rt.Charts = append(rt.Charts, ch)
		}
		v.Tools = append(v.Tools, rt)
	}
	return v
}

// ageBands are the overview's ages of unresolved records.
var ageBands = []struct {
	Label string
	Under time.Duration
}{
	{"under 1 min", time.Minute},
	{"1–10 min", 10 * time.Minute},
	{"10–60 min", time.Hour},
	{"1–24 h", 24 * time.Hour},
	{"over 24 h", 1 << 62},
}

// ageRow is one state's unresolved records by age.
type ageRow struct {
	Status intent.Status
	Bands  []int
	Total  int
	Oldest time.Time
	Key    string // the oldest one's
}

// overviewData is the overview page's.
type overviewData struct {
	Rates     *rateView
	RatesNote string
	Bands     []string
	Rows      []ageRow
	Complete  bool
	Error     string
}

// overview shows the workers' rates per tool over the last hour and the
// unresolved records by state and age.
func (c *Console) overview(w http.ResponseWriter, r *http.Request, sess *consoleSession) {
	d := overviewData{}
	switch {
	case c.rates == nil:
		d.RatesNote = "No rates: the front door reads the workers' metrics only when started with --worker-metrics (each worker's /metrics URL; the worker serves them with --admin-addr)."
	case sess.tok.Namespace != auth.AllNamespaces:
		d.RatesNote = fmt.Sprintf("The rates come from the workers' metrics, which count every namespace's operations; they are shown to operators of every namespace (*), and %s's is %s.", sess.tok.Name, sess.tok.Namespace)
	default:
		v := c.rates.view()
		d.Rates = &v
	}
	for _, b := range ageBands {
		d.Bands = append(d.Bands, b.Label)
	}
	recs, complete, err := c.scan(r.Context())
	if err != nil {
		d.Error = fmt.Sprintf("The ledger cannot be read: %v", err)
	}
	d.Complete = complete
	now := time.Now()
	rows := map[intent.Status]*ageRow{}
	for _, s := range dedup.OpenStatuses {
		rows[s] = &ageRow{Status: s, Bands: make([]int, len(ageBands))}
	}
	for _, rec := range reaching(sess.tok, recs) {
		row := rows[rec.Status]
		if row == nil {
			continue
		}
		age := now.Sub(rec.CreatedAt)
		for i, b := range ageBands {
			if age < b.Under {
				row.Bands[i]++
				break
			}
		}
		row.Total++
		if row.Oldest.IsZero() || rec.CreatedAt.Before(row.Oldest) {
			row.Oldest, row.Key = rec.CreatedAt, rec.Key
		}
	}
	for _, s := range dedup.OpenStatuses {
		d.Rows = append(d.Rows, *rows[s])
	}
	c.render(w, r, sess, http.StatusOK, "overview", d)
}

// StatusLabel is a status as the pages say it.
func StatusLabel(s intent.Status) string { return strings.ReplaceAll(string(s), "_", " ") }
