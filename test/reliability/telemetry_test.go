package reliability

import (
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/tether-project/tether/internal/telemetry"
	"github.com/tether-project/tether/test/natstest"
	"github.com/tether-project/tether/test/workertest"
	"github.com/tether-project/tether/worker"
)

// workerPermissions pins a worker's NATS user to its own instance's
// subjects: it may publish only telemetry naming itself and answer KV dump
// requests addressed to it.
func workerPermissions(instance string) *natsserver.Permissions {
	return &natsserver.Permissions{
		Publish: &natsserver.SubjectPermission{Allow: []string{
			"tether.v1.*." + instance,   // kv, evict
			"tether.v1.*.*." + instance, // load.<fleet>
			"_INBOX.>",                  // replies
		}},
		Subscribe: &natsserver.SubjectPermission{Allow: []string{
			"tether.v1.kvdump." + instance,
			"_INBOX.>",
		}},
	}
}

// securedNATS runs an embedded server with one user per worker and an
// unrestricted "edge" user.
func securedNATS(t *testing.T, workers ...string) *natsserver.Server {
	t.Helper()
	users := []*natsserver.User{{Username: "edge", Password: "edge-secret"}}
	for _, w := range workers {
		users = append(users, &natsserver.User{Username: w, Password: w + "-secret", Permissions: workerPermissions(w)})
	}
	return natstest.Start(t, &natsserver.Options{Users: users})
}

func startWorker(t *testing.T, id, url, user, password string) *worker.Server {
	t.Helper()
	cfg := worker.DefaultConfig()
	cfg.InstanceID = id
	cfg.Model = "test-model"
	cfg.Engine.TimeScale = 0
	cfg.TelemetryInterval = 20 * time.Millisecond
	cfg.NATS.URLs = []string{url}
	cfg.NATS.User, cfg.NATS.Password = user, password
	cfg.Logger = slog.New(slog.DiscardHandler)
	return workertest.Start(t, worker.New, cfg)
}

// A worker that publishes telemetry for another instance id is refused by
// the server: the edge never hears of the impersonated instance, so the
// impersonator cannot attract or redirect that instance's traffic.
func TestWorkerCannotPublishTelemetryForAnotherInstance(t *testing.T) {
	ns := securedNATS(t, "w1", "w2")
	edge, err := nats.Connect(ns.ClientURL(), nats.UserInfo("edge", "edge-secret"))
	if err != nil {
		t.Fatal(err)
	}
	defer edge.Close()
	var (
		mu     sync.Mutex
		counts = map[string]int{}
		bad    []string
	)
	sub, err := edge.Subscribe("tether.v1.>", func(m *nats.Msg) {
		mu.Lock()
		defer mu.Unlock()
		if !strings.HasPrefix(m.Subject, "tether.v1.load.") {
			return
		}
		r, err := telemetry.DecodeLoad(m.Subject, m.Data)
		if err != nil {
			bad = append(bad, err.Error())
			return
		}
		counts[r.Instance]++
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := edge.Flush(); err != nil {
		t.Fatal(err)
	}
	// w1 is honest; "w2" is a process holding w1's credentials that claims
	// to be w2.
	startWorker(t, "w1", ns.ClientURL(), "w1", "w1-secret")
	startWorker(t, "w2", ns.ClientURL(), "w1", "w1-secret")
	// Wait on the honest worker's reports: by the time 10 have arrived the
	// impersonator has had as many chances to publish.
	waitFor(t, 20*time.Second, "10 load reports from w1", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return counts["w1"] >= 10
	})
	mu.Lock()
	defer mu.Unlock()
	if counts["w2"] != 0 {
		t.Fatalf("the server delivered %d load reports for w2 published with w1's credentials", counts["w2"])
	}
	if len(bad) != 0 {
		t.Fatalf("undecodable reports from honest workers: %v", bad)
	}

	// A raw client with w1's credentials cannot publish on w2's subject
	// either; the server reports the permissions violation.
	errs := make(chan error, 4)
	rogue, err := nats.Connect(ns.ClientURL(), nats.UserInfo("w1", "w1-secret"),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { errs <- err }))
	if err != nil {
		t.Fatal(err)
	}
	defer rogue.Close()
	payload, err := telemetry.EncodeLoad(telemetry.LoadReport{Instance: "w2", Fleet: telemetry.FleetContext, URL: "http://127.0.0.1:1", Model: "test-model", BootID: 1, Seq: 1, IntervalMilli: 20, BlockSize: 4, FeatureLevel: telemetry.FeatureLevel, Ranks: []telemetry.RankLoad{{Rank: 0, KVBlocksTotal: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := rogue.Publish(telemetry.LoadSubject(telemetry.FleetContext, "w2"), payload); err != nil {
		t.Fatal(err)
	}
	_ = rogue.Flush()
	select {
	case err := <-errs:
		if !errors.Is(err, nats.ErrPermissionViolation) && !strings.Contains(strings.ToLower(err.Error()), "permissions violation") {
			t.Fatalf("rogue publish: %v, want a permissions violation", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no permissions violation reported for a publish on another instance's subject")
	}
}

// The decoder is the second line: a payload naming another instance than
// its subject, and absurd or malformed values, are typed decode errors.
func TestTelemetryDecoderRejectsBadPayloads(t *testing.T) {
	valid := telemetry.LoadReport{Instance: "w1", Fleet: telemetry.FleetContext, URL: "http://127.0.0.1:9", Model: "m", BootID: 1, Seq: 1, IntervalMilli: 100, BlockSize: 64, FeatureLevel: telemetry.FeatureLevel,
		Ranks: []telemetry.RankLoad{{Rank: 0, KVBlocksTotal: 100}}}
	good, err := telemetry.EncodeLoad(valid)
	if err != nil {
		t.Fatal(err)
	}
	subject := telemetry.LoadSubject(telemetry.FleetContext, "w1")
	if _, err := telemetry.DecodeLoad(subject, good); err != nil {
		t.Fatalf("valid report: %v", err)
	}
	replace := func(old, new string) []byte { return []byte(strings.Replace(string(good), old, new, 1)) }
	cases := []struct {
		name, subject string
		data          []byte
	}{
		{"another instance in the payload", telemetry.LoadSubject(telemetry.FleetContext, "w2"), good},
		{"another fleet in the subject", telemetry.LoadSubject(telemetry.FleetGeneration, "w1"), good},
		{"malformed JSON", subject, []byte(`{"v":1,"instance":`)},
		{"not an object", subject, []byte(`[1,2,3]`)},
		{"empty", subject, nil},
		{"unknown version", subject, replace(`"v":1`, `"v":99`)},
		{"negative active prompt tokens", subject, replace(`"active_prompt_tokens":0`, `"active_prompt_tokens":-5`)},
		{"negative queue", subject, replace(`"queued_requests":0`, `"queued_requests":-1`)},
		{"used above total", subject, replace(`"kv_blocks_used":0`, `"kv_blocks_used":1000000`)},
		{"hits above lookups", subject, replace(`"window_hit_tokens":0`, `"window_hit_tokens":50`)},
		{"huge rank number", subject, replace(`"rank":0`, `"rank":1000000000`)},
		{"wrong type", subject, replace(`"seq":1`, `"seq":"one"`)},
		{"bad subject", "tether.v1.load", good},
		{"wildcard subject", "tether.v1.load.context.*", good},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := telemetry.DecodeLoad(c.subject, c.data)
			var de *telemetry.DecodeError
			if !errors.As(err, &de) {
				t.Fatalf("DecodeLoad accepted it or returned an untyped error: %v", err)
			}
		})
	}
	for _, c := range []struct {
		name string
		fn   func() error
	}{
		{"kv events garbage", func() error {
			_, err := telemetry.DecodeKVEvents(telemetry.KVSubject("w1"), []byte("garbage"))
			return err
		}},
		{"kv dump garbage", func() error {
			_, err := telemetry.DecodeKVDump(telemetry.KVDumpSubject("w1"), []byte{0xff, 0xff})
			return err
		}},
		{"evictions for another instance", func() error {
			b, err := telemetry.EncodeEvictions(telemetry.Evictions{Instance: "w1", BootID: 1, Seq: 1, Evictions: []telemetry.Eviction{{Rank: 0, ConversationID: "c"}}})
			if err != nil {
				return nil // a valid report could not be built: fail below
			}
			_, err = telemetry.DecodeEvictions(telemetry.EvictSubject("w2"), b)
			return err
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			var de *telemetry.DecodeError
			if err := c.fn(); !errors.As(err, &de) {
				t.Fatalf("want a typed decode error, got %v", err)
			}
		})
	}
}
