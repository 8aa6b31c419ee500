package reliability

import (
	"flag"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/tether-project/tether/test/leakcheck"
)

// Flags (after the package: go test ./test/reliability -args -seed=7) or
// the matching environment variables (RELIABILITY_SEED, RELIABILITY_RUNS,
// RELIABILITY_LONG=1) so `make soak` can set them.
var (
	seedFlag = flag.Int64("seed", 0, "base seed of the randomized fault schedules (0: derive from the clock and print it)")
	runsFlag = flag.Int("runs", 0, "seeded runs per fault type (0: 100 with -long, 1 with -short, else 2)")
	longFlag = flag.Bool("long", false, "long mode: at least 100 seeded runs per fault type")
)

func TestMain(m *testing.M) {
	flag.Parse()
	leakcheck.VerifyTestMain(m)
}

func envInt(name string) int64 {
	v, err := strconv.ParseInt(os.Getenv(name), 10, 64)
	if err != nil {
		return 0
	}
	return v
}

// baseSeed is the first run's seed; run i of a fault type uses baseSeed+i.
func baseSeed(t *testing.T) int64 {
	s := *seedFlag
	if s == 0 {
		s = envInt("RELIABILITY_SEED")
	}
	if s == 0 {
		s = time.Now().UnixNano() % 1_000_000_000
	}
	t.Logf("base seed %d (replay with -args -seed=%d)", s, s)
	return s
}

func longMode() bool { return *longFlag || os.Getenv("RELIABILITY_LONG") == "1" }

// runsPerType is the number of seeded schedules each fault type gets.
func runsPerType() int {
	if *runsFlag > 0 {
		return *runsFlag
	}
	if n := envInt("RELIABILITY_RUNS"); n > 0 {
		return int(n)
	}
	switch {
	case longMode():
		return 100
	case testing.Short():
		return 1
	}
	return 2
}
