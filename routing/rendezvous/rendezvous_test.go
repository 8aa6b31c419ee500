package rendezvous

import (
	"fmt"
	"testing"
)

// pick is the instance among ids with the highest weight for key (the
// smaller id on a tie).
func pick(key string, ids []string) string {
	kh := KeyHash(key)
	best, bestW := "", uint64(0)
	for _, id := range ids {
		if w := Weight(kh, id); best == "" || w > bestW || (w == bestW && id < best) {
			best, bestW = id, w
		}
	}
	return best
}

// The hash is part of the routing contract: every edge, of every version,
// must compute the same weights.
func TestWeightsAreFixed(t *testing.T) {
	for _, c := range []struct {
		key, id string
		want    uint64
	}{
		{"conv-1", "ctx-a", 0x9a61e37132817363},
		{"conv-1", "ctx-b", 0x779d6c4d51726043},
		{"", "x", 0x753d41ea001bc915},
	} {
		if got := Weight(KeyHash(c.key), c.id); got != c.want {
			t.Errorf("Weight(KeyHash(%q), %q) = %#x, want %#x", c.key, c.id, got, c.want)
		}
	}
}

func TestKeysSpreadAndMoveOnlyToANewInstance(t *testing.T) {
	four := []string{"ctx-a", "ctx-b", "ctx-c", "ctx-d"}
	share := map[string]int{}
	before := map[string]string{}
	for i := 0; i < 1000; i++ {
		key := fmt.Sprintf("conv-%d", i)
		before[key] = pick(key, four)
		share[before[key]]++
		if got := pick(key, []string{"ctx-d", "ctx-b", "ctx-a", "ctx-c"}); got != before[key] {
			t.Fatalf("%s: order-dependent: %s vs %s", key, before[key], got)
		}
	}
	for id, n := range share {
		if n < 200 || n > 300 {
			t.Errorf("%s got %d of 1000 keys: %v", id, n, share)
		}
	}
	moved := 0
	for key, old := range before {
		if now := pick(key, append(four, "ctx-new")); now != old {
			moved++
			if now != "ctx-new" {
				t.Fatalf("%s moved %s → %s, not to the new instance", key, old, now)
			}
		}
	}
	if moved < 150 || moved > 250 {
		t.Fatalf("%d of 1000 keys moved on adding a 5th instance, want about 200", moved)
	}
}
