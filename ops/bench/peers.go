package bench

import (
	"container/list"
	"fmt"
	"math/rand/v2"
	"time"
)

// The peers' routing policies, each as its project documents it (sources and
// defaults in DESIGN.md "Peer policies"). These are not tether's decision:
// they are the peers' cost functions, run by the simulator over the same
// edges, workers, load balancer and conditions, each with the state its
// replicas share (none, replica sync, gossip) and keep across a restart.
const (
	// PolicyDynamo: Dynamo's KV router (overlap-weighted prefill blocks
	// plus active decode blocks, router_temperature 0), replica sync of
	// active sequences, session affinity with sub-agent grouping (a
	// binding claimed in etcd: shared by the replicas, held by the
	// claiming frontend's lease).
	PolicyDynamo Policy = "dynamo"
	// PolicyDynamoKV: Dynamo's KV router without session affinity.
	PolicyDynamoKV Policy = "dynamo_kv"
	// PolicyLLMD: llm-d's endpoint picker: precise prefix-cache scorer
	// (KV events; the approximate one without) ×2, kv-cache-utilization
	// ×1, queue ×1, max-score picker. Replicas share nothing.
	PolicyLLMD Policy = "llmd"
	// PolicySMG: the SGLang model gateway's cache_aware policy: an
	// approximate radix tree per worker from its own routing,
	// cache_threshold 0.3, balance_abs_threshold 64, balance_rel_threshold
	// 1.5; replicas gossip their trees (mesh).
	PolicySMG Policy = "smg"
	// PolicyTRTLLMConversation: TensorRT-LLM's ConversationRouter: a
	// conversation id is sticky to the server it was first sent to, new
	// ones go to the least content-loaded server. Replicas share nothing.
	PolicyTRTLLMConversation Policy = "trtllm_conversation"
)

// PeerPolicies are the peers' policies, in report order.
var PeerPolicies = []Policy{PolicyDynamo, PolicyDynamoKV, PolicyLLMD, PolicySMG, PolicyTRTLLMConversation}

func (p Policy) isPeer() bool {
	switch p {
	case PolicyDynamo, PolicyDynamoKV, PolicyLLMD, PolicySMG, PolicyTRTLLMConversation:
		return true
	}
	return false
}

// Peer defaults (DESIGN.md cites each).
const (
	dynamoOverlapWeight = 1.0               // --router-kv-overlap-score-weight
	dynamoApproxTTL     = 120 * time.Second // ApproxKvIndexer (--no-kv-events)
	llmdPrefixWeight    = 2.0               // precise-prefix-cache-scorer weight
	llmdKVUtilWeight    = 1.0               // kv-cache-utilization-scorer weight
	llmdQueueWeight     = 1.0               // queue-scorer weight
	llmdLRUPerServer    = 31250             // approximate prefix-cache-scorer lruCapacityPerServer
	llmdMaxPrefixBlocks = 256               // maxPrefixBlocksToMatch
	smgCacheThreshold   = 0.3
	smgBalanceAbs       = 64
	smgBalanceRel       = 1.5
	smgMaxTreeChars     = 67_108_864 // max_tree_size, characters per worker
	smgCharsPerToken    = 4          // the tree holds request text
	smgGossipInterval   = time.Second
)

// peerState is the peers' per-run state: per edge, and the requests in
// flight as each edge saw them.
type peerState struct {
	edges   []*peerEdge
	flights [][]peerFlight // per instance
	claims  map[string]*peerClaim
	rnd     *rand.Rand
	latRnd  *rand.Rand
}

// peerFlight is a request a router sent: the router learns its first token
// and its end from the response stream.
type peerFlight struct {
	edge                         int // -1: its router restarted and forgot it
	at, firstToken, done, finish time.Duration
	tokens, blocks               int
}

// peerClaim is a Dynamo session binding claimed in etcd.
type peerClaim struct {
	inst     int
	edge     int
	commitAt time.Duration
}

type peerEdge struct {
	sessions map[string]int // trtllm_conversation: conversation id → server
	trees    []*blockLRU    // llmd (no events): per server; smg: per tenant
	gossip   []treeInsert   // smg: other replicas' inserts, heard later
	rr       int
}

type treeInsert struct {
	visible time.Duration
	inst    int
	blocks  []uint64
}

func newPeerState(s *simulator) *peerState {
	ps := &peerState{claims: map[string]*peerClaim{}, flights: make([][]peerFlight, len(s.instances)),
		rnd: rand.New(rand.NewPCG(s.cfg.Seed, 0x70656572)), latRnd: rand.New(rand.NewPCG(s.cfg.Seed, 0x65746364))}
	for range s.edges {
		ps.edges = append(ps.edges, ps.newEdge(s))
	}
	return ps
}

func (ps *peerState) newEdge(s *simulator) *peerEdge {
	pe := &peerEdge{sessions: map[string]int{}}
	capBlocks := 0
	switch s.cfg.Policy {
	case PolicyLLMD:
		capBlocks = llmdLRUPerServer
	case PolicySMG:
		capBlocks = max(smgMaxTreeChars/(max(s.w.BlockSize, 1)*smgCharsPerToken), 1)
	}
	if capBlocks > 0 {
		for range s.instances {
			pe.trees = append(pe.trees, newBlockLRU(capBlocks))
		}
	}
	return pe
}

// note records a dispatch as the routing edge sees it.
func (ps *peerState) note(edge, inst int, f peerFlight) {
	f.edge = edge
	ps.flights[inst] = append(ps.flights[inst], f)
}

// peerLoad is what one router knows of an instance's in-flight work.
type peerLoad struct {
	prefillTokens int64 // sent, first token not yet back
	activeBlocks  int64 // on the worker, not yet done
	requests      int   // response not yet finished
	tokens        int64 // prompt tokens of those
}

// load is edge e's view of instance i: its own flights, and with shared
// active sequences (Dynamo's replica sync) the others' ShareLatency after
// each event.
func (s *simulator) peerLoad(e, i int, shared bool) peerLoad {
	ps := s.peer
	fl := ps.flights[i]
	k := 0
	for k < len(fl) && fl[k].finish+s.cfg.ShareLatency < s.now-time.Second {
		k++
	}
	fl = fl[k:]
	ps.flights[i] = fl
	var l peerLoad
	for _, f := range fl {
		lag := time.Duration(0)
		if f.edge != e {
			if !shared {
				continue
			}
			lag = s.cfg.ShareLatency
		}
		if f.at+lag > s.now {
			continue
		}
		if f.firstToken+lag > s.now {
			l.prefillTokens += int64(f.tokens)
		}
		if f.done+lag > s.now {
			l.activeBlocks += int64(f.blocks)
		}
		if f.finish+lag > s.now {
			l.requests++
			l.tokens += int64(f.tokens)
		}
	}
	return l
}

// routePeer places a request by the peer policy at edge e. It returns the
// instance and the virtual time the request waits until (a session claim's
// commit).
func (s *simulator) routePeer(e int, ar *agentRun, req *Request) (int, time.Duration, error) {
	if s.peer == nil {
		return 0, 0, fmt.Errorf("bench: %s: peer state missing", s.cfg.Policy)
	}
	switch s.cfg.Policy {
	case PolicyDynamo:
		return s.routeDynamo(e, ar, req, true)
	case PolicyDynamoKV:
		return s.routeDynamo(e, ar, req, false)
	case PolicyLLMD:
		return s.routeLLMD(e, req), 0, nil
	case PolicySMG:
		return s.routeSMG(e, req), 0, nil
	case PolicyTRTLLMConversation:
		return s.routeTRTLLM(e, ar, req), 0, nil
	}
	return 0, 0, fmt.Errorf("bench: %s is not a peer policy", s.cfg.Policy)
}

// matches is edge e's prefix match per instance from its KV index (events,
// or with none its own predictions).
func (s *simulator) matches(e int, blocks []uint64) []int {
	out := make([]int, len(s.instances))
	ix := s.edges[e].index
	if ix == nil {
		return out
	}
	for _, m := range ix.Match(blocks, epoch.Add(s.now), nil) {
		if i, ok := s.byID[m.Instance]; ok {
			out[i] = max(out[i], m.Blocks)
		}
	}
	return out
}

// argBest picks the index of the best score (lowest when low), ties at
// random.
func (ps *peerState) argBest(scores []float64, low bool) int {
	best, ties := 0, 0
	for i, v := range scores {
		better := v > scores[best]
		if low {
			better = v < scores[best]
		}
		switch {
		case i == 0 || better:
			best, ties = i, 1
		case v == scores[best]:
			ties++
			if ps.rnd.IntN(ties) == 0 {
				best = i
			}
		}
	}
	return best
}

// routeDynamo is Dynamo's KV router: logit = overlap_score_weight ×
// (prefill tokens queued + the request's uncached tokens) ÷ block size +
// active decode blocks, the lowest logit at temperature 0. With session
// affinity, a root's session id (a sub-agent's parent group) is bound once,
// in etcd, to the worker its first request was placed on.
func (s *simulator) routeDynamo(e int, ar *agentRun, req *Request, affinity bool) (int, time.Duration, error) {
	key := ""
	if affinity {
		key = ar.agent.ID
		if ar.agent.Parent != nil {
			key = "\x01sg:" + ar.agent.Parent.ID // subagent_group_affinity_id
		}
		if c, ok := s.peer.claims[key]; ok {
			if c.commitAt <= s.now {
				return c.inst, 0, nil
			}
			// Another frontend's claim is in flight: this one's create
			// commits after it and reads the winner.
			return c.inst, max(c.commitAt, s.now+s.cfg.CommitLatency.sample(s.peer.latRnd.NormFloat64())), nil
		}
	}
	bs := float64(max(s.w.BlockSize, 1))
	over := s.matches(e, req.Blocks)
	logits := make([]float64, len(s.instances))
	for i := range s.instances {
		l := s.peerLoad(e, i, true)
		newTok := max(req.PromptTokens-over[i]*s.w.BlockSize, 0)
		logits[i] = dynamoOverlapWeight*float64(l.prefillTokens+int64(newTok))/bs + float64(l.activeBlocks)
	}
	inst := s.peer.argBest(logits, true)
	s.peerPredict(e, inst, req.Blocks, true)
	if !affinity {
		return inst, 0, nil
	}
	lat := s.cfg.CommitLatency.sample(s.peer.latRnd.NormFloat64())
	s.peer.claims[key] = &peerClaim{inst: inst, edge: e, commitAt: s.now + lat}
	return inst, s.now + lat, nil
}

// peerPredict records a placement in the edge's index when the fleet
// publishes no events (Dynamo's ApproxKvIndexer); with replica sync the
// other routers hear it ShareLatency later.
func (s *simulator) peerPredict(e, inst int, blocks []uint64, shared bool) {
	if s.cfg.KVEvents.Mode != KVEventsNone {
		return
	}
	id := s.instances[inst].id
	for j, ed := range s.edges {
		if ed.index == nil || (j != e && !shared) {
			continue
		}
		at := s.now
		if j != e {
			at += s.cfg.ShareLatency
		}
		ed.index.Predict(id, blocks, epoch.Add(at))
	}
}

// routeLLMD is llm-d's max-score picker over its weighted scorers.
func (s *simulator) routeLLMD(e int, req *Request) int {
	if _, err := s.views(s.edges[e]); err != nil { // refreshes the load reports
		s.fail(err)
	}
	n := len(req.Blocks)
	var prefix []float64
	if s.cfg.KVEvents.Mode == KVEventsNone {
		// The approximate prefix-cache scorer: an LRU of the block hashes
		// this picker sent to each server, up to maxPrefixBlocksToMatch.
		m := min(n, llmdMaxPrefixBlocks)
		for _, t := range s.peer.edges[e].trees {
			prefix = append(prefix, ratioInt(t.match(req.Blocks[:m]), m))
		}
	} else {
		for _, b := range s.matches(e, req.Blocks) {
			prefix = append(prefix, ratioInt(b, n))
		}
	}
	minQ, maxQ := -1, 0
	for _, in := range s.instances {
		if minQ < 0 || in.repQueued < minQ {
			minQ = in.repQueued
		}
		maxQ = max(maxQ, in.repQueued)
	}
	capTok := float64(s.instances[0].rankCap * len(s.instances[0].ranks) * max(s.w.BlockSize, 1))
	scores := make([]float64, len(s.instances))
	for i, in := range s.instances {
		queue := 1.0
		if maxQ > minQ {
			queue = float64(maxQ-in.repQueued) / float64(maxQ-minQ)
		}
		util := min(float64(in.repActiveTok)/capTok, 1)
		scores[i] = llmdPrefixWeight*prefix[i] + llmdKVUtilWeight*(1-util) + llmdQueueWeight*queue
	}
	inst := s.peer.argBest(scores, false)
	if s.cfg.KVEvents.Mode == KVEventsNone {
		s.peer.edges[e].trees[inst].insert(req.Blocks[:min(n, llmdMaxPrefixBlocks)])
	}
	return inst
}

// routeSMG is the SGLang model gateway's cache_aware policy.
func (s *simulator) routeSMG(e int, req *Request) int {
	pe := s.peer.edges[e]
	k := 0
	for k < len(pe.gossip) && pe.gossip[k].visible <= s.now {
		pe.trees[pe.gossip[k].inst].insert(pe.gossip[k].blocks)
		k++
	}
	pe.gossip = pe.gossip[k:]
	loads := make([]int, len(s.instances))
	minL, maxL := -1, 0
	for i := range s.instances {
		loads[i] = s.peerLoad(e, i, false).requests
		if minL < 0 || loads[i] < minL {
			minL = loads[i]
		}
		maxL = max(maxL, loads[i])
	}
	var inst int
	if maxL-minL > smgBalanceAbs && float64(maxL) > float64(minL)*smgBalanceRel {
		for i, l := range loads {
			if l == minL {
				inst = i
				break
			}
		}
	} else {
		m := make([]float64, len(s.instances))
		size := make([]float64, len(s.instances))
		for i, t := range pe.trees {
			m[i], size[i] = float64(t.match(req.Blocks)), float64(t.len())
		}
		best := s.peer.argBest(m, false)
		if n := len(req.Blocks); n > 0 && m[best]/float64(n) > smgCacheThreshold {
			inst = best
		} else {
			inst = s.peer.argBest(size, true)
		}
	}
	pe.trees[inst].insert(req.Blocks)
	for j, o := range s.peer.edges {
		if j != e {
			o.gossip = append(o.gossip, treeInsert{visible: s.now + smgGossipInterval, inst: inst, blocks: req.Blocks})
		}
	}
	return inst
}

// routeTRTLLM is TensorRT-LLM's ConversationRouter with an explicit
// conversation id (the agent's session id).
func (s *simulator) routeTRTLLM(e int, ar *agentRun, req *Request) int {
	pe := s.peer.edges[e]
	if inst, ok := pe.sessions[ar.agent.ID]; ok {
		return inst
	}
	loads := make([]float64, len(s.instances))
	minL := -1.0
	for i := range s.instances {
		loads[i] = float64(s.peerLoad(e, i, false).tokens)
		if minL < 0 || loads[i] < minL {
			minL = loads[i]
		}
	}
	var tied []int
	for i, l := range loads {
		if l == minL {
			tied = append(tied, i)
		}
	}
	inst := tied[pe.rr%len(tied)]
	pe.rr++
	pe.sessions[ar.agent.ID] = inst
	return inst
}

// peerKeepsIndex: whether a restarted edge of this policy rebuilds its KV
// index from the workers. llm-d's precise scorer does not (its standby
// starts empty and fills from new events).
func (s *simulator) peerKeepsIndex() bool { return s.cfg.Policy != PolicyLLMD }

// restart is what a peer's restarted router keeps: Dynamo loses the
// session claims its lease held and its approximate index, keeps what the
// workers and its replicas tell it; llm-d starts empty; SMG gets its trees
// back from the mesh; the TensorRT-LLM router keeps nothing.
func (ps *peerState) restart(s *simulator, e int) {
	for i := range ps.flights {
		for k := range ps.flights[i] {
			if ps.flights[i][k].edge == e {
				ps.flights[i][k].edge = -1
			}
		}
	}
	for k, c := range ps.claims {
		if c.edge == e {
			delete(ps.claims, k)
		}
	}
	if s.cfg.Policy == PolicySMG {
		ps.edges[e].rr = 0
		return // the mesh hands the trees back
	}
	ps.edges[e] = ps.newEdge(s)
}

func ratioInt(a, b int) float64 {
	if b <= 0 {
		return 0
	}
	return float64(a) / float64(b)
}

// blockLRU is a set of chained block hashes with least-recently-inserted
// eviction: an approximate per-server prefix index (llm-d's LRU, SMG's
// tree as it matches chained hashes).
type blockLRU struct {
	cap   int
	order *list.List
	at    map[uint64]*list.Element
}

func newBlockLRU(capacity int) *blockLRU {
	return &blockLRU{cap: capacity, order: list.New(), at: map[uint64]*list.Element{}}
}

func (l *blockLRU) len() int { return l.order.Len() }

// match is the number of leading blocks held.
func (l *blockLRU) match(blocks []uint64) int {
	for i, b := range blocks {
		if _, ok := l.at[b]; !ok {
			return i
		}
	}
	return len(blocks)
}

func (l *blockLRU) insert(blocks []uint64) {
	for _, b := range blocks {
		if el, ok := l.at[b]; ok {
			l.order.MoveToFront(el)
			continue
		}
		l.at[b] = l.order.PushFront(b)
	}
	for l.order.Len() > l.cap {
		el := l.order.Back()
		delete(l.at, el.Value.(uint64))
		l.order.Remove(el)
	}
}
