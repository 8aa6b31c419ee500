package dispatch

import (
	"testing"

	"github.com/tether-project/tether/edge/disagg"
	"github.com/tether-project/tether/internal/apireq"
)

// An instance that reports cached tokens in its chat answers means a
// chat answer without them cached nothing; its Messages answers, which
// carry no cache fields on vLLM, say nothing about the cache until that
// dialect has reported some itself.
func TestEngineUsageInfersMissesPerDialect(t *testing.T) {
	e := &Dispatcher{}
	reported := disagg.Usage{OK: true, Prompt: 64, Cached: 48, HasCached: true}
	silent := disagg.Usage{OK: true, Prompt: 64}
	if u := e.engineUsage("v0", apireq.Chat, silent); u.HasCached {
		t.Fatalf("before any report: %+v, want no cached figure", u)
	}
	if u := e.engineUsage("v0", apireq.Chat, reported); !u.HasCached || u.Cached != 48 {
		t.Fatalf("a reported figure changed: %+v", u)
	}
	if u := e.engineUsage("v0", apireq.Chat, silent); !u.HasCached || u.Cached != 0 {
		t.Fatalf("chat after chat reported: %+v, want 0 cached", u)
	}
	if u := e.engineUsage("v0", apireq.Messages, silent); u.HasCached {
		t.Fatalf("messages after only chat reported: %+v, want no cached figure (not a miss)", u)
	}
	if u := e.engineUsage("v1", apireq.Chat, silent); u.HasCached {
		t.Fatalf("another instance: %+v, want no cached figure", u)
	}
}
