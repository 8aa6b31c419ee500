package admission

import (
	"crypto/sha256"
	"os/exec"
	"runtime"
	"sync"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/tether-project/tether/edge/config"
	"github.com/tether-project/tether/edge/observe"
	"github.com/tether-project/tether/test/waitfor"
)

// busyLoops starts n processes that spin a CPU each, at this process's
// priority, until the test ends.
func busyLoops(t *testing.T, n int) {
	t.Helper()
	for range n {
		c := exec.Command("sh", "-c", "while :; do :; done")
		c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		if err := c.Start(); err != nil {
			t.Fatalf("start a busy loop: %v", err)
		}
		t.Cleanup(func() {
			_ = syscall.Kill(-c.Process.Pid, syscall.SIGKILL)
			_ = c.Wait()
		})
	}
}

// traffic runs goroutines that each hand a message to the next and work
// for work hashing rounds before waiting again; pause between rounds
// keeps it light. It stops when the test ends.
func traffic(t *testing.T, goroutines, work int, pause time.Duration) {
	t.Helper()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	chans := make([]chan struct{}, goroutines)
	for i := range chans {
		chans[i] = make(chan struct{}, 1)
	}
	for i := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var h [32]byte
			for {
				if pause > 0 {
					select {
					case <-stop:
						return
					case <-chans[i]:
					case <-time.After(pause):
					}
				} else {
					select {
					case <-stop:
						return
					default:
					}
				}
				select {
				case chans[(i+1)%goroutines] <- struct{}{}:
				default:
				}
				for range work {
					h = sha256.Sum256(h[:])
				}
				if pause > 0 {
					time.Sleep(pause)
				} else {
					runtime.Gosched()
				}
			}
		}()
	}
	t.Cleanup(func() {
		close(stop)
		wg.Wait()
	})
}

// gauge and counter read a series' value.
func gauge(g interface{ Write(*dto.Metric) error }) float64 {
	var m dto.Metric
	if g.Write(&m) != nil {
		return -1
	}
	switch {
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	case m.Counter != nil:
		return m.Counter.GetValue()
	}
	return -1
}

// startShedder runs a shedder over the real process (its scheduler's
// latencies, the kernel's account of its CPU) until the test ends.
func startShedder(t *testing.T, cfg config.AdmissionConfig, quota float64) (*shedder, *observe.Metrics) {
	t.Helper()
	m, err := observe.New(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	s, err := newShedder(cfg, nil, m)
	if err != nil {
		t.Fatal(err)
	}
	if quota > 0 {
		s.sampler.quota = quota
	}
	done := make(chan struct{})
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		s.run(done)
	}()
	t.Cleanup(func() {
		close(done)
		<-ended
	})
	return s, m
}

// An edge whose own traffic is light, beside processes that keep every CPU
// busy: its goroutines wait to run longer than the bound (the kernel runs
// its threads late), but it uses a small share of its CPUs. Shedding would
// free nothing: the limit stays where it is, and each slow window is
// counted as a busy host.
func TestLightEdgeBesideBusyLoopsDoesNotShed(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(2))
	busyLoops(t, min(64, 2*runtime.NumCPU()))
	traffic(t, 32, 20, 2*time.Millisecond)
	cfg := config.DefaultAdmissionConfig()
	cfg.MaxSchedulingLatency = 100 * time.Microsecond
	s, m := startShedder(t, cfg, 0)
	busy := m.AdmissionSchedOver.WithLabelValues("busy_host")
	own := m.AdmissionSchedOver.WithLabelValues("own_load")
	waitfor.Reason(t, 60*time.Second, "windows whose scheduling latency passes the bound", func() string {
		if n := gauge(own); n != 0 {
			t.Fatalf("a light edge beside busy loops shed: %v windows judged its own load (CPU share %.2f, run delay %.1f s per CPU-second, limit %v)",
				n, gauge(m.AdmissionCPUShare), gauge(m.AdmissionRunDelay), s.currentLimit())
		}
		if n := gauge(busy); n < 5 {
			return "slow windows so far: " + ftoa(n)
		}
		return ""
	})
	if lim := s.currentLimit(); lim != float64(cfg.MaxInflight) {
		t.Fatalf("limit %v, want max_inflight %d", lim, cfg.MaxInflight)
	}
	t.Logf("CPU share %.3f, run delay %.1f s per CPU-second", gauge(m.AdmissionCPUShare), gauge(m.AdmissionRunDelay))
}

// An edge flooded by its own work sheds: its goroutines queue behind each
// other while it uses every CPU it may. The cgroup quota the shedder reads
// is set to a twentieth of a CPU, as a pod limited so would have it, so
// the flood is beyond it whatever else runs on this host.
func TestEdgeFloodedByItsOwnWorkSheds(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(2))
	traffic(t, 64, 200, 0)
	cfg := config.DefaultAdmissionConfig()
	cfg.MaxSchedulingLatency = time.Millisecond
	s, m := startShedder(t, cfg, 0.05)
	var rel []func()
	for range 100 {
		r, why := s.admit()
		if r == nil {
			t.Fatalf("refused before any window: %s", why)
		}
		rel = append(rel, r)
	}
	defer func() {
		for _, r := range rel {
			r()
		}
	}()
	waitfor.Reason(t, 60*time.Second, "the limit cut for the edge's own load", func() string {
		if s.currentLimit() < 100 {
			return ""
		}
		return "limit " + ftoa(s.currentLimit()) + ", CPU share " + ftoa(gauge(m.AdmissionCPUShare))
	})
	if _, why := s.admit(); why == "" || !containsAll(why, "goroutines wait", "admission.min_cpu_share") {
		t.Fatalf("a request beyond the cut limit: %q, want a refusal naming the wait and the CPU share", why)
	}
	if gauge(m.AdmissionSchedOver.WithLabelValues("own_load")) == 0 {
		t.Fatal("no window counted as the edge's own load")
	}
}
