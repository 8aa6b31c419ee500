package devstack

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"

	"github.com/tether-project/tether/edge/admin"
	"github.com/tether-project/tether/fsm"
)

// AdminError is a non-2xx answer of the admin API.
type AdminError struct {
	Edge   string
	Path   string
	Status int
	Body   string
}

func (e *AdminError) Error() string {
	return fmt.Sprintf("devstack: admin %s on %s: HTTP %d: %s", e.Path, e.Edge, e.Status, e.Body)
}

// AdminGet calls GET /admin/v1/<path> on the edge with the stack's token
// and decodes the JSON answer into out (nil: discard). A non-2xx answer is
// an *AdminError.
func (n *EdgeNode) AdminGet(ctx context.Context, path string, out any) error {
	u := n.URL() + "/admin/v1/" + path
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return fmt.Errorf("devstack: admin %s: %w", path, err)
	}
	req.Header.Set("Authorization", "Bearer "+n.stack.adminToken)
	resp, err := n.stack.client.Do(req)
	if err != nil {
		return fmt.Errorf("devstack: admin %s on %s: %w", path, n.ID, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return fmt.Errorf("devstack: admin %s on %s: read: %w", path, n.ID, err)
	}
	if resp.StatusCode/100 != 2 {
		return &AdminError{Edge: n.ID, Path: path, Status: resp.StatusCode, Body: string(body)}
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(body, out); err != nil {
		return fmt.Errorf("devstack: admin %s on %s: decode: %w", path, n.ID, err)
	}
	return nil
}

// Binding returns the edge's view of key's binding in fleet (GET
// /admin/v1/bindings/{fleet}/{key}); found is false on 404.
func (n *EdgeNode) Binding(ctx context.Context, fleet fsm.Fleet, key string) (b admin.BindingInfo, found bool, err error) {
	err = n.AdminGet(ctx, "bindings/"+fleet.String()+"/"+url.PathEscape(key), &b)
	if ae, ok := err.(*AdminError); ok && ae.Status == http.StatusNotFound {
		return admin.BindingInfo{}, false, nil
	}
	if err != nil {
		return admin.BindingInfo{}, false, err
	}
	return b, true, nil
}

// Cluster returns GET /admin/v1/cluster from the edge.
func (n *EdgeNode) Cluster(ctx context.Context) (admin.ClusterInfo, error) {
	var ci admin.ClusterInfo
	err := n.AdminGet(ctx, "cluster", &ci)
	return ci, err
}
