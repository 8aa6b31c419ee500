package audit

import (
	"bytes"
	"context"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/tether-project/tether/cluster/archive"
	"github.com/tether-project/tether/fsm"
)

func answerAt(min int, inst string, src fsm.KVSource, predicted, cached uint32) fsm.CacheAnswer {
	at := time.Date(2025, 3, 1, 12, min, 0, 0, time.UTC)
	return fsm.CacheAnswer{Fleet: fsm.FleetContext, Instance: inst, ConversationID: "c", Source: src, AtUnixMilli: at.UnixMilli(),
		BlockSize: 16, PromptTokens: 320, PredictedTokens: predicted, CachedTokens: cached, Prefix: []uint32{1}}
}

// The report grades each instance and each source from the logged
// answers, in a window of their own times.
func TestAccuracyFromTheLog(t *testing.T) {
	lb := newLogBuilder(t)
	lb.entry(fsm.Settings{MaxBindings: 100})
	lb.entry(fsm.CacheAnswers{Edge: "edge-1", Answers: []fsm.CacheAnswer{
		answerAt(0, "w1", fsm.KVSourceTetherWorker, 160, 160), // within, confirmed
		answerAt(1, "w1", fsm.KVSourceTetherWorker, 160, 0),   // 10 blocks off, refuted
		answerAt(2, "w2", fsm.KVSourceShadow, 0, 64),          // 4 blocks missed
	}})
	lb.entry(fsm.Link{Child: "kid", Parent: "c", Root: "c", Depth: 1})
	lb.entry(fsm.CacheAnswers{Edge: "edge-2", Answers: []fsm.CacheAnswer{
		answerAt(3, "w1", fsm.KVSourceTetherWorker, 32, 16), // within, confirmed
		answerAt(30, "w1", fsm.KVSourceTetherWorker, 320, 0),
	}})
	lb.writeArchive(archive.Options{}, 0)
	d := lb.open()

	log, err := d.Answers(context.Background(), AnswersOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(log.Answers) != 5 || log.Links["kid"] != "c" || log.Answers[3].Edge != "edge-2" {
		t.Fatalf("answers %d, links %v", len(log.Answers), log.Links)
	}
	rep, err := d.Accuracy(context.Background(), AnswersOptions{Until: time.Date(2025, 3, 1, 12, 10, 0, 0, time.UTC)})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Answers != 4 || len(rep.Edges) != 2 {
		t.Fatalf("window: %d answers, edges %v", rep.Answers, rep.Edges)
	}
	rows := map[string]AccuracyRow{}
	for _, r := range rep.Rows {
		rows[r.Instance+"/"+r.Source] = r
	}
	w1 := rows["w1/tether_worker"]
	if w1.Answers != 3 || w1.Claims != 3 || w1.ConfirmedClaims != 2 || math.Abs(w1.WithinOneBlock-2.0/3) > 1e-9 ||
		math.Abs(w1.MeanAbsErrorBlocks-(0+10+1)/3.0) > 1e-9 || w1.Missed != 0 {
		t.Fatalf("w1: %+v", w1)
	}
	if w1.HitRate != 176.0/960 || w1.PredictedHitRate != 352.0/960 {
		t.Fatalf("w1 hit rates: %+v", w1)
	}
	w2 := rows["w2/shadow"]
	if w2.Answers != 1 || w2.Claims != 0 || w2.Missed != 1 || w2.MeanAbsErrorBlocks != 4 {
		t.Fatalf("w2: %+v", w2)
	}
	if tot := rows["*/tether_worker"]; tot.Answers != 3 {
		t.Fatalf("source total: %+v", tot)
	}
	var buf bytes.Buffer
	if err := rep.WriteText(&buf); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"4 answers from 2025-03-01T12:00:00Z to 2025-03-01T12:03:00Z, recorded by edge-1, edge-2", "w1", "tether_worker", "2/3 (66.7%)", "shadow"} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, buf.String())
		}
	}
	empty, err := d.Accuracy(context.Background(), AnswersOptions{Since: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)})
	if err != nil || empty.Answers != 0 {
		t.Fatalf("empty window: %+v %v", empty, err)
	}
	buf.Reset()
	if err := empty.WriteText(&buf); err != nil || !strings.Contains(buf.String(), "no engine answers") {
		t.Fatalf("empty report: %q %v", buf.String(), err)
	}
}
