package enginemetrics

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// Pipeline stages repeat their group's figures as TP ranks do: per
// dp_rank the scheduler of the lowest (pp_rank, tp_rank) counts.
func TestSGLangOneSchedulerPerRank(t *testing.T) {
	text := `sglang:num_queue_reqs{dp_rank="0",pp_rank="1",tp_rank="0"} 9
sglang:num_queue_reqs{dp_rank="0",pp_rank="0",tp_rank="1"} 8
sglang:num_queue_reqs{dp_rank="0",pp_rank="0",tp_rank="0"} 7
sglang:num_queue_reqs{dp_rank="1",pp_rank="0",tp_rank="2"} 5
`
	x, err := Parse(SGLang, strings.NewReader(text))
	if err != nil || len(x.Ranks) != 2 || x.Ranks[0].Waiting != 7 || x.Ranks[1].Waiting != 5 {
		t.Fatalf("%+v %v", x, err)
	}
}

func TestDetectAndFetch(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/metrics" {
			w.WriteHeader(http.StatusNotFound)
			return
		}
		_, _ = w.Write([]byte("# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{engine=\"0\"} 2\n"))
	}))
	defer srv.Close()
	fams, err := FetchFamilies(context.Background(), srv.Client(), srv.URL+"/metrics")
	if err != nil || Detect(fams) != VLLM {
		t.Fatalf("detect: %v %v", Detect(fams), err)
	}
	if _, err := Fetch(context.Background(), srv.Client(), srv.URL+"/nothing", VLLM); err == nil || !strings.Contains(err.Error(), "404") {
		t.Fatalf("a 404 scrape: %v", err)
	}
	if _, err := Parse("tgi", strings.NewReader("")); err == nil {
		t.Fatal("unknown format accepted")
	}
}
