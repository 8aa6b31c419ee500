// Package operator is the client side of the edges' admin API (/admin/v1,
// bearer admin token): cluster membership (list, add, remove, transfer
// leadership), worker instances (list, drain, undrain), state hashes and
// bindings for audit, and snapshot save, restore and offline inspection. `tether operator` is a thin CLI over it.
package operator

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/tether-project/tether/cluster"
	"github.com/tether-project/tether/edge/admin"
	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/ops/audit"
)

// EnvAdminToken is read when no token is given explicitly.
const EnvAdminToken = admin.EnvToken

// Client talks to one or more edges. Read operations and membership
// changes use the first edge that answers (an edge forwards membership
// changes to the leader itself); a snapshot restore goes to whichever
// listed edge is the leader.
type Client struct {
	edges []string
	token string
	http  *http.Client
}

// New returns a client for the edges' base URLs (http://host:port).
func New(edges []string, token string, hc *http.Client) (*Client, error) {
	if len(edges) == 0 {
		return nil, errors.New("operator: no edge URL (--edge http://host:port)")
	}
	if token == "" {
		return nil, fmt.Errorf("operator: no admin token (--admin-token or %s)", EnvAdminToken)
	}
	c := &Client{token: token, http: hc}
	if c.http == nil {
		c.http = &http.Client{Transport: &http.Transport{Proxy: nil, IdleConnTimeout: 30 * time.Second}}
	}
	for _, e := range edges {
		u, err := url.Parse(strings.TrimSpace(e))
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, fmt.Errorf("operator: edge URL %q is not an absolute http(s) URL like http://127.0.0.1:8000", e)
		}
		c.edges = append(c.edges, strings.TrimRight(u.String(), "/"))
	}
	return c, nil
}

// Edges are the client's edge URLs.
func (c *Client) Edges() []string { return append([]string(nil), c.edges...) }

// Close releases idle connections.
func (c *Client) Close() { c.http.CloseIdleConnections() }

// APIError is a non-2xx answer of the admin API (OpenAI error JSON).
type APIError struct {
	Edge    string
	Path    string
	Status  int
	Type    string
	Code    string
	Message string
}

func (e *APIError) Error() string {
	code := e.Code
	if code == "" {
		code = http.StatusText(e.Status)
	}
	return fmt.Sprintf("%s %s: HTTP %d %s: %s", e.Edge, e.Path, e.Status, code, e.Message)
}

// unreachable reports errors that mean "try another edge".
func unreachable(err error) bool {
	var ne net.Error
	var oe *net.OpError
	return errors.As(err, &oe) || errors.As(err, &ne) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF)
}

// do sends one admin request to base and decodes a JSON answer into out.
func (c *Client) do(ctx context.Context, base, method, path string, body io.Reader, out any) error {
	resp, err := c.send(ctx, base, method, path, body)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return fmt.Errorf("operator: %s %s: read answer: %w", base, path, err)
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(b, out); err != nil {
		return fmt.Errorf("operator: %s %s: decode answer: %w", base, path, err)
	}
	return nil
}

// send sends one admin request; a non-2xx answer is an *APIError.
func (c *Client) send(ctx context.Context, base, method, path string, body io.Reader) (*http.Response, error) {
	return c.sendType(ctx, base, method, path, body, "application/json")
}

// sendType is send with the body's content type.
func (c *Client) sendType(ctx context.Context, base, method, path string, body io.Reader, contentType string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, method, base+"/admin/v1/"+path, body)
	if err != nil {
		return nil, fmt.Errorf("operator: %s %s: %w", base, path, err)
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	if body != nil {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("operator: %s %s: %w", base, path, err)
	}
	if resp.StatusCode/100 == 2 {
		return resp, nil
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	ae := &APIError{Edge: base, Path: "/admin/v1/" + path, Status: resp.StatusCode}
	var env struct {
		Error struct {
			Message string `json:"message"`
			Type    string `json:"type"`
			Code    any    `json:"code"`
		} `json:"error"`
	}
	if json.Unmarshal(b, &env) == nil && env.Error.Message != "" {
		ae.Message, ae.Type = env.Error.Message, env.Error.Type
		if s, ok := env.Error.Code.(string); ok {
			ae.Code = s
		}
	} else {
		ae.Message = strings.TrimSpace(string(b))
	}
	return nil, ae
}

// first runs fn against each edge in turn until one is reachable.
func (c *Client) first(ctx context.Context, fn func(base string) error) error {
	var errs []error
	for _, base := range c.edges {
		err := fn(base)
		if err == nil || !unreachable(err) || ctx.Err() != nil {
			return err
		}
		errs = append(errs, err)
	}
	return fmt.Errorf("operator: no edge reachable: %w", errors.Join(errs...))
}

// Cluster is GET /admin/v1/cluster on the first reachable edge; edgeURL
// says which one answered.
func (c *Client) Cluster(ctx context.Context) (info admin.ClusterInfo, edgeURL string, err error) {
	err = c.first(ctx, func(base string) error {
		edgeURL = base
		return c.do(ctx, base, http.MethodGet, "cluster", nil, &info)
	})
	return info, edgeURL, err
}

// ClusterAt is GET /admin/v1/cluster on one edge.
func (c *Client) ClusterAt(ctx context.Context, base string) (admin.ClusterInfo, error) {
	var info admin.ClusterInfo
	err := c.do(ctx, strings.TrimRight(base, "/"), http.MethodGet, "cluster", nil, &info)
	return info, err
}

// StateHash asks the first edge for its state index and hash; with index
// > 0 the edge first waits until it applied index (it still reports its
// current state). It implements audit.LiveState.
func (c *Client) StateHash(ctx context.Context, index uint64) (audit.LiveHash, error) {
	path := "state/hash"
	if index > 0 {
		path += fmt.Sprintf("?index=%d", index)
	}
	var out struct {
		Index  uint64 `json:"index"`
		Hash   string `json:"hash"`
		NodeID string `json:"node_id"`
	}
	if err := c.do(ctx, c.edges[0], http.MethodGet, path, nil, &out); err != nil {
		return audit.LiveHash{}, err
	}
	return audit.LiveHash{NodeID: out.NodeID, Index: out.Index, Hash: out.Hash}, nil
}

// Binding asks the first edge for key's binding in fleet. It implements
// audit.LiveState.
func (c *Client) Binding(ctx context.Context, fleet fsm.Fleet, key string) (audit.LiveBinding, bool, error) {
	b, found, err := c.BindingInfo(ctx, fleet, key)
	return audit.LiveBinding{Instance: b.Instance, Epoch: b.Epoch, BoundAt: b.BoundAt}, found, err
}

// BindingInfo is GET /admin/v1/bindings/{fleet}/{key} on the first edge;
// found is false when the edge has no such binding.
func (c *Client) BindingInfo(ctx context.Context, fleet fsm.Fleet, key string) (admin.BindingInfo, bool, error) {
	var b admin.BindingInfo
	err := c.do(ctx, c.edges[0], http.MethodGet, "bindings/"+fleet.String()+"/"+url.PathEscape(key), nil, &b)
	var ae *APIError
	if errors.As(err, &ae) && ae.Status == http.StatusNotFound && ae.Code == "binding_not_found" {
		return b, false, nil
	}
	return b, err == nil, err
}

// PeerList is the Raft configuration as an edge reports it.
type PeerList struct {
	Edge   string               `json:"edge"` // the edge that answered
	Leader string               `json:"leader"`
	Term   uint64               `json:"term"`
	Peers  []cluster.PeerStatus `json:"peers"`
}

// ListPeers reports the Raft peers and the leader. Members' health is the
// leader's measurement, so it asks a listed edge that leads when there is
// one. A leader that has just taken over (a transfer, an election) has not
// heard from its peers yet: ListPeers waits up to listPeersSettle for its
// first measurement of each, and reports a member still unheard without
// health (unknown) rather than as unhealthy with no suffrage.
func (c *Client) ListPeers(ctx context.Context) (PeerList, error) {
	info, base, err := c.Cluster(ctx)
	if err != nil {
		return PeerList{}, err
	}
	if !info.IsLeader {
		for _, b := range c.edges {
			if b == base {
				continue
			}
			if li, err := c.ClusterAt(ctx, b); err == nil && li.IsLeader {
				info, base = li, b
				break
			}
		}
	}
	deadline := time.Now().Add(listPeersSettle)
	for info.IsLeader && slices.ContainsFunc(info.Peers, unheard) && time.Now().Before(deadline) {
		select {
		case <-ctx.Done():
			return PeerList{}, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
		li, err := c.ClusterAt(ctx, base)
		if err != nil {
			break
		}
		info = li
	}
	for i := range info.Peers {
		if unheard(info.Peers[i]) {
			info.Peers[i].Health = nil
		}
	}
	return PeerList{Edge: base, Leader: info.Leader, Term: info.Term, Peers: info.Peers}, nil
}

// listPeersSettle bounds ListPeers' wait for a new leader's first health
// round (autopilot measures every member each interval, 1s by default).
const listPeersSettle = 3 * time.Second

// unheard: the leader lists the member without a full measurement yet: no
// health, or none of the member's own status (its suffrage) while it is not
// judged failed. A new leader's first health round has the members' stats
// but not yet their status.
func unheard(p cluster.PeerStatus) bool {
	h := p.Health
	return h == nil || h.Suffrage == "" && h.Status == "alive"
}

// MembershipResult is what a membership change left behind.
type MembershipResult struct {
	Op     string               `json:"op"`
	Edge   string               `json:"edge"` // the edge that took the request
	Leader string               `json:"leader"`
	Peers  []cluster.PeerStatus `json:"peers"`
}

type raftOpAnswer struct {
	OK     bool                 `json:"ok"`
	Op     string               `json:"op"`
	Leader string               `json:"leader"`
	Peers  []cluster.PeerStatus `json:"peers"`
}

func (c *Client) raftOp(ctx context.Context, op string, req map[string]string, order []string) (MembershipResult, error) {
	body, _ := json.Marshal(req)
	var ans raftOpAnswer
	var used string
	var errs []error
	for _, base := range order {
		used = base
		err := c.do(ctx, base, http.MethodPost, "raft/"+op, bytes.NewReader(body), &ans)
		if err == nil {
			return MembershipResult{Op: op, Edge: used, Leader: ans.Leader, Peers: ans.Peers}, nil
		}
		if !unreachable(err) || ctx.Err() != nil {
			return MembershipResult{}, err
		}
		errs = append(errs, err)
	}
	return MembershipResult{}, fmt.Errorf("operator: %s: no edge reachable: %w", op, errors.Join(errs...))
}

// edgesAvoiding orders the edges so that the node with id comes last: a
// node being removed may never learn that its removal committed, so it is
// the worst one to ask (and to check with).
func (c *Client) edgesAvoiding(ctx context.Context, id string) []string {
	var front, back []string
	for _, base := range c.edges {
		info, err := c.ClusterAt(ctx, base)
		if err == nil && info.NodeID == id {
			back = append(back, base)
			continue
		}
		front = append(front, base)
	}
	return append(front, back...)
}

// confirm checks that a membership change the cluster reported committed
// shows in the configuration: at once on a listed edge that is the leader
// (the change committed there before the call returned), else by polling
// the edge that took the request until it has learned the commit.
func (c *Client) confirm(ctx context.Context, res *MembershipResult, skipID string, ok func([]cluster.PeerStatus) bool) error {
	for _, base := range c.edges {
		info, err := c.ClusterAt(ctx, base)
		if err != nil || info.NodeID == skipID || !info.IsLeader {
			continue
		}
		res.Leader, res.Peers = info.Leader, info.Peers
		if !ok(info.Peers) {
			return fmt.Errorf("operator: %s returned, but the leader %s's configuration is %+v", res.Op, info.NodeID, info.Peers)
		}
		return nil
	}
	for {
		info, err := c.ClusterAt(ctx, res.Edge)
		if err == nil && ok(info.Peers) {
			res.Leader, res.Peers = info.Leader, info.Peers
			return nil
		}
		t := time.NewTimer(20 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("operator: %s committed, but %s has not shown it in its configuration (%+v): %w", res.Op, res.Edge, info.Peers, ctx.Err())
		case <-t.C:
		}
	}
}

func findPeer(peers []cluster.PeerStatus, id string) (cluster.PeerStatus, bool) {
	for _, p := range peers {
		if p.ID == id {
			return p, true
		}
	}
	return cluster.PeerStatus{}, false
}

// RemovePeer removes a voter. The edge returns once the configuration
// change committed (the cluster waits for it); the leader's configuration
// is then checked not to list the peer.
func (c *Client) RemovePeer(ctx context.Context, id string) (MembershipResult, error) {
	if id == "" {
		return MembershipResult{}, errors.New("operator: remove-peer: a peer id is required")
	}
	res, err := c.raftOp(ctx, "remove-peer", map[string]string{"id": id}, c.edgesAvoiding(ctx, id))
	if err != nil {
		return res, err
	}
	err = c.confirm(ctx, &res, id, func(ps []cluster.PeerStatus) bool { _, still := findPeer(ps, id); return !still })
	return res, err
}

// AddVoter adds (or re-addresses) a voter at its Raft address; the
// committed configuration is checked to list it as a voter there.
func (c *Client) AddVoter(ctx context.Context, id, addr string) (MembershipResult, error) {
	if id == "" || addr == "" {
		return MembershipResult{}, errors.New("operator: add-voter: a peer id and its Raft address (host:port) are required")
	}
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return MembershipResult{}, fmt.Errorf("operator: add-voter: address %q is not host:port: %v", addr, err)
	}
	res, err := c.raftOp(ctx, "add-voter", map[string]string{"id": id, "addr": addr}, c.edgesAvoiding(ctx, id))
	if err != nil {
		return res, err
	}
	err = c.confirm(ctx, &res, id, func(ps []cluster.PeerStatus) bool {
		p, ok := findPeer(ps, id)
		return ok && p.Voter && p.Addr == addr
	})
	return res, err
}

// TransferLeader hands leadership to id ("" = a voter Raft picks) and
// waits until an edge reports the new leader.
func (c *Client) TransferLeader(ctx context.Context, id string) (MembershipResult, error) {
	before, _, err := c.Cluster(ctx)
	if err != nil {
		return MembershipResult{}, err
	}
	req := map[string]string{}
	if id != "" {
		req["id"] = id
	}
	res, err := c.raftOp(ctx, "transfer-leader", req, c.edges)
	if err != nil {
		return res, err
	}
	// The old leader answers as soon as it stepped down; it learns who won
	// from the new leader's first heartbeat.
	for {
		info, base, err := c.Cluster(ctx)
		if err == nil && info.Leader != "" && (id == "" && info.Leader != before.Leader || id != "" && info.Leader == id) {
			res.Leader, res.Peers, res.Edge = info.Leader, info.Peers, base
			return res, nil
		}
		t := time.NewTimer(50 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return res, fmt.Errorf("operator: transfer-leader: leadership moved off %s but no edge reports the new leader: %w", before.Leader, ctx.Err())
		case <-t.C:
		}
	}
}
