package bench

import (
	"math"
	"testing"
	"time"
)

// Each repeat turn is judged by what its cache held since the
// conversation's previous turn there: its previous prompt plus every other
// conversation's longest prompt served in between.
func TestReuseJudgesTheWorkingSetBetweenTurns(t *testing.T) {
	s := time.Second
	rec := func(agent string, call, instance int, at time.Duration, prompt, cached int) RequestRecord {
		return RequestRecord{Agent: agent, Call: call, Instance: instance, Admitted: at, Prompt: prompt, Cached: cached}
	}
	recs := []RequestRecord{
		rec("c", 0, 0, 0, 500, 0),
		rec("a", 0, 0, 1*s, 300, 0),
		rec("b", 0, 0, 5*s, 400, 0),
		rec("a", 1, 0, 10*s, 350, 300), // 300 + b's 400 = 700: fits 1,000
		rec("b", 1, 0, 15*s, 450, 400), // 400 + a's 350 = 750: fits
		rec("c", 1, 0, 20*s, 600, 0),   // 500 + a's longest 350 + b's 450 = 1,300: 1–2 ×
		rec("d", 0, 1, 2*s, 100, 0),
		rec("d", 1, 0, 30*s, 200, 0), // its previous turn went to instance 1
	}
	u := ReuseOf(recs, 1000)
	if u == nil {
		t.Fatal("no reuse with a capacity")
	}
	total := 300.0 + 400 + 350 + 500 + 450 + 600 + 100 + 200
	for _, c := range []struct {
		name        string
		got         ReuseClass
		share, rate float64
	}{
		{"fits", u.Fits, (350 + 450) / total, (300 + 400) / 800.0},
		{"over", u.Over, 600 / total, 0},
		{"far over", u.FarOver, 0, 0},
		{"moved", u.Moved, 200 / total, 0},
		{"first", u.First, (300 + 400 + 500 + 100) / total, 0},
	} {
		if math.Abs(c.got.Share-c.share) > 1e-9 || math.Abs(c.got.HitRate-c.rate) > 1e-9 {
			t.Errorf("%s: share %.4f hit %.4f, want %.4f and %.4f", c.name, c.got.Share, c.got.HitRate, c.share, c.rate)
		}
	}
	// A conversation behind twice the capacity.
	recs = append(recs, rec("e", 0, 0, 21*s, 1500, 0), rec("c", 2, 0, 40*s, 650, 0))
	if u := ReuseOf(recs, 1000); u.FarOver.Share == 0 || u.Over.Share != 600/(total+1500+650) {
		t.Fatalf("with e's 1,500 tokens between c's turns: %+v", u)
	}
	if ReuseOf(recs, 0) != nil {
		t.Fatal("reuse without a capacity")
	}
}
