package integration

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/stretchr/testify/require"
)

// openAPIFile is the checked-in OpenAPI document of the HTTP front door.
var openAPIFile = filepath.Join("..", "internal", "httpapi", "openapi.json")

// apiSpec checks HTTP responses against the OpenAPI document: the status
// is documented for the route and method, the required headers are there,
// the content type is a documented one and the body validates against its
// JSON Schema (draft 2020-12, which OpenAPI 3.1 uses).
type apiSpec struct {
	doc    map[string]any
	routes []specRoute
	mu     sync.Mutex
	cache  map[string]*jsonschema.Resolved
}

type specRoute struct {
	template string
	re       *regexp.Regexp
	ops      map[string]map[string]any // method → operation object
}

var loadedSpec = sync.OnceValues(func() (*apiSpec, error) {
	data, err := os.ReadFile(openAPIFile)
	if err != nil {
		return nil, err
	}
	// One JSON Schema document: the components' schemas become $defs.
	data = bytes.ReplaceAll(data, []byte(`"#/components/schemas/`), []byte(`"#/$defs/`))
	s := &apiSpec{cache: map[string]*jsonschema.Resolved{}}
	if err := json.Unmarshal(data, &s.doc); err != nil {
		return nil, err
	}
	if v, _ := s.doc["openapi"].(string); !strings.HasPrefix(v, "3.1") {
		return nil, fmt.Errorf("openapi %q: want 3.1", v)
	}
	paths, _ := s.doc["paths"].(map[string]any)
	param := regexp.MustCompile(`\{[^}]+\}`)
	for template, item := range paths {
		r := specRoute{template: template, ops: map[string]map[string]any{}}
		quoted := regexp.QuoteMeta(param.ReplaceAllLiteralString(template, "\x00"))
		r.re = regexp.MustCompile("^" + strings.ReplaceAll(quoted, "\x00", `[^/]+`) + "$")
		for method, op := range item.(map[string]any) {
			r.ops[strings.ToUpper(method)] = op.(map[string]any)
		}
		s.routes = append(s.routes, r)
	}
	sort.Slice(s.routes, func(i, j int) bool { return s.routes[i].template < s.routes[j].template })
	return s, nil
})

// ref follows a local $ref ("#/components/...").
func (s *apiSpec) ref(v map[string]any) map[string]any {
	for {
		r, ok := v["$ref"].(string)
		if !ok {
			return v
		}
		var cur any = s.doc
		for _, part := range strings.Split(strings.TrimPrefix(r, "#/"), "/") {
			cur = cur.(map[string]any)[part]
		}
		v = cur.(map[string]any)
	}
}

// schema compiles the schema of one documented response body.
func (s *apiSpec) schema(id string, schema any) (*jsonschema.Resolved, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if r, ok := s.cache[id]; ok {
		return r, nil
	}
	root := map[string]any{
		"$schema": "https://json-schema.org/draft/2020-12/schema",
		"$defs":   s.doc["components"].(map[string]any)["schemas"],
		"allOf":   []any{schema},
	}
	data, err := json.Marshal(root)
	if err != nil {
		return nil, err
	}
	var js jsonschema.Schema
	if err := json.Unmarshal(data, &js); err != nil {
		return nil, fmt.Errorf("schema of %s: %w", id, err)
	}
	r, err := js.Resolve(nil)
	if err != nil {
		return nil, fmt.Errorf("schema of %s: %w", id, err)
	}
	s.cache[id] = r
	return r, nil
}

// check validates one response to method path.
func (s *apiSpec) check(method, path string, status int, h http.Header, body []byte) error {
	var route *specRoute
	for i := range s.routes {
		if s.routes[i].re.MatchString(path) {
			route = &s.routes[i]
			break
		}
	}
	var op map[string]any
	if route != nil {
		op = route.ops[method]
		if op == nil && method == http.MethodHead {
			op = route.ops[http.MethodGet]
		}
	}
	if op == nil {
		// Not a documented operation: it must be refused as a problem.
		if status != http.StatusNotFound && status != http.StatusMethodNotAllowed {
			return fmt.Errorf("%s %s is not documented, and was answered %d", method, path, status)
		}
		problem := map[string]any{"content": map[string]any{"application/problem+json": map[string]any{"schema": map[string]any{"$ref": "#/$defs/Problem"}}}}
		return s.checkBody("undocumented", problem, h, body)
	}
	responses := op["responses"].(map[string]any)
	resp, ok := responses[strconv.Itoa(status)].(map[string]any)
	if !ok {
		return fmt.Errorf("%s %s answered %d, which the document does not list for %s", method, path, status, route.template)
	}
	resp = s.ref(resp)
	id := fmt.Sprintf("%s %s %d", method, route.template, status)
	if headers, ok := resp["headers"].(map[string]any); ok {
		for name, hv := range headers {
			if req, _ := s.ref(hv.(map[string]any))["required"].(bool); req && h.Get(name) == "" {
				return fmt.Errorf("%s: required header %s is missing", id, name)
			}
		}
	}
	return s.checkBody(id, resp, h, body)
}

// checkBody checks the content type and body of a response against resp.
func (s *apiSpec) checkBody(id string, resp map[string]any, h http.Header, body []byte) error {
	content, _ := resp["content"].(map[string]any)
	if len(content) == 0 {
		if len(bytes.TrimSpace(body)) > 0 {
			return fmt.Errorf("%s: a body where the document has none: %.200s", id, body)
		}
		return nil
	}
	mt, _, err := mime.ParseMediaType(h.Get("Content-Type"))
	if err != nil {
		return fmt.Errorf("%s: Content-Type %q: %w", id, h.Get("Content-Type"), err)
	}
	media, ok := content[mt].(map[string]any)
	if !ok {
		return fmt.Errorf("%s: Content-Type %s is not documented", id, mt)
	}
	schema, ok := media["schema"]
	if !ok {
		return nil
	}
	r, err := s.schema(id+" "+mt, schema)
	if err != nil {
		return err
	}
	var v any
	if err := json.Unmarshal(body, &v); err != nil {
		return fmt.Errorf("%s: the body is not JSON: %w: %.200s", id, err, body)
	}
	if err := r.Validate(v); err != nil {
		return fmt.Errorf("%s: the body does not match the document: %w\n%.600s", id, err, body)
	}
	return nil
}

// validatingProxy is a reverse proxy in front of a front door that checks
// every response passing through against the OpenAPI document; a response
// that does not match fails the test. Every client of the tests (Go, curl,
// Python) talks to the front door through it.
type validatingProxy struct {
	*httptest.Server
	checked atomic.Int64
}

func newValidatingProxy(t *testing.T, target string) *validatingProxy {
	t.Helper()
	spec, err := loadedSpec()
	require.NoError(t, err, "load %s", openAPIFile)
	u, err := url.Parse(target)
	require.NoError(t, err)
	p := &validatingProxy{}
	rp := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) { r.SetURL(u) },
		ModifyResponse: func(resp *http.Response) error {
			body, err := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			if err != nil {
				return err
			}
			if err := spec.check(resp.Request.Method, resp.Request.URL.Path, resp.StatusCode, resp.Header, body); err != nil {
				t.Errorf("OpenAPI: %v", err)
			}
			p.checked.Add(1)
			resp.Body = io.NopCloser(bytes.NewReader(body))
			return nil
		},
	}
	p.Server = httptest.NewServer(rp)
	t.Cleanup(func() {
		p.Close()
		require.Positive(t, p.checked.Load(), "no response was checked against the OpenAPI document")
	})
	return p
}
