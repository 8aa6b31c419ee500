package disagg

import "testing"

// Every disaggregated request id the edge can draw lies in TensorRT-LLM's
// global id range [2^40, 2^63) (disagg_utils.py MIN_GLOBAL_ID: below it
// are a worker's local request ids) and stays exact in float64 JSON
// parsers (< 2^53), whatever the random prefix. Before, a prefix below
// 2^19 (one edge start in 4,096) gave ids under 2^40.
func TestDisaggIDsInTRTLLMGlobalRange(t *testing.T) {
	for _, r := range []uint32{0, 1, 1 << 18, 0x7fffffff, 0xffffffff} {
		base := TRTLLMIDBase(r)
		for _, seq := range []uint64{0, 1, 1<<TRTLLMIDSeqBits - 1} {
			id := base | seq
			if id < 1<<40 || id >= 1<<53 {
				t.Errorf("prefix %#x, counter %d: id %d outside [2^40, 2^53)", r, seq, id)
			}
		}
	}
	if TRTLLMIDBase(1) == TRTLLMIDBase(2) {
		t.Error("distinct prefixes give one base")
	}
}
