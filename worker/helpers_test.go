package worker

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/tether-project/tether/test/testhttp"
)

// zmq4's PUB writer goroutine outlives its socket (test/leakcheck says why).
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/go-zeromq/zmq4.(*pubMWriter).run"))
}

const testKey = "test-internal-key-0123456789"

// testConfig is a two-rank simulated worker that never waits (TimeScale 0).
func testConfig(id string) Config {
	cfg := DefaultConfig()
	cfg.InstanceID = id
	cfg.Model = "test-model"
	cfg.InternalRequestAuthKey = testKey
	cfg.ADP.EnableAttentionDP = true
	cfg.ADP.AttentionDP.ConversationAffinity = true
	cfg.Ranks = 2
	cfg.Engine.TimeScale = 0
	cfg.Engine.BlockSize = 4
	cfg.Engine.CapacityBlocks = 4096
	cfg.Logger = slog.New(slog.DiscardHandler)
	return cfg
}

func testClient(t testing.TB) *http.Client { return testhttp.Client(t, nil) }

type response struct {
	status int
	header http.Header
	body   []byte
}

func (r response) json(t testing.TB) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(r.body, &m); err != nil {
		t.Fatalf("response is not JSON (%v): %s", err, r.body)
	}
	return m
}

func do(t testing.TB, c *http.Client, method, url, body string, headers map[string]string) response {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("read body: %v", err)
	}
	return response{status: resp.StatusCode, header: resp.Header, body: b}
}

func post(t testing.TB, c *http.Client, url, body string, headers map[string]string) response {
	t.Helper()
	return do(t, c, http.MethodPost, url, body, headers)
}

// mustJSON encodes v.
func mustJSON(t testing.TB, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// sseEvents splits an SSE body into its data payloads.
func sseEvents(t testing.TB, body []byte) []string {
	t.Helper()
	var out []string
	for _, block := range bytes.Split(body, []byte("\n\n")) {
		block = bytes.TrimSpace(block)
		if len(block) == 0 {
			continue
		}
		data, ok := bytes.CutPrefix(block, []byte("data: "))
		if !ok {
			t.Fatalf("SSE block without data: %q", block)
		}
		out = append(out, string(data))
	}
	return out
}

func errorsAs(err error, target any) bool { return errors.As(err, target) }
