package disagg

import (
	"context"
	"encoding/json"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// SGLang's prefill/decode split as its router speaks it
// (sgl-router src/routers/http/pd_router.rs execute_dual_dispatch,
// bootstrap_injector.rs inject_bootstrap_fields; the DP-aware gateway adds
// the ranks): the prefill and the decode server both get the client's
// request at once, with
//
//	bootstrap_host   the prefill server's host (its URL's),
//	bootstrap_port   its --disaggregation-bootstrap-port (urls[].bootstrap_port),
//	bootstrap_room   a random room in [0, 2^63),
//
// arrays of those for n > 1 or a batch of prompts, one room each; the
// prefill request carries routed_dp_rank (the prefill key's rank), the
// decode request routed_dp_rank (its own key's) and disagg_prefill_dp_rank
// (the prefill's). The room is drawn ≡ the prefill rank modulo the
// prefill's data_parallel_size, so a server that places by the room
// (follow_bootstrap_room, a prefill server's default) and a decode that
// finds the prefill rank by it agree with the rank the edge chose.

// DefaultSGLangBootstrapPort is SGLang's --disaggregation-bootstrap-port
// default: a prefill server's bootstrap server, which decode servers dial.
const DefaultSGLangBootstrapPort = 8998

// sglangOwnedFields are what a client may not send (the edge owns the
// rendezvous and the ranks).
var sglangOwnedFields = []string{"bootstrap_host", "bootstrap_port", "bootstrap_room", "routed_dp_rank", "disagg_prefill_dp_rank", "data_parallel_rank"}

// sglangRoom draws a bootstrap room in [0, 2^63) that is ≡ rank modulo
// size (rank < 0: any room).
func sglangRoom(rank, size int) uint64 {
	r := rand.Uint64() >> 1
	if rank < 0 || size <= 1 {
		return r
	}
	s := uint64(size)
	r = r - r%s + uint64(rank)
	if r >= 1<<63 {
		r -= s
	}
	return r
}

// SGLangBootstrap is the bootstrap fields for a request going to the
// prefill server at prefillURL, whose bootstrap server listens on port,
// at data-parallel rank of size ranks: one set, or arrays of batch sets.
func SGLangBootstrap(prefillURL string, port, size, batch, rank int) map[string]json.RawMessage {
	host := prefillURL
	if u, err := url.Parse(prefillURL); err == nil && u.Hostname() != "" {
		host = u.Hostname() // pd_types.rs get_hostname
	}
	if batch == 0 {
		return map[string]json.RawMessage{"bootstrap_host": marshal(host), "bootstrap_port": marshal(port),
			"bootstrap_room": marshal(sglangRoom(rank, size))}
	}
	hosts, ports, rooms := make([]string, batch), make([]int, batch), make([]uint64, batch)
	for i := range batch {
		hosts[i], ports[i], rooms[i] = host, port, sglangRoom(rank, size)
	}
	return map[string]json.RawMessage{"bootstrap_host": marshal(hosts), "bootstrap_port": marshal(ports),
		"bootstrap_room": marshal(rooms)}
}

// SGLangHopFields are the two requests' fields: the bootstrap fields boot
// on both, the prefill not streamed, and the ranks (-1: none) of the
// prefill (pRank) and the decode (dRank).
func SGLangHopFields(boot map[string]json.RawMessage, pRank, dRank int) (prefill, decode Fields) {
	pset := map[string]json.RawMessage{"stream": json.RawMessage("false")}
	dset := map[string]json.RawMessage{}
	for k, v := range boot {
		pset[k], dset[k] = v, v
	}
	if pRank >= 0 {
		pset["routed_dp_rank"] = marshal(pRank)
		dset["disagg_prefill_dp_rank"] = marshal(pRank)
	}
	if dRank >= 0 {
		dset["routed_dp_rank"] = marshal(dRank)
	}
	return Fields{Set: pset, Del: append([]string{"stream_options"}, sglangOwnedFields...)},
		Fields{Set: dset, Del: sglangOwnedFields}
}

// bootstrapProbe is the client of SGLangBootstrapAlive: the bootstrap
// server speaks plain HTTP whatever the hops do, and a probe keeps no
// connection.
var bootstrapProbe = &http.Client{Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true,
	DialContext: (&net.Dialer{Timeout: 2 * time.Second}).DialContext, ResponseHeaderTimeout: 3 * time.Second}}

// SGLangBootstrapAlive asks the bootstrap server of the prefill server at
// prefillURL, on port, for /health, as a decode's heartbeat does
// (disaggregation/common/conn.py heartbeat_checker, a 2 s connect and 3 s
// read timeout).
func SGLangBootstrapAlive(ctx context.Context, prefillURL string, port int) bool {
	u, err := url.Parse(prefillURL)
	if err != nil {
		return false
	}
	hctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	addr := net.JoinHostPort(u.Hostname(), strconv.Itoa(port))
	req, err := http.NewRequestWithContext(hctx, http.MethodGet, "http://"+addr+"/health", nil)
	if err != nil {
		return false
	}
	resp, err := bootstrapProbe.Do(req)
	if err != nil {
		return false
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}
