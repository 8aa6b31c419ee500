package operator

import (
	"context"
	"errors"
	"net/http"
	"net/url"

	"github.com/tether-project/tether/edge/admin"
)

// InstanceList is the worker instances as an edge sees them: its fleet
// view merged with the log's records (drain marks included).
type InstanceList struct {
	Edge      string               `json:"edge"` // the edge that answered
	Instances []admin.InstanceInfo `json:"instances"`
}

// Instances is GET /admin/v1/instances on the first reachable edge.
func (c *Client) Instances(ctx context.Context) (InstanceList, error) {
	var out InstanceList
	err := c.first(ctx, func(base string) error {
		out.Edge = base
		var ans struct {
			Instances []admin.InstanceInfo `json:"instances"`
		}
		if err := c.do(ctx, base, http.MethodGet, "instances", nil, &ans); err != nil {
			return err
		}
		out.Instances = ans.Instances
		return nil
	})
	if out.Instances == nil {
		out.Instances = []admin.InstanceInfo{}
	}
	return out, err
}

// DrainResult is what a drain or undrain left behind.
type DrainResult struct {
	Edge string `json:"edge"` // the edge that took the request
	admin.DrainResult
}

// DrainInstance drains instance id (drain true: no new conversations, its
// bound ones move on their next turns) or ends its drain, through the first
// reachable edge (any edge: a follower forwards the proposal to the
// leader). It returns once the change committed. Drain and undrain are
// idempotent, so a call retried on another edge after a lost answer is
// safe.
func (c *Client) DrainInstance(ctx context.Context, id string, drain bool) (DrainResult, error) {
	if id == "" {
		return DrainResult{}, errors.New("operator: instance drain: an instance id is required")
	}
	op := "undrain"
	if drain {
		op = "drain"
	}
	var out DrainResult
	err := c.first(ctx, func(base string) error {
		out.Edge = base
		return c.do(ctx, base, http.MethodPost, "instances/"+url.PathEscape(id)+"/"+op, nil, &out.DrainResult)
	})
	return out, err
}
