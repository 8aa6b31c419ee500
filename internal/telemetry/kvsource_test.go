package telemetry

import (
	"errors"
	"testing"
)

func TestLoadKVSource(t *testing.T) {
	for _, src := range []string{"", KVSourceEngineEvents, KVSourceNone} {
		r := sampleLoad()
		r.KVSource = src
		data, err := EncodeLoad(r)
		if err != nil {
			t.Fatalf("kv_source %q: %v", src, err)
		}
		got, err := DecodeLoad(LoadSubject(r.Fleet, r.Instance), data)
		if err != nil || got.KVSource != src {
			t.Fatalf("kv_source %q decoded as %q, %v", src, got.KVSource, err)
		}
	}
	r := sampleLoad()
	r.KVSource = "gossip"
	if _, err := EncodeLoad(r); !errors.Is(err, ErrOutOfRange) {
		t.Fatalf("kv_source gossip: %v, want ErrOutOfRange", err)
	}
}
