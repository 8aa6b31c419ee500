package adp

import (
	"fmt"
	"strings"
)

// Placement is the policy for requests without a usable binding (new
// conversations, unkeyed requests, overflow from a saturated home rank).
type Placement uint8

const (
	// RoundRobin cycles through the ranks (the contract's default, docs/subagent-routing.md).
	RoundRobin Placement = iota
	// LeastTokens picks the rank with the fewest active prompt tokens,
	// counting requests placed earlier in the same batch.
	LeastTokens
	// LeastQueued picks the rank with the fewest active plus queued requests.
	LeastQueued
	// KVAware picks the rank holding the longest prefix of the prompt,
	// against load: the highest cached prompt tokens minus the rank's
	// placed, unfinished prompt tokens (a cached token saves the prefill a
	// queued token costs), ties to fewer requests. The cache lives per
	// rank, so placing a new conversation where its shared prefix is turns
	// the edge's cache credit into hits (Request.CachedTokens).
	KVAware
)

// PlacementKey is the configuration key ParsePlacement's errors name.
const PlacementKey = "attention_dp_config.kv_cache_routing_new_conv_placement"

var placementNames = [...]string{RoundRobin: "round_robin", LeastTokens: "least_tokens", LeastQueued: "least_queued", KVAware: "kv_aware"}

func (p Placement) String() string {
	if int(p) < len(placementNames) {
		return placementNames[p]
	}
	return fmt.Sprintf("placement(%d)", uint8(p))
}

// ParsePlacement parses the value of kv_cache_routing_new_conv_placement.
// An empty value means the default, round_robin; any other unknown value is
// an error naming the key and the allowed values (never a silent fallback).
func ParsePlacement(s string) (Placement, error) {
	v := strings.TrimSpace(s)
	if v == "" {
		return RoundRobin, nil
	}
	for p, name := range placementNames {
		if v == name {
			return Placement(p), nil
		}
	}
	return RoundRobin, fmt.Errorf("%s: unknown value %q (allowed: %s)", PlacementKey, s, strings.Join(placementNames[:], ", "))
}

// DefaultMaxSessions is the number of conversation→rank bindings kept when
// the configuration does not say.
const DefaultMaxSessions = 100_000

// Config is the worker's attention-DP configuration with the key
// names, ready to embed in a YAML configuration file:
//
//	enable_attention_dp: true
//	attention_dp_config:
//	  kv_cache_routing_conversation_affinity: true
//	  kv_cache_routing_new_conv_placement: least_tokens
//	  ranks: 8                    # tether: ADP ranks on this worker
//	  max_sessions: 100000        # tether: bindings kept (LRU)
//	  max_requests_per_rank: 64   # tether: saturation cap, 0 = none
//
// The last three keys are tether's: the contract leaves the rank count to the
// engine's parallelism and the limits to the implementation.
type Config struct {
	EnableAttentionDP bool              `yaml:"enable_attention_dp"`
	AttentionDP       AttentionDPConfig `yaml:"attention_dp_config"`
}

// AttentionDPConfig is the attention_dp_config section.
type AttentionDPConfig struct {
	ConversationAffinity bool   `yaml:"kv_cache_routing_conversation_affinity"`
	NewConvPlacement     string `yaml:"kv_cache_routing_new_conv_placement"`
	Ranks                int    `yaml:"ranks"`
	MaxSessions          int    `yaml:"max_sessions"`
	MaxRequestsPerRank   int    `yaml:"max_requests_per_rank"`
}

// Options validates the configuration and converts it to scheduler
// options. Errors name the offending key. Without enable_attention_dp the
// worker has one rank.
func (c Config) Options() (Options, error) {
	a := c.AttentionDP
	p, err := ParsePlacement(a.NewConvPlacement)
	if err != nil {
		return Options{}, err
	}
	ranks := a.Ranks
	switch {
	case !c.EnableAttentionDP && ranks > 1:
		return Options{}, fmt.Errorf("attention_dp_config.ranks: %d ranks need enable_attention_dp: true", ranks)
	case !c.EnableAttentionDP:
		ranks = 1
	case ranks < 1:
		return Options{}, fmt.Errorf("attention_dp_config.ranks: must be at least 1 when enable_attention_dp is true, got %d", ranks)
	}
	if a.MaxSessions < 0 {
		return Options{}, fmt.Errorf("attention_dp_config.max_sessions: must not be negative, got %d", a.MaxSessions)
	}
	if a.MaxRequestsPerRank < 0 {
		return Options{}, fmt.Errorf("attention_dp_config.max_requests_per_rank: must not be negative, got %d", a.MaxRequestsPerRank)
	}
	return Options{
		Ranks:                ranks,
		ConversationAffinity: c.EnableAttentionDP && a.ConversationAffinity,
		Placement:            p,
		MaxSessions:          a.MaxSessions,
		MaxRequestsPerRank:   a.MaxRequestsPerRank,
	}, nil
}
