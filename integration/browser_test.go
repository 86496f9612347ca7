package integration

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"
)

// The console's tests drive a real browser: Debian's headless Chromium
// (apt-get install chromium), one process for the whole package, a tab per
// test, driven over the DevTools protocol by chromedp from Go, so that they
// run in go test beside the binaries they test. Without Chromium they skip,
// or fail when CI is set.

// screenshotDir receives every page's screenshot (ignored by git;
// docs/console.md shows copies of some).
const screenshotDir = "testdata/console"

// browser is the package's one Chromium, started by the first test that
// needs it and stopped by TestMain.
var browser struct {
	once   sync.Once
	ctx    context.Context // a chromedp context of the browser
	stop   func()
	dir    string
	err    error
	exited bool
}

// stopBrowser ends the browser, if one was started, and removes its
// profile.
func stopBrowser() {
	if browser.stop != nil {
		browser.stop()
	}
	if browser.dir != "" {
		_ = os.RemoveAll(browser.dir)
	}
}

// chromium returns the path of Debian's Chromium; a test skips without it,
// or fails when CI is set.
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") != "" {
		t.Fatal("CI is set and Chromium is missing: apt-get install -y chromium (.ci/run does)")
	}
	t.Skip("Chromium is missing (apt-get install -y chromium): the console's browser tests skip")
	return ""
}

// startBrowser starts the package's Chromium once: headless, no sandbox (the
// tests may run as root), nothing fetched from the network on its own, a
// fresh profile.
func startBrowser(t *testing.T) context.Context {
	t.Helper()
	path := chromium(t)
	browser.once.Do(func() {
		browser.dir, browser.err = os.MkdirTemp("", "idemgate-chromium-")
		if browser.err != nil {
			return
		}
		actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(),
			chromedp.ExecPath(path),
			chromedp.UserDataDir(browser.dir),
			chromedp.Flag("headless", true),
			chromedp.Flag("no-sandbox", true),
			chromedp.Flag("disable-gpu", true),
			chromedp.Flag("disable-background-networking", true),
			chromedp.Flag("disable-quic", true),
			chromedp.Flag("no-first-run", true),
			chromedp.Flag("no-default-browser-check", true),
			chromedp.Flag("disable-component-update", true),
			chromedp.Flag("disable-sync", true),
			chromedp.Flag("disable-dev-shm-usage", true),
			chromedp.Flag("hide-scrollbars", true),
			chromedp.Flag("mute-audio", true),
			chromedp.WindowSize(1280, 860),
		)
		bctx, cancelBrowser := chromedp.NewContext(actx)
		browser.ctx = bctx
		browser.stop = func() { cancelBrowser(); cancelAlloc() }
		browser.err = chromedp.Do(bctx) // starts the browser on its first tab
	})
	require.NoError(t, browser.err, "start Chromium %s", path)
	return browser.ctx
}

// tab is one browser tab of a test, logged in or not.
type tab struct {
	t    *testing.T
	ctx  context.Context
	base string // the front door's URL
	mu   sync.Mutex
	logs []string // what the page reported: exceptions, CSP refusals, failed loads
	sse  []string // the server-sent events received, when recorded
}

// openTab opens a tab on the front door at base, in a browser context of
// its own (its own cookies: a session of its own); it closes when the test
// ends, and the test fails if a page of it broke its
// Content-Security-Policy or threw.
func openTab(t *testing.T, base string) *tab {
	t.Helper()
	parent := startBrowser(t)
	tabCtx, cancel := chromedp.NewContext(parent, chromedp.WithNewBrowserContext())
	require.NoError(t, chromedp.Do(tabCtx))
	// A wait that never ends fails the test before go test's own deadline,
	// so that its screenshot and the processes' logs are shown.
	ctx := tabCtx
	if dl, ok := t.Deadline(); ok {
		var stop context.CancelFunc
		ctx, stop = context.WithDeadline(tabCtx, dl.Add(-20*time.Second))
		t.Cleanup(stop)
	}
	b := &tab{t: t, ctx: ctx, base: base}
	messages := chromedp.Console(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for m, err := range messages {
			if err != nil {
				return
			}
			b.mu.Lock()
			b.logs = append(b.logs, m.String())
			b.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		if t.Failed() {
			if png, err := chromedp.Run(tabCtx, chromedp.CaptureScreenshot()); err == nil {
				name := filepath.Join(screenshotDir, fmt.Sprintf("failed-%s-%p.png", strings.ReplaceAll(t.Name(), "/", "-"), b))
				if os.MkdirAll(screenshotDir, 0o755) == nil && os.WriteFile(name, png, 0o644) == nil {
					t.Logf("the tab's last screen: integration/%s", name)
				}
			}
		}
		cancel()
		<-done
		b.mu.Lock()
		defer b.mu.Unlock()
		for _, l := range b.logs {
			if strings.Contains(l, "Content Security Policy") || strings.Contains(l, "Uncaught") {
				t.Errorf("the page reported: %s", l)
			}
		}
	})
	return b
}

// do runs browser actions in the tab.
func (b *tab) do(steps ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	require.NoError(b.t, chromedp.Do(b.ctx, steps...))
}

// open navigates to a console path and waits for its main element.
func (b *tab) open(path string) {
	b.t.Helper()
	b.do(chromedp.Navigate(b.base+path), chromedp.WaitReady(chromedp.CSS("main")))
}

// login logs in with an operator token, as a person pastes it.
func (b *tab) login(token string) {
	b.t.Helper()
	b.open("/console/login")
	b.do(chromedp.SendKeys(chromedp.CSS(`input[name="token"]`), token),
		chromedp.Click(chromedp.CSS(`form button[type="submit"]`)),
		chromedp.WaitVisible(chromedp.CSS(`nav[aria-label="Console"]`)))
}

// text is the text of the element sel selects, once it is visible. It is
// read by one evaluation in the page, so that a live page redrawing itself
// between finding the element and reading it (which replaces the nodes
// found) does not fail the read.
func (b *tab) text(sel string) string {
	b.t.Helper()
	b.do(chromedp.WaitVisible(chromedp.CSS(sel)))
	s, err := chromedp.Run(b.ctx, chromedp.Evaluate[*string](fmt.Sprintf(`(e => e && e.innerText)(document.querySelector(%q))`, sel)))
	require.NoError(b.t, err, "text of %s", sel)
	require.NotNil(b.t, s, "no %s", sel)
	return *s
}

// attr is an attribute of the element sel selects, read as text reads.
func (b *tab) attr(sel, name string) string {
	b.t.Helper()
	b.do(chromedp.WaitReady(chromedp.CSS(sel)))
	a, err := chromedp.Run(b.ctx, chromedp.Evaluate[*string](fmt.Sprintf(`(e => e && e.getAttribute(%q))(document.querySelector(%q))`, name, sel)))
	require.NoError(b.t, err, "attribute %s of %s", name, sel)
	require.NotNil(b.t, a, "%s has no attribute %s", sel, name)
	return *a
}

// count is how many elements sel selects now.
func (b *tab) count(sel string) int {
	b.t.Helper()
	n, err := chromedp.Run(b.ctx, chromedp.Evaluate[int](fmt.Sprintf("document.querySelectorAll(%q).length", sel)))
	require.NoError(b.t, err)
	return n
}

// shot writes the tab's screenshot to screenshotDir/name.png.
func (b *tab) shot(name string) {
	b.t.Helper()
	png, err := chromedp.Run(b.ctx, chromedp.CaptureScreenshot())
	require.NoError(b.t, err)
	require.NoError(b.t, os.MkdirAll(screenshotDir, 0o755))
	require.NoError(b.t, os.WriteFile(filepath.Join(screenshotDir, name+".png"), png, 0o644))
}

// blockEvents cuts the tab off from the console's event stream, so that its
// pages stay as they were drawn: an operator's stale page.
func (b *tab) blockEvents() {
	b.t.Helper()
	_, err := chromedp.Call(b.ctx, network.Enable, network.EnableParams{})
	require.NoError(b.t, err)
	_, err = chromedp.Call(b.ctx, network.SetBlockedURLs, network.SetBlockedURLsParams{
		URLPatterns: []*network.BlockPattern{{URLPattern: b.base + "/console/events*", Block: true}}})
	require.NoError(b.t, err)
}

// waitText waits until the element sel selects reads want (the page
// changes it by itself: a live update).
func (b *tab) waitText(sel, want string) {
	b.t.Helper()
	b.do(chromedp.Poll[chromedp.Void](fmt.Sprintf(`(document.querySelector(%q) || {textContent: ""}).textContent.trim() === %q`, sel, want),
		chromedp.WithPollingMutation(), chromedp.WithPollingTimeout(0)))
}

// waitContains waits until the element sel selects contains want.
func (b *tab) waitContains(sel, want string) {
	b.t.Helper()
	b.do(chromedp.Poll[chromedp.Void](fmt.Sprintf(`(document.querySelector(%q) || {textContent: ""}).textContent.includes(%q)`, sel, want),
		chromedp.WithPollingMutation(), chromedp.WithPollingTimeout(0)))
}

// recordEvents keeps every server-sent event the tab's pages receive, as
// the browser got it, for stream(); call it before the page opens.
func (b *tab) recordEvents() {
	b.t.Helper()
	events := chromedp.Events(b.ctx, network.EventSourceMessageReceived)
	_, err := chromedp.Call(b.ctx, network.Enable, network.EnableParams{})
	require.NoError(b.t, err)
	go func() { // ends when the tab closes
		for ev, err := range events {
			if err != nil {
				return
			}
			b.mu.Lock()
			b.sse = append(b.sse, ev.EventName+" "+ev.Data)
			b.mu.Unlock()
		}
	}()
}

// stream is every server-sent event the tab received so far.
func (b *tab) stream() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return strings.Join(b.sse, "\n")
}
