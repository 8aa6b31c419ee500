// Package sim is tether's simulated engine (the default engine): every ADP
// rank has a paged prefix cache (worker/kvcache) and requests take the time a
// prefill/decode model computes from what the cache holds.
//
// One timing model, two drivers: VirtualRank computes a rank's schedule
// (FIFO prefill, overlapping decode, KV-space waits) for explicit virtual
// times, and the benchmark harness drives it directly to replay traces fast
// and deterministically; Engine (engine.Engine) drives the same VirtualRanks
// from a scaled wall clock and sleeps until the computed times.
package sim

import (
	"errors"
	"fmt"
	"time"

	"github.com/tether-project/tether/internal/prefix"
)

// Defaults of the timing model; DESIGN.md says where they come from.
const (
	DefaultCapacityBlocks         = 16384 // 1,048,576 tokens per rank at 64 tokens per block
	DefaultPrefillTokensPerSec    = 5500.0
	DefaultPrefillOverhead        = 10 * time.Millisecond
	DefaultDecodeTokenTime        = 15 * time.Millisecond
	DefaultDecodeSlowdown         = 0.5
	DefaultKVTransferTokensPerSec = 100_000.0
	DefaultStatsWindow            = 60 * time.Second
	DefaultLoRALoadTime           = 100 * time.Millisecond
)

var (
	// ErrInvalidRequest marks a request the engine cannot run as given
	// (bad rank, MaxTokens, phase or context state): a client error.
	ErrInvalidRequest = errors.New("sim: invalid request")
	// ErrPromptTooLarge marks a prompt needing more KV blocks than a rank
	// holds even when idle: it can never run.
	ErrPromptTooLarge = errors.New("sim: prompt needs more KV blocks than the rank has")
	// ErrClosed is returned by Run after Close.
	ErrClosed = errors.New("sim: engine closed")
	// ErrTimeWentBackwards is returned by VirtualRank.Admit when now is
	// earlier than a previous admission's.
	ErrTimeWentBackwards = errors.New("sim: virtual time went backwards")
)

// Config is the simulated engine's configuration. Zero numeric fields take
// their defaults, except DecodeSlowdown and TimeScale, whose zero is
// meaningful: start from DefaultConfig.
type Config struct {
	Ranks          int // ADP ranks (default 1)
	CapacityBlocks int // KV blocks per rank
	BlockSize      int // tokens per block (default prefix.DefaultBlockSize)

	PrefillTokensPerSec float64       // uncached prompt tokens prefilled per second
	PrefillOverhead     time.Duration // fixed cost of every prefill (scheduling, first step)
	DecodeTokenTime     time.Duration // one decode step on an empty rank
	// DecodeSlowdown stretches decode steps with the rank's KV occupancy:
	// step = DecodeTokenTime × (1 + DecodeSlowdown × used/capacity).
	DecodeSlowdown         float64
	KVTransferTokensPerSec float64 // generation-only: prompt tokens received per second

	// StatsWindow is the rolling window of engine time over which cache
	// lookups and hits are reported.
	StatsWindow time.Duration

	// MaxLoRAs is the LoRA adapters a rank holds at once (vLLM
	// --max-loras); 0 models no slots: adapter requests only key their
	// blocks by the adapter. LoRALoadTime is what loading one into a slot
	// costs (lora.go).
	MaxLoRAs     int
	LoRALoadTime time.Duration

	// TimeScale is wall time per unit of engine time for Engine: 1 is
	// real time, 0.01 runs 100× faster, 0 never waits. VirtualRank
	// ignores it.
	TimeScale float64
}

// DefaultConfig is one rank in real time with the default model.
func DefaultConfig() Config {
	return Config{
		Ranks:                  1,
		CapacityBlocks:         DefaultCapacityBlocks,
		BlockSize:              prefix.DefaultBlockSize,
		PrefillTokensPerSec:    DefaultPrefillTokensPerSec,
		PrefillOverhead:        DefaultPrefillOverhead,
		DecodeTokenTime:        DefaultDecodeTokenTime,
		DecodeSlowdown:         DefaultDecodeSlowdown,
		KVTransferTokensPerSec: DefaultKVTransferTokensPerSec,
		StatsWindow:            DefaultStatsWindow,
		LoRALoadTime:           DefaultLoRALoadTime,
		TimeScale:              1,
	}
}

// normalized fills defaults and rejects values the model cannot use.
func (c Config) normalized() (Config, error) {
	d := DefaultConfig()
	if c.Ranks == 0 {
		c.Ranks = d.Ranks
	}
	if c.CapacityBlocks == 0 {
		c.CapacityBlocks = d.CapacityBlocks
	}
	if c.BlockSize == 0 {
		c.BlockSize = d.BlockSize
	}
	if c.PrefillTokensPerSec == 0 {
		c.PrefillTokensPerSec = d.PrefillTokensPerSec
	}
	if c.PrefillOverhead == 0 {
		c.PrefillOverhead = d.PrefillOverhead
	}
	if c.DecodeTokenTime == 0 {
		c.DecodeTokenTime = d.DecodeTokenTime
	}
	if c.KVTransferTokensPerSec == 0 {
		c.KVTransferTokensPerSec = d.KVTransferTokensPerSec
	}
	if c.StatsWindow == 0 {
		c.StatsWindow = d.StatsWindow
	}
	if c.LoRALoadTime == 0 {
		c.LoRALoadTime = d.LoRALoadTime
	}
	checks := []struct {
		bad  bool
		name string
		val  any
	}{
		{c.Ranks < 1, "ranks", c.Ranks},
		{c.CapacityBlocks < 1, "capacity blocks", c.CapacityBlocks},
		{c.BlockSize < 1, "block size", c.BlockSize},
		{!(c.PrefillTokensPerSec > 0), "prefill tokens per second", c.PrefillTokensPerSec},
		{c.PrefillOverhead < 0, "prefill overhead", c.PrefillOverhead},
		{c.DecodeTokenTime < 0, "decode token time", c.DecodeTokenTime},
		{!(c.DecodeSlowdown >= 0), "decode slowdown", c.DecodeSlowdown},
		{!(c.KVTransferTokensPerSec > 0), "KV transfer tokens per second", c.KVTransferTokensPerSec},
		{c.StatsWindow < 0, "stats window", c.StatsWindow},
		{c.MaxLoRAs < 0 || c.MaxLoRAs > 1024, "max loras", c.MaxLoRAs},
		{c.LoRALoadTime < 0, "lora load time", c.LoRALoadTime},
		{!(c.TimeScale >= 0), "time scale", c.TimeScale},
	}
	for _, ch := range checks {
		if ch.bad {
			return c, fmt.Errorf("sim: config: invalid %s: %v", ch.name, ch.val)
		}
	}
	return c, nil
}

// prefillTime is the compute time to prefill uncached prompt tokens.
func (c *Config) prefillTime(uncached int) time.Duration {
	return c.PrefillOverhead + rateTime(uncached, c.PrefillTokensPerSec)
}

// transferTime is the time to receive tokens' KV from the context side.
func (c *Config) transferTime(tokens int) time.Duration {
	return rateTime(tokens, c.KVTransferTokensPerSec)
}

// tokenTime is one decode step at the given KV occupancy (0..1).
func (c *Config) tokenTime(occupancy float64) time.Duration {
	return time.Duration(float64(c.DecodeTokenTime) * (1 + c.DecodeSlowdown*occupancy))
}

func rateTime(tokens int, perSec float64) time.Duration {
	return time.Duration(float64(tokens) / perSec * float64(time.Second))
}
