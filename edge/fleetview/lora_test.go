package fleetview

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tether-project/tether/internal/telemetry"
)

// vLLM keeps one vllm:lora_requests_info series per label set it has
// set, valued with the time it was current: the newest is the state.
func TestParseLoRAMetricsTakesTheNewestSeries(t *testing.T) {
	expo := `# HELP vllm:lora_requests_info Running stats on lora requests.
# TYPE vllm:lora_requests_info gauge
vllm:lora_requests_info{max_lora="2",running_lora_adapters="agent-a",waiting_lora_adapters=""} 1.7000000001e+09
vllm:lora_requests_info{max_lora="2",running_lora_adapters="agent-b,agent-c",waiting_lora_adapters="agent-d"} 1.7000000005e+09
vllm:lora_requests_info{max_lora="2",running_lora_adapters="",waiting_lora_adapters=""} 1.7000000003e+09
vllm:lora_requests_info_other 3
vllm:num_requests_running{engine="0",model_name="m"} 2
`
	st, err := ParseLoRAMetrics(strings.NewReader(expo))
	if err != nil {
		t.Fatal(err)
	}
	if st == nil || st.MaxLoRAs != 2 || !slices.Equal(st.Loaded, []string{"agent-b", "agent-c", "agent-d"}) || !st.Full {
		t.Fatalf("state %+v", st)
	}
	if st, err := ParseLoRAMetrics(strings.NewReader("vllm:num_requests_running 1\n")); err != nil || st != nil {
		t.Fatalf("no LoRA series: %+v %v", st, err)
	}
	if _, err := ParseLoRAMetrics(strings.NewReader(`vllm:lora_requests_info{max_lora="2 1` + "\n")); err == nil {
		t.Fatal("a malformed line must be an error")
	}
}

// A tether worker's load report names each rank's adapters; the edge's
// own recent requests add theirs until the prediction expires.
func TestLoRAViewMergesReportAndPredictions(t *testing.T) {
	r := telemetry.LoadReport{MaxLoRAs: 1, Ranks: []telemetry.RankLoad{
		{LoRAAdapters: []string{"a"}, LoRARunning: []string{"a"}},
		{LoRAAdapters: []string{"b"}, LoRARunning: []string{"b"}},
	}}
	st := loraFromReport(&r)
	if !slices.Equal(st.Loaded, []string{"a", "b"}) || !st.Full {
		t.Fatalf("from report: %+v", st)
	}
	now := time.Unix(100, 0)
	f := &View{cfg: Config{PredictTTL: time.Second}, byID: map[string]*instance{"w": {id: "w", lora: st}}}
	f.NoteAdapter("w", "c", now)
	v := f.loraViewLocked(f.byID["w"], now.Add(500*time.Millisecond))
	if !v.Holds("c") || !v.Holds("a") || v.Holds("d") || v.MaxLoRAs != 1 {
		t.Fatalf("view %+v", v)
	}
	if v := f.loraViewLocked(f.byID["w"], now.Add(2*time.Second)); v.Holds("c") {
		t.Fatalf("expired prediction still held: %+v", v)
	}
}

// An engine that reports no adapters (SGLang) gets the configured slots;
// the adapters this edge sent lately fill them.
func TestLoRAViewConfiguredSlots(t *testing.T) {
	now := time.Unix(100, 0)
	f := &View{cfg: Config{PredictTTL: time.Minute}, byID: map[string]*instance{"s": {id: "s", maxLoRAs: 2}}}
	f.NoteAdapter("s", "a", now)
	if v := f.loraViewLocked(f.byID["s"], now); v.MaxLoRAs != 2 || v.Full {
		t.Fatalf("one adapter sent: %+v", v)
	}
	f.NoteAdapter("s", "b", now)
	if v := f.loraViewLocked(f.byID["s"], now); !v.Full {
		t.Fatalf("two adapters sent into two slots: %+v", v)
	}
}
