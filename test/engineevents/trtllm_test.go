package engineevents

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tether-project/tether/internal/enginekv"
	"github.com/tether-project/tether/internal/prefix"
	"github.com/tether-project/tether/internal/telemetry"
	"github.com/tether-project/tether/test/natstest"
	"github.com/tether-project/tether/worker"
)

// A simulated engine serving trtllm-serve's POST /kv_cache_events, polled
// by a proxy worker (engine.kv_events.format trtllm): the blocks of a
// prompt the engine ran reach the edge's KV index through the TensorRT-LLM
// event format.
func TestTRTLLMEventsReachTheEdge(t *testing.T) {
	ns := natstest.Start(t, nil)
	ecfg := worker.DefaultConfig()
	ecfg.InstanceID, ecfg.Model = "trt-engine", "m"
	ecfg.Engine.BlockSize, ecfg.Engine.TimeScale = 4, 0
	ecfg.Engine.PublishKVEvents.ServeTRTLLM = true
	eng := startWorker(t, nil, ecfg) // the engine: no NATS, drained over HTTP

	cfg := worker.DefaultConfig()
	cfg.InstanceID, cfg.Model = "w-trt", "m"
	cfg.Engine.Type = "proxy"
	cfg.Engine.Upstreams = []string{eng.URL()}
	cfg.Engine.BlockSize = 4
	cfg.Engine.KVEvents.Format = enginekv.FormatTRTLLM
	cfg.Engine.KVEvents.PollInterval = 20 * time.Millisecond
	w := startWorker(t, ns, cfg)
	f := newFleet(t, ns)

	text := strings.Repeat("red green blue cyan magenta ", 4)
	body, _ := json.Marshal(map[string]any{"model": "m", "prompt": text, "max_tokens": 1})
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	resp, err := (&http.Client{Transport: tr, Timeout: 30 * time.Second}).Post(w.URL()+"/v1/completions", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("completion through the proxy: %d %s", resp.StatusCode, b)
	}
	blocks := prefix.BlockHashes(prefix.Tokenize(text), 4)
	deadline := time.Now().Add(20 * time.Second)
	for {
		n, r := matchRank(f, "w-trt", blocks)
		if n == len(blocks) && r == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the edge holds %d of the prompt's %d blocks on w-trt (rank %d)", n, len(blocks), r)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// The proxy says its events are the engine's (/admin/v1/instances
	// shows kv.source engine_events), and the index holds them exactly.
	for {
		in, ok := f.Instance("w-trt", time.Now())
		kv, known := f.Index().Instance("w-trt")
		if ok && in.KVSource == telemetry.KVSourceEngineEvents && known && !kv.Approximate && kv.Seq > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("w-trt: kv_source %q (known %v), index %+v (known %v)", in.KVSource, ok, kv, known)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
