package engineevents

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tether-project/tether/internal/enginekv"
	"github.com/tether-project/tether/internal/prefix"
	"github.com/tether-project/tether/test/natstest"
	"github.com/tether-project/tether/worker/kvevents"
)

// A proxy worker turns vLLM-format ZeroMQ KV events (the Go publisher
// speaking vllm/distributed/kv_events.py's protocol) into tether block
// keys on NATS: the edge's KV index holds exactly the blocks the engine
// stored, on the engine's DP rank, and drops those it removed.
func TestProxyWorkerMirrorsEngineKVEvents(t *testing.T) {
	for _, layout := range []kvevents.Layout{kvevents.LayoutMap, kvevents.LayoutArray} {
		ns := natstest.Start(t, nil)
		pub, err := kvevents.NewPublisher(kvevents.PublisherConfig{Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0", Layout: layout})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { pub.Close() })
		startProxyWorker(t, ns, "w-vllm", pub.Endpoint(), pub.ReplayEndpoint())
		f := newFleet(t, ns)

		toks := prefix.Tokenize(strings.Repeat("alpha beta gamma delta epsilon ", 4)) // 20 tokens: 5 blocks of 4
		blocks := prefix.BlockHashes(toks, 4)
		h := func(i int) enginekv.Hash { return enginekv.IntHash(uint64(1000 + i)) }
		publish := func(b enginekv.Batch) {
			t.Helper()
			if err := pub.Publish(b); err != nil {
				t.Fatal(err)
			}
		}
		nudge := func() { publish(enginekv.Batch{DPRank: 1}) }
		// Blocks 0-2 in one batch, 3-4 chained to block 2 in the next.
		publish(enginekv.Batch{DPRank: 1, Events: []enginekv.Event{{Kind: enginekv.Stored, Hashes: []enginekv.Hash{h(0), h(1), h(2)}, Tokens: toks[:12], BlockSize: 4}}})
		publish(enginekv.Batch{DPRank: 1, Events: []enginekv.Event{{Kind: enginekv.Stored, Hashes: []enginekv.Hash{h(3), h(4)}, Parent: h(2), HasParent: true, Tokens: toks[12:], BlockSize: 4}}})
		waitNudging(t, "the edge to index the engine's 5 blocks on rank 1", nudge, func() bool {
			n, r := matchRank(f, "w-vllm", blocks)
			return n == 5 && r == 1
		})
		publish(enginekv.Batch{DPRank: 1, Events: []enginekv.Event{{Kind: enginekv.Removed, Hashes: []enginekv.Hash{h(4), h(3)}}}})
		waitNudging(t, "the removal of blocks 3-4", nudge, func() bool { n, _ := matchRank(f, "w-vllm", blocks); return n == 3 })
		publish(enginekv.Batch{DPRank: 1, Events: []enginekv.Event{{Kind: enginekv.Cleared}}})
		waitNudging(t, "the cache to be cleared", nudge, func() bool { n, _ := matchRank(f, "w-vllm", blocks); return n == 0 })
	}
}

// When the engine restarts (its sequence starts over on the same ports),
// the proxy worker reconnects, resets the rank, and the edge's index drops
// the old cache's blocks, then learns the new cache's.
func TestEngineRestartResetsTheEdgesIndex(t *testing.T) {
	ns := natstest.Start(t, nil)
	pub, err := kvevents.NewPublisher(kvevents.PublisherConfig{Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	ep, rep := pub.Endpoint(), pub.ReplayEndpoint()
	t.Cleanup(func() { pub.Close() })
	w := startProxyWorker(t, ns, "w-restart", ep, rep)
	f := newFleet(t, ns)

	toks := prefix.Tokenize(strings.Repeat("a b c d ", 3))
	blocks := prefix.BlockHashes(toks, 4)
	store := func(p *kvevents.Publisher) {
		t.Helper()
		if err := p.Publish(enginekv.Batch{DPRank: 0, Events: []enginekv.Event{{Kind: enginekv.Stored,
			Hashes: []enginekv.Hash{enginekv.IntHash(1), enginekv.IntHash(2), enginekv.IntHash(3)}, Tokens: toks, BlockSize: 4}}}); err != nil {
			t.Fatal(err)
		}
	}
	nudge := func() { pub.Publish(enginekv.Batch{DPRank: 0}) }
	store(pub)
	waitNudging(t, "the first cache's blocks", nudge, func() bool { n, _ := matchRank(f, "w-restart", blocks); return n == 3 })

	pub.Close()
	if pub, err = kvevents.NewPublisher(kvevents.PublisherConfig{Endpoint: ep, ReplayEndpoint: rep}); err != nil {
		t.Fatalf("restart the engine's publisher on %s: %v", ep, err)
	}
	waitNudging(t, "the restarted engine's empty cache", nudge, func() bool { n, _ := matchRank(f, "w-restart", blocks); return n == 0 })
	store(pub)
	waitNudging(t, "the new cache's blocks", nudge, func() bool { n, _ := matchRank(f, "w-restart", blocks); return n == 3 })
	// The worker's metrics tell an operator what happened.
	m := scrape(t, w.URL()+"/metrics")
	for _, want := range []string{`tether_worker_engine_kv_blocks{rank="0"} 3`, `tether_worker_engine_kv_unmapped_blocks_total{rank="0",reason="orphan"} 0`} {
		if !strings.Contains(m, want+"\n") {
			t.Errorf("metrics lack %q", want)
		}
	}
	if strings.Contains(m, `tether_worker_engine_kv_resets_total{rank="0"} 0`+"\n") {
		t.Error("the restart did not count as a reset")
	}
}

func scrape(t *testing.T, url string) string {
	t.Helper()
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr, Timeout: 10 * time.Second}).Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
