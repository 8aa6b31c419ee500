package admission

import (
	"math"
	"runtime"
	rtmetrics "runtime/metrics"
	"time"

	"github.com/tether-project/tether/internal/procstat"
)

// window is what the shedder reads of the process over the last
// shedWindow ticks.
type window struct {
	// p99 is the Go scheduler's latency percentile (the time a runnable
	// goroutine waited to run) over wakeups goroutine wake-ups.
	p99     time.Duration
	wakeups uint64
	// cpu is the process's CPU use and its threads' run-queue wait over the
	// window (hasCPU false when the kernel could not be read); capacity the
	// CPUs it may use: GOMAXPROCS, or its cgroup's quota where lower.
	cpu      procstat.Load
	capacity float64
	hasCPU   bool
}

// share is the CPU the process used as a share of what it may use.
func (w window) share() float64 {
	if !w.hasCPU || w.capacity <= 0 {
		return 0
	}
	return w.cpu.Used / w.capacity
}

// sampler reads the window every tick (the ticker goroutine only).
type sampler struct {
	// runtime/metrics' scheduling latency histogram, per tick
	sample  []rtmetrics.Sample
	prev    []uint64
	deltas  [][]uint64
	buckets []float64

	// the kernel's account of the process: a sample per tick, the oldest
	// shedWindow ticks back first
	cpu       []stampedSample
	quota     float64 // the cgroup's CPU quota (0: none)
	readCPU   func() (procstat.Sample, error)
	maxProcs  func() int
	cpuBroken bool // reading failed once: the window has no CPU figures
}

type stampedSample struct {
	at time.Time
	s  procstat.Sample
}

func newSampler() *sampler {
	s := &sampler{sample: []rtmetrics.Sample{{Name: "/sched/latencies:seconds"}},
		readCPU: procstat.Read, maxProcs: func() int { return runtime.GOMAXPROCS(0) }}
	if q, ok := procstat.CPULimit(); ok {
		s.quota = q
	}
	return s
}

// read takes this tick's samples and returns the window ending now.
func (s *sampler) read(now time.Time) window {
	var w window
	w.p99, w.wakeups = s.schedulingLatency()
	w.cpu, w.hasCPU = s.cpuLoad(now)
	if w.hasCPU {
		w.capacity = float64(s.maxProcs())
		if s.quota > 0 && s.quota < w.capacity {
			w.capacity = s.quota
		}
	}
	return w
}

// cpuLoad is the process's CPU use and run-queue wait from the sample
// shedWindow ticks back to now.
func (s *sampler) cpuLoad(now time.Time) (procstat.Load, bool) {
	if s.cpuBroken {
		return procstat.Load{}, false
	}
	cur, err := s.readCPU()
	if err != nil {
		s.cpuBroken = true
		return procstat.Load{}, false
	}
	s.cpu = append(s.cpu, stampedSample{at: now, s: cur})
	if len(s.cpu) > shedWindow+1 {
		s.cpu = s.cpu[1:]
	}
	if len(s.cpu) < 2 {
		return procstat.Load{}, false
	}
	first := s.cpu[0]
	return procstat.Between(first.s, cur, now.Sub(first.at)), true
}

// schedulingLatency reads the runtime's scheduling latency histogram and
// returns the 99th percentile over the last shedWindow ticks, and how many
// wake-ups it saw.
func (s *sampler) schedulingLatency() (time.Duration, uint64) {
	rtmetrics.Read(s.sample)
	if s.sample[0].Value.Kind() != rtmetrics.KindFloat64Histogram {
		return 0, 0
	}
	h := s.sample[0].Value.Float64Histogram()
	if s.prev == nil {
		s.prev = append([]uint64(nil), h.Counts...)
		s.buckets = append([]float64(nil), h.Buckets...)
		return 0, 0
	}
	delta := make([]uint64, len(h.Counts))
	for i, c := range h.Counts {
		if i < len(s.prev) && c >= s.prev[i] {
			delta[i] = c - s.prev[i]
		}
	}
	s.prev = append(s.prev[:0], h.Counts...)
	s.deltas = append(s.deltas, delta)
	if len(s.deltas) > shedWindow {
		s.deltas = s.deltas[1:]
	}
	sum := make([]uint64, len(delta))
	var total uint64
	for _, d := range s.deltas {
		for i, c := range d {
			sum[i] += c
			total += c
		}
	}
	if total == 0 {
		return 0, 0
	}
	return percentile(sum, s.buckets, total, 0.99), total
}

// percentile is the upper bound of the bucket holding quantile q of counts
// (Buckets has one more edge than Counts; the last, +Inf, reports its lower
// bound).
func percentile(counts []uint64, buckets []float64, total uint64, q float64) time.Duration {
	want := uint64(math.Ceil(q * float64(total)))
	var acc uint64
	for i, c := range counts {
		acc += c
		if acc >= want {
			ub := buckets[i+1]
			if math.IsInf(ub, 1) {
				ub = buckets[i]
			}
			return time.Duration(ub * float64(time.Second))
		}
	}
	return 0
}
