package edge

import (
	"github.com/nats-io/nats.go"
	"github.com/tether-project/tether/cluster"
	"github.com/tether-project/tether/edge/engineevents"
	"github.com/tether-project/tether/edge/fleetview"
)

// metricsFormat is the /metrics format the edge scrapes of engine k ("" none).
func metricsFormat(k EngineKind) string {
	switch k {
	case EngineVLLM:
		return fleetview.MetricsVLLM
	case EngineSGLang:
		return fleetview.MetricsSGLang
	}
	return ""
}

// startEngineEvents subscribes to the engines' own KV events and runs the
// leader's drains of trtllm-serve's (edge/engineevents) until the edge
// stops.
func (e *Edge) startEngineEvents() error {
	models := make([]*Config, len(e.catalogue.Models()))
	for i, m := range e.catalogue.Models() {
		models[i] = m.Cfg
	}
	e.engineEvents = engineevents.New(engineEventsEdge{e}, engineevents.Config{Models: models,
		LeaderInterval: e.cfg.Leader.Interval, Metrics: e.metrics, Logger: e.log})
	if err := e.engineEvents.Start(); err != nil {
		return err
	}
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		e.engineEvents.RunDrains(e.ctx)
	}()
	return nil
}

// engineEventsEdge is the edge as its engine events reader uses it
// (engineevents.Edge).
type engineEventsEdge struct{ e *Edge }

func (x engineEventsEdge) Node() *cluster.Node { return x.e.node }

func (x engineEventsEdge) Fleet() *fleetview.View { return x.e.fleet }

func (x engineEventsEdge) NATS() *nats.Conn { return x.e.nats.conn }

// dispatchEdge is the edge as its dispatcher uses it (dispatch.Edge).
type dispatchEdge struct{ e *Edge }

func (d dispatchEdge) Fleet() *fleetview.View { return d.e.fleet }
func (d dispatchEdge) NATS() *nats.Conn       { return d.e.nats.conn }
